"""Null calibration: how often each closed-data partition test flags slices of a benchmark under a model.

``contamray calibrate`` runs every closed-data partition test (the sharded likelihood test, the
membership scores, the held-out accuracy gap, guided prompting's Algorithm 1) on ``--slices`` contiguous
slices of ``--size`` rows, spread evenly over each benchmark's split, under one model - by default the embedded
base model, on ARC-Challenge, HellaSwag, MMLU and Winogrande - and prints, per method and benchmark, how many slices
were flagged, found clean, or left inconclusive. The held-out tests compare each slice with its own held-out block
of the same split (disjoint seeded random samples of the rows outside the slices; of the slice's topic
when all its rows share one, as an MMLU slice of one subject: ``heldouts``), as their ``heldout`` mode does.

On partitions clean by construction (``tests/test_null_calibration.py``) a valid test at alpha flags
about alpha of the slices. On public benchmarks under a public model the truth is unknown: a flag
rate above alpha there is either pretraining exposure or structure the test cannot remove (a split
sorted by subject, topical runs) - the numbers are reported (README, between
``<!-- calibration:start -->`` and ``<!-- calibration:end -->``), not asserted.

The engine answers are shared between methods that send the same text (``SharedEngines``), so Min-K%++,
Min-K%, perplexity and zlib pay for one scoring pass per example.

Each method is calibrated as a run configures it by default - its preset, ``conf/method/<name>.yaml`` (the membership
scores and the held-out accuracy gap in both prompt forms, ``chat: both``) - with cheaper settings where many slices
need them (``PARAMS``: fewer shards and permutations, fewer generated tokens) and a held-out of the same split.
``--set KEY=VALUE`` (repeatable) calibrates another configuration: each method whose config has the field ``KEY``
runs with ``VALUE`` (YAML, e.g. ``--set chat=false`` for the papers' raw form alone), and its rows are labelled with
it (``min_k (chat=false)``); a key no chosen method has is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contamray import logs
from contamray.engines.dedup import Dedup, content_key
from contamray.methods.base import Method, Output, Request, Verdict, get_method
from contamray.pipeline.progress import Progress
from contamray.presets import method_params, preset
from contamray.records import Record
from contamray.stats.clusters import topic_key
from contamray.validate.readme_section import replace_section

log = logging.getLogger(__name__)

START, END = "<!-- calibration:start -->", "<!-- calibration:end -->"
# Min-K%++ first: its scores (with vocabulary statistics) serve Min-K%, perplexity and zlib (SharedEngines)
MEMBERSHIP = ("min_k_plus_plus", "min_k", "perplexity", "zlib_ratio", "lowercase_ratio", "reference_ratio")
# the reference-model ratio needs a second model (the target over a reference): not part of a one-model run
ONE_MODEL_MEMBERSHIP = tuple(m for m in MEMBERSHIP if m != "reference_ratio")
METHODS = ("sharded_likelihood", *ONE_MODEL_MEMBERSHIP, "heldout_accuracy", "guided_prompting")
BENCHMARKS = ("arc_challenge", "hellaswag", "mmlu", "winogrande")
# cheap settings for many slices: 5 shards x 10 permutations (20 rows: shards of 4), 16 generated tokens
PARAMS: dict[str, dict[str, Any]] = {
    "sharded_likelihood": {"num_shards": 5, "permutations_per_shard": 10},
    "guided_prompting": {"max_tokens": 16},
    **{name: {"reference": "heldout"} for name in (*MEMBERSHIP, "heldout_accuracy")},
}


class SharedEngines:
    """Answers requests on engines by role; each distinct (engine, text, options) is computed once.

    A score answered with the vocabulary statistics (Min-K%++) also serves the same text's plain score
    requests, so run Min-K%++ first and Min-K%, perplexity and zlib pay nothing more.
    """

    def __init__(self, engines: dict[str, Any]) -> None:
        self.engines = engines
        self.cache: dict[tuple, Output] = {}

    def _cached(self, r: Request) -> Output | None:
        found = self.cache.get((r.engine, content_key(r)))
        if found is not None and r.vocab_stats and not found.token_mean and not found.error:
            return None  # answered before without the vocabulary statistics this request needs
        return found

    def answer(self, requests: Sequence[Request]) -> dict[str, Output]:
        from contamray.pipeline.actors import answer_requests

        todo = [r for r in requests if self._cached(r) is None]
        for role in dict.fromkeys(r.engine for r in todo):
            work = Dedup([(role, r) for r in todo if r.engine == role])
            outs = answer_requests(self.engines[role], [r for _, r in work.unique])
            self.cache.update({(role, content_key(r)): out for (_, r), out in zip(work.unique, outs, strict=True)})
        return {r.key: dataclasses.replace(self._cached(r), key=r.key) for r in requests}  # type: ignore[arg-type]

    def run(self, method: Method, records: list[Record], cfg: Any) -> list[dict[str, Any]]:
        """One cell as the runner does it: the method's request stages, then ``score``."""
        outputs: dict[str, Output] = {}
        for stage in range(16):
            reqs = method.requests(records, cfg, stage, outputs)
            if not reqs:
                break
            outputs.update(self.answer(reqs))
        return method.score(records, outputs, cfg)


def slice_starts(n_rows: int, n_slices: int, size: int, spread: bool) -> list[int]:
    """First rows of the slices: back to back from the top, or spread evenly over the split."""
    if not spread or n_slices * size >= n_rows:
        return [k * size for k in range(n_slices) if (k + 1) * size <= n_rows]
    step = n_rows // n_slices
    return [k * step for k in range(n_slices)]


def slices(records: Sequence[Record], n_slices: int, size: int, spread: bool = False) -> list[list[Record]]:
    """``n_slices`` contiguous slices of ``size`` rows (``spread``: evenly over the split, else from the
    top), each its own partition name."""
    out = []
    for start in slice_starts(len(records), n_slices, size, spread):
        name = f":rows{start}-{start + size - 1}"
        out.append([dataclasses.replace(r, partition=r.partition + name) for r in records[start : start + size]])
    return out


def heldouts(records: Sequence[Record], parts: Sequence[Sequence[Record]], seed: int) -> list[list[Record]]:
    """One held-out block per slice, as many rows as the slice: disjoint seeded random samples of the rows
    not in any slice, so the slices' tests are independent. A slice whose rows all share one declared topic
    (``stats.clusters.topic_key``: an MMLU slice lies within one subject) takes its block from rows of that
    topic when the split has enough of them, as README advises a user: one subject against a held-out of many
    is one unit against many and cannot be decided, while a topic both sides share is a constant of the
    comparison. Stops at the first slice the rows left cannot serve."""
    taken = {r.id for part in parts for r in part}
    rest = [r for r in records if r.id not in taken]
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(rest))]
    topics = [topic_key(r.meta) for r in rest]
    used: set[int] = set()
    out = []
    for k, part in enumerate(parts):
        free = [i for i in order if i not in used]
        own = {topic_key(r.meta) for r in part}
        topic = own.pop() if len(own) == 1 else ""
        same = [i for i in free if topics[i] == topic] if topic else []
        block = sorted((same if len(same) >= len(part) else free)[: len(part)])
        if len(block) < len(part):
            break
        used.update(block)
        out.append([dataclasses.replace(rest[i], partition=f"{rest[i].partition}:heldout{k}") for i in block])
    return out


def decide(method: Method, cfg: Any, own: list[dict], reference: list[dict] | None = None) -> Verdict:
    """The settled verdict of one slice (``reference``: rows of the held-out block, if the method uses one)."""
    rows = [dict(r, is_reference=False) for r in own] + [dict(r, is_reference=True) for r in reference or []]
    return method.settle(method.reduce(pd.DataFrame(rows), cfg), cfg)


def calibrate(
    benchmarks: dict[str, list[Record]],
    engines: SharedEngines,
    methods: Sequence[str] = METHODS,
    n_slices: int = 10,
    size: int = 20,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per (benchmark, method, slice): decision, p-value, statistic, reason, and the ``settings`` of
    ``overrides`` the method took (each applies to the methods whose config has the field; see the module
    docstring)."""
    overrides = dict(overrides or {})
    check_overrides(methods, overrides)
    check_heldouts(benchmarks, methods, n_slices, size, seed, overrides)
    rows = []
    total = sum(len(slice_starts(len(r), n_slices, size, spread=True)) for r in benchmarks.values()) * len(methods)
    progress = Progress("calibrate", total, unit="slices")
    for bench, records in benchmarks.items():
        parts = slices(records, n_slices, size, spread=True)
        held = heldouts(records, parts, seed)
        for name in methods:
            method = get_method(name)
            cfg, own = _config(method, name, overrides, seed)
            settings = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in own.items())
            started = time.perf_counter()
            uses_reference = bool(method.reference_benchmark(cfg, bench))
            for k, part in enumerate(parts):
                reference = engines.run(method, held[k], cfg) if uses_reference else None
                v = decide(method, cfg, engines.run(method, part, cfg), reference)
                progress.update(1)
                rows.append({
                    "benchmark": bench, "method": name, "settings": settings, "slice": k, "decision": v.decision,
                    "p_value": v.p_value, "statistic": v.statistic, "reason": v.reason,
                })  # fmt: skip
            log.info("calibrate: %s on %s: %d slices in %.0f s", name, bench, len(parts), time.perf_counter() - started)
    progress.close()
    return pd.DataFrame(rows)


def check_heldouts(
    benchmarks: dict[str, list[Record]],
    methods: Sequence[str],
    n_slices: int,
    size: int,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> None:
    """Raise ValueError, before any model loads, when a chosen method compares each slice with a held-out block
    and a benchmark's split has too few rows outside the slices to give every slice its own: naming the benchmark,
    its rows, the methods and the largest ``--slices`` that fits (a slice and its block take ``2 x size`` rows).
    Untested slices would otherwise leave the table short of what was asked, and the flag rate over fewer."""
    chosen = {name: get_method(name) for name in methods}
    configs = {name: _config(method, name, overrides or {}, seed)[0] for name, method in chosen.items()}
    for bench, records in benchmarks.items():
        users = [name for name, method in chosen.items() if method.reference_benchmark(configs[name], bench)]
        if not users:
            continue
        parts = slices(records, n_slices, size, spread=True)
        held = heldouts(records, parts, seed)
        if len(held) < len(parts):
            fits = len(records) // (2 * size)
            raise ValueError(
                f"{bench}: its split has {len(records)} rows; {len(parts)} slices of {size} rows leave rows for "
                f"{len(held)} held-out blocks, and each slice needs a block of its own for {', '.join(users)}; "
                f"use --slices {fits} or fewer (or a smaller --size), or leave those methods out (--methods)"
            )


def _fields(method: Method) -> set[str]:
    return {f.name for f in dataclasses.fields(method.Config)}


def _config(method: Method, name: str, overrides: dict[str, Any], seed: int) -> tuple[Any, dict[str, Any]]:
    """The method's calibration config - a run's (its preset, ``conf/method/<name>.yaml``), then its cheap
    ``PARAMS``, the seed and the overrides it has a field for - and those overrides."""
    fields = _fields(method)
    own = {k: v for k, v in overrides.items() if k in fields}
    seeded = {"seed": seed} if "seed" in fields else {}
    run = method_params(preset("method", name), method.Config)
    return method.make_config({**run, **PARAMS.get(name, {}), **seeded, **own}), own


def check_overrides(methods: Sequence[str], overrides: dict[str, Any]) -> None:
    """Raise ValueError when a key of ``overrides`` is a config field of none of ``methods``, or a value is one a
    method's config refuses (its own message) - before any model loads."""
    missing = sorted(set(overrides) - {f for name in methods for f in _fields(get_method(name))})
    if missing:
        raise ValueError(f"--set {', '.join(missing)}: no chosen method ({', '.join(methods)}) has such a config "
                         "field; see conf/method/<name>.yaml for each method's keys")  # fmt: skip
    for name in methods:
        _config(get_method(name), name, overrides, 0)


def render(table: pd.DataFrame, alpha: float = 0.05, note: str = "") -> str:
    """Per method (rows) and benchmark (columns): flagged / decided, and inconclusive slices."""
    benches = list(dict.fromkeys(table["benchmark"]))
    lines = [
        "| method | " + " | ".join(f"`{b}`" for b in benches) + " |",
        "|---|" + "---|" * len(benches),
    ]
    settings = table["settings"] if "settings" in table else pd.Series([""] * len(table), index=table.index)
    for method, setting in dict.fromkeys(zip(table["method"], settings, strict=True)):
        cells = []
        for bench in benches:
            chosen = (table["method"] == method) & (settings == setting) & (table["benchmark"] == bench)
            count = Counter(table[chosen]["decision"])
            decided = count["contaminated"] + count["clean"]
            cell = f"{count['contaminated']} / {decided}"
            if count["inconclusive"]:
                cell += f" (+{count['inconclusive']} inconclusive)"
            cells.append(cell)
        lines.append(f"| `{method}`{f' ({setting})' if setting else ''} | " + " | ".join(cells) + " |")
    lines += ["", f"Cells: slices flagged at alpha = {alpha:g} / slices decided; inconclusive slices apart."]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def update_readme(readme: Path, markdown: str) -> None:
    """Replace the text between the calibration markers in ``readme`` (both must be there)."""
    replace_section(readme, START, END, markdown, "calibration")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contamray calibrate",
        description="Flag rate of every closed-data partition test on contiguous slices of benchmarks under one "
        "model (default: the embedded base model on ARC, HellaSwag, MMLU, Winogrande); written into the README "
        f"between {START} and {END}.",
    )
    p.add_argument("--model", default="smollm2-135m", help="model source (hub id, local dir or smollm2-135m)")
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                   help="comma-separated benchmark adapters, each with an optional :config (synthetic_facts:set4)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated closed-data methods")
    p.add_argument("--slices", type=int, default=10, help="slices per benchmark (default 10)")
    p.add_argument("--size", type=int, default=20, help="rows per slice (default 20)")
    p.add_argument("--mirror-dir", default=None, help="benchmark mirror (default: CONTAMRAY_MIRROR_DIR or the hub)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("calibration.csv"), help="per-slice table (CSV)")
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a method config value (YAML), for each method that has the key, e.g. chat=false")  # fmt: skip
    return p


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["chat=both", "units=rows"]`` -> ``{"chat": "both", "units": "rows"}`` (values read as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set chat=both")
        out[key.strip()] = yaml.safe_load(value)
    return out


def benchmark_rows(spec: str, mirror: str | None) -> list[Record]:
    """The rows of ``--benchmarks``' entry ``adapter`` (its default config and split) or ``adapter:config``
    (e.g. ``synthetic_facts:set4``: another draw of a generated benchmark)."""
    from contamray.benchmarks import load_records

    adapter, _, config = spec.partition(":")
    return load_records(adapter, config=config or None, mirror_dir=mirror).records


def main(argv: list[str]) -> int:
    import os

    from contamray.benchmarks import adapter_names
    from contamray.engines import EngineSpec, build_engine

    args = parser().parse_args(argv)
    logs.configure()
    names = [b for b in args.benchmarks.split(",") if b]
    unknown = [b for b in names if b.partition(":")[0] not in adapter_names()]
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if unknown or bad or args.slices < 1 or args.size < 2:
        print(f"contamray calibrate: unknown benchmark(s) {unknown} (choices: {', '.join(adapter_names())}), or "
              f"method(s) {bad} (choices: {', '.join(METHODS)}), or --slices < 1 / --size < 2", file=sys.stderr)
        return 2
    mirror = args.mirror_dir or os.environ.get("CONTAMRAY_MIRROR_DIR")
    try:
        overrides = parse_overrides(args.set)
        check_overrides(methods, overrides)
        benchmarks = {b: benchmark_rows(b, mirror) for b in names}  # whole splits: the slices spread over them
        check_heldouts(benchmarks, methods, args.slices, args.size, args.seed, overrides)
    except ValueError as exc:
        print(f"contamray calibrate: {exc}", file=sys.stderr)
        return 2
    spec = EngineSpec(source=args.model, backend="hf", dtype="auto", name="calibrate", batch_size=16)
    engines = SharedEngines({"target": build_engine(spec)})
    started = time.time()
    table = calibrate(benchmarks, engines, methods, args.slices, args.size, args.seed, overrides)
    table.to_csv(args.out, index=False)
    sets = "".join(f" --set {item}" for item in args.set)
    note = (
        f"Measured by `contamray calibrate --slices {args.slices}{sets}` on {datetime.now():%Y-%m-%d}: model "
        f"`{args.model}`,\n{args.slices} contiguous slices of {args.size} rows spread over each split, "
        f"{(time.time() - started) / 60:.0f} min on {os.cpu_count()} CPU cores ({platform.machine()})."
    )
    markdown = render(table, note=note)
    print(markdown)
    if not args.no_readme:
        update_readme(args.readme, markdown)
    return 0
