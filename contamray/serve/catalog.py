"""What the API serves, described for ``GET /v1/methods`` and ``GET /v1/benchmarks``.

A method entry is its ``conf/method`` preset (the name a request uses) with the registered method behind
it: family, engine roles, every parameter with its default (the dataclass default, overridden by the
preset's value), the declared per-example score and membership columns, where it applies, and its
citation - the part of its module's docstring about it (a bullet naming it, else the first paragraph;
methods cite their papers there). ``contamray methods`` prints the same entries. A benchmark entry is its
``conf/benchmark`` name with the adapter's hub id, configs, splits and task.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from contamray.presets import method_params, preset


def method_entry(label: str) -> dict[str, Any]:
    from contamray.methods.base import get_method

    values = preset("method", label)
    name = str(values.get("method", label))
    method = get_method(name)
    params = {}
    chosen = method_params(values, method.Config)
    for f in dataclasses.fields(method.Config):
        if f.name in chosen:
            params[f.name] = chosen[f.name]
        elif f.default is not dataclasses.MISSING:
            params[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            params[f.name] = f.default_factory()
        else:
            params[f.name] = None
    cfg = method.make_config(chosen, where=f"conf/method/{label}.yaml")
    applies = method.applies
    return {
        "name": label,
        "method": name,
        "family": method.family,
        "engine_roles": list(method.engine_roles_for(cfg)),
        "parameters": _plain(params),
        "score": method.outputs.score,
        "score_label": method.outputs.score_label,
        "membership": method.outputs.membership,
        "applies": {"tasks": list(applies.tasks), "needs_choices": applies.needs_choices,
                    "min_rows": applies.min_rows},
        "partition_test": True,
        "uses_reference": method.uses_reference,
        "citation": citation(method),
    }


def benchmark_entry(label: str) -> dict[str, Any]:
    from contamray.benchmarks import get_adapter

    adapter = get_adapter(str(preset("benchmark", label)["adapter"]))
    return {
        "name": label,
        "adapter": adapter.name,
        "hub_id": adapter.hub_id,
        "task": adapter.task,
        "configs": list(adapter.all_configs),
        "splits": list(adapter.splits),
        "default_split": adapter.default_split,
        "description": adapter.describe(),
    }


def citation(method: Any) -> str:
    """The method's paragraph of its module docstring: the bullet that names it, else the first paragraph."""
    doc = (sys.modules[type(method).__module__].__doc__ or "").strip()
    paragraphs = _bullets_and_paragraphs(doc)
    tag = f"``{method.name}``"
    for block in paragraphs:
        if block.startswith(f"- {tag}"):
            return block[2:]
    return paragraphs[0] if paragraphs else ""


def _bullets_and_paragraphs(doc: str) -> list[str]:
    blocks: list[list[str]] = []
    for line in doc.splitlines():
        text = line.strip()
        if not text:
            blocks.append([])
        elif text.startswith("- ") or not blocks:
            blocks.append([text])
        else:
            blocks[-1].append(text)
    return [" ".join(b) for b in blocks if b]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
