"""What an open-data scan sends to the driver when the corpus copies the benchmark often (issue #16, item 1).

Before the fold, every match row reached the driver: one per (example, document, n-gram) for the uncapped
presets, so the driver's memory grew with how contaminated the corpus is - exactly what is measured. Now
each match actor folds its batch per example (``Method.fold``) and the driver folds what arrives.

Measured here, in one run, per method config: 200 GSM8K rows as the benchmark; a corpus of mirrored XSum
articles in which every row is planted in ``k`` documents (``k`` = 1, 10, 50). For each ``k``: the match
rows of the scan (the old driver's load: rows and pickled bytes) against the folded rows (the new one),
and the seconds of ``match`` against those of ``fold``. The last line is
``driver_bytes_ratio_raw_over_folded_at_k50: <x>x`` (the smallest ratio over the configs at ``k`` = 50).

    python bench/corpus_fold.py --mirror ../shared/benchmarks [--configs gpt2_8gram,gpt3_13gram,palm]
"""

from __future__ import annotations

import argparse
import functools
import json
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Any

import yaml

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 256
COPIES = (1, 10, 50)


def method_config(name: str) -> tuple[Any, Any]:
    from contamray.methods.base import get_method

    spec = yaml.safe_load((ROOT / "conf" / "method" / f"{name}.yaml").read_text())
    method = get_method(spec.pop("method"))
    return method, method.make_config(spec)


def corpus(mirror: Path, records: list[Any], copies: int, filler_docs: int = 2000) -> list[dict[str, str]]:
    with open(mirror / "EdinburghNLP/xsum/default/test.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["document"] for _, line in zip(range(filler_docs), fh)]
    rng = random.Random(copies)
    for record in records:
        for i in rng.sample(range(len(texts)), copies):
            texts[i] = f"{texts[i]}\n{record.input}\n{record.label}"
    return [{"doc_id": f"d{i}", "text": t} for i, t in enumerate(texts)]


def measure(method: Any, cfg: Any, records: list[Any], docs: list[dict[str, str]]) -> dict[str, float]:
    index = method.build_index(records, cfg)
    raw: list[dict[str, Any]] = []
    folded: list[dict[str, Any]] = []
    match_s = fold_s = 0.0
    for start in range(0, len(docs), BATCH):
        t0 = time.perf_counter()
        rows = method.match(docs[start : start + BATCH], index, cfg)
        t1 = time.perf_counter()
        folded = method.fold(folded + method.fold(rows, cfg), cfg)
        fold_s += time.perf_counter() - t1
        match_s += t1 - t0
        raw.extend(rows)
    same = method.score(records, raw, cfg) == method.score(records, folded, cfg)
    return {
        "raw_rows": len(raw), "raw_mb": len(pickle.dumps(raw)) / 1e6,
        "folded_rows": len(folded), "folded_mb": len(pickle.dumps(folded)) / 1e6,
        "match_s": match_s, "fold_s": fold_s, "same_scores": same,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "benchmarks")
    p.add_argument("--configs", default="gpt2_8gram,gpt3_13gram,palm")
    p.add_argument("--rows", type=int, default=200)
    args = p.parse_args()
    from contamray.benchmarks import load_records

    records = load_records("gsm8k", mirror_dir=args.mirror, n=args.rows, seed=0).records
    worst = float("inf")
    for name in args.configs.split(","):
        method, cfg = method_config(name)
        for k in COPIES:
            m = measure(method, cfg, records, corpus(args.mirror, records, k))
            ratio = m["raw_mb"] / max(m["folded_mb"], 1e-9)
            print(
                f"{name:12s} k={k:3d}: raw {m['raw_rows']:8d} rows {m['raw_mb']:8.2f} MB | folded "
                f"{m['folded_rows']:6d} rows {m['folded_mb']:6.2f} MB | {ratio:7.1f}x | match {m['match_s']:.2f} s "
                f"fold {m['fold_s']:.2f} s | same scores: {m['same_scores']}"
            )
            if k == COPIES[-1]:
                worst = min(worst, ratio)
    print(f"driver_bytes_ratio_raw_over_folded_at_k{COPIES[-1]}: {worst:.1f}x")


if __name__ == "__main__":
    main()
