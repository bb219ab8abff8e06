"""Scoring throughput of contamray's transformers engine on the embedded model (issue 3's benchmark).

Prints tokens scored per second by ``HFEngine.score`` (bf16, length-bucketed batches, output head
applied in chunks) against

(a) the reference implementations' way: a plain transformers loop, batch size 1, float32, full
    ``log_softmax`` over the vocabulary, then a gather (Oren et al.'s ``compute_logprob_of_token_sequence``,
    Shi et al.'s ``calculatePerplexity``), and
(b) the raw ceiling: one large padded bf16 forward pass over the same tokens (logits only, nothing
    reduced), split into as few passes as memory allows (``--raw-batch``).

Then it runs the survey-preset sharded likelihood test (15 shards x 25 permutations, 1024 / 512) on
``--rows`` rows of a mirrored benchmark end to end (requests, engine, score, reduce) and prints its wall
time. The last two lines are ``ratio_vs_reference_loop: <x>x`` and ``ratio_vs_raw_forward: <x>x``.

Usage: ``python bench/score_throughput.py --mirror ../shared/benchmarks [--benchmark arc_challenge]``.
The texts are the benchmark's serialised examples (question and answer), as the likelihood methods
score them. Timings are wall clock on whatever else the machine is doing; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch


def reference_loop(model: torch.nn.Module, encoded: list[list[int]]) -> float:
    """Batch size 1, float32, full log-softmax: how the authors' code scores."""
    total = 0.0
    with torch.no_grad():
        for ids in encoded:
            x = torch.tensor([ids])
            logps = torch.nn.functional.log_softmax(model(x).logits[0, :-1], dim=-1)
            total += float(logps.gather(-1, x[0, 1:, None]).sum())
    return total


def raw_forward(model: torch.nn.Module, encoded: list[list[int]], pad_id: int, batch: int) -> None:
    """Padded bf16 forward passes producing the logits of every position (nothing reduced)."""
    with torch.inference_mode():
        for start in range(0, len(encoded), batch):
            group = encoded[start : start + batch]
            width = max(len(s) for s in group)
            ids = torch.full((len(group), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, s in enumerate(group):
                ids[i, : len(s)] = torch.tensor(s)
                mask[i, : len(s)] = 1
            model(input_ids=ids, attention_mask=mask).logits.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.environ.get("CONTAMRAY_MIRROR_DIR", "../shared/benchmarks"))
    parser.add_argument("--benchmark", default="arc_challenge")
    parser.add_argument("--texts", type=int, default=128, help="examples scored in the throughput comparison")
    parser.add_argument("--rows", type=int, default=100, help="rows of the survey-preset sharded test")
    parser.add_argument("--batch-size", type=int, default=32, help="HFEngine batch size")
    parser.add_argument("--raw-batch", type=int, default=64, help="texts per padded pass of the raw ceiling")
    args = parser.parse_args()

    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.methods.base import get_method
    from contamray.methods.closed.likelihood_text import serialise
    from contamray.pipeline.actors import answer_requests

    path = resolve_model_path("smollm2-135m")
    records = load_records(args.benchmark, n=max(args.texts, args.rows), mirror_dir=Path(args.mirror)).records
    texts = [serialise(r, ("input", "label"), "text") for r in records[: args.texts]]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {path}")

    engine = HFEngine(path, dtype="bfloat16", batch_size=args.batch_size)
    encoded = engine.encode(texts)
    n_tokens = sum(len(s) - 1 for s in encoded)
    print(f"{len(texts)} texts of {args.benchmark}, {n_tokens} scored tokens (mean {n_tokens / len(texts):.0f})")

    engine.score(texts[:4])  # warm-up
    start = time.perf_counter()
    engine.score(texts)
    t_engine = time.perf_counter() - start

    from transformers import AutoModelForCausalLM

    fp32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    reference_loop(fp32, encoded[:2])
    start = time.perf_counter()
    reference_loop(fp32, encoded)
    t_loop = time.perf_counter() - start
    del fp32

    bf16 = engine.model  # the same bf16 weights, called the plain way
    raw_forward(bf16, encoded[:4], engine.pad_id, args.raw_batch)
    start = time.perf_counter()
    raw_forward(bf16, encoded, engine.pad_id, args.raw_batch)
    t_raw = time.perf_counter() - start

    for label, seconds in (
        ("contamray HFEngine (bf16, bucketed, chunked head)", t_engine),
        ("reference loop (batch 1, float32, full log-softmax)", t_loop),
        (f"raw padded bf16 forward ({args.raw_batch} texts per pass)", t_raw),
    ):
        print(f"{label:<58} {seconds:8.2f} s {n_tokens / seconds:10.0f} tokens/s")

    method = get_method("sharded_likelihood")
    cfg = method.make_config({})  # the survey preset (the defaults)
    rows = records[: args.rows]
    start = time.perf_counter()
    outputs: dict = {}
    stage, n_requests = 0, 0
    while True:
        reqs = method.requests(rows, cfg, stage, outputs)
        if not reqs:
            break
        n_requests += len(reqs)
        outputs.update({o.key: o for o in answer_requests(engine, reqs)})
        stage += 1
    verdict = method.reduce(method.score(rows, outputs, cfg), cfg)
    t_sharded = time.perf_counter() - start
    print(
        f"sharded likelihood, survey preset (15 x 25, 1024/512) on {len(rows)} rows of {args.benchmark}: "
        f"{t_sharded:.1f} s wall, {n_requests} requests in {stage} stage(s), p = {verdict.p_value}"
    )
    print(f"ratio_vs_reference_loop: {t_loop / t_engine:.2f}x")
    print(f"ratio_vs_raw_forward: {t_raw / t_engine:.2f}x")


if __name__ == "__main__":
    main()
