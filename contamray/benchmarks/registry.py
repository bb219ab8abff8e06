"""The benchmark registry: short names -> adapters, in the order a CLI lists them.

Open LLM Leaderboard v1 first (arc_challenge … gsm8k), then the seven datasets of Golchin & Surdeanu's
"Time Travel in LLMs" (imdb … xsum), the Chinese C-Eval (``ceval``), then the generated
``synthetic_facts`` (contamray's ground truth) and ``synthetic_structured`` (the same facts in a
non-exchangeable order, for order-based tests' nulls).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from contamray.benchmarks import (
    classification,
    multiple_choice,
    qa,
    summarization,
    synthetic,
    synthetic_structured,
    winogrande,
)
from contamray.benchmarks.base import Adapter

_ORDER = (
    "arc_challenge", "hellaswag", "mmlu", "truthfulqa_gen", "truthfulqa_mc", "winogrande", "gsm8k",
    "imdb", "ag_news", "yelp", "rte", "wnli", "samsum", "xsum", "ceval", "synthetic_facts",
    "synthetic_structured",
)  # fmt: skip


def _rank(name: str) -> int:
    return _ORDER.index(name) if name in _ORDER else len(_ORDER)


_ALL = (
    *multiple_choice.ADAPTERS,
    *qa.ADAPTERS,
    *winogrande.ADAPTERS,
    *classification.ADAPTERS,
    *summarization.ADAPTERS,
    *synthetic.ADAPTERS,
    *synthetic_structured.ADAPTERS,
)
ADAPTERS: dict[str, Adapter] = {a.name: a for a in sorted(_ALL, key=lambda a: _rank(a.name))}
if not len(ADAPTERS) == len(_ALL) == len(_ORDER):
    raise RuntimeError("benchmark adapter names must be unique and each listed once in registry._ORDER")


def adapter_names() -> list[str]:
    return list(ADAPTERS)


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(ADAPTERS)}") from None


def describe_all() -> list[str]:
    """One ``describe()`` line per adapter, for ``contamray benchmarks``-style listings."""
    return [a.describe() for a in ADAPTERS.values()]


def partition_ids(benchmarks: Mapping[str, Any]) -> dict[str, str]:
    """The partition id of each benchmark key (``benchmarks``: key -> its spec, a mapping or an object with
    ``adapter``, ``config`` and ``split``): its split's (``<benchmark>/<config>/<split>``, as the loader names
    it), with ``:<key>`` appended when another key reads the same split (other rows of it - a held-out block
    after ``offset`` - or a second sample). Results, reports and truth are filed by partition, and two keys'
    verdicts must never be filed under one. Decided from every key of a config, so a key's id does not depend
    on which keys a step loads."""

    def field(spec: Any, name: str) -> Any:
        return spec.get(name) if isinstance(spec, Mapping) else getattr(spec, name, None)

    base: dict[str, str] = {}
    for key, spec in benchmarks.items():
        adapter = get_adapter(field(spec, "adapter"))
        config, split = adapter.resolve_config(field(spec, "config")), adapter.resolve_split(field(spec, "split"))
        base[key] = adapter.partition(config, split)
    counts = Counter(base.values())
    return {key: f"{pid}:{key}" if counts[pid] > 1 else pid for key, pid in base.items()}
