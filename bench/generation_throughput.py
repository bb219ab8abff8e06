"""Generation throughput of CDD's 51 generations per example (issue 15's benchmark).

CDD (Dong et al. 2024, ``contamray/methods/closed/cdd.py``) answers each example's prompt once greedily and
50 times at temperature 0.8. Prints generated tokens per second on one engine (transformers, the embedded
model) for

(a) contamray's path: the method's own requests - one request with ``Sampling(n=50, temperature=0.8, seed)``
    and one greedy request per example - answered by ``pipeline.actors.answer_requests`` as an engine replica
    answers a batch (the greedy prompts of all examples in padded batches; each sampled request one call that
    draws its 50 samples together), then ``score`` and ``reduce``; and
(b) a per-request loop on the same engine object: 51 separate single-sample calls per example (50 seeded
    samples at temperature 0.8 and one greedy), as a client of a one-completion-per-call API does it.

Both generate up to ``--max-tokens`` tokens per output (the paper: 100) and stop at end-of-sequence; the rate
counts the tokens actually generated (``Output.token_ids``), so outputs that end early do not flatter either
side. The loop runs on ``--loop-rows`` of the rows (a rate; by default all of them). The last line is
``ratio_vs_per_request_loop: <x>x``.

Usage: ``python bench/generation_throughput.py --mirror ../shared/benchmarks [--rows 50] [--loop-rows 5]``.
Timings are wall clock on whatever else the machine is doing; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import torch


def generated_tokens(outputs: list) -> int:
    """Tokens generated over every sample of every output."""
    return sum(len(ids) for out in outputs for ids in out.token_ids)


def contamray_path(engine, method, cfg, records, chunk: int) -> tuple[float, int, object]:
    """The method's requests answered as a replica answers batches of ``chunk`` examples (the engine's batch
    size: the greedy prompts of a chunk in one padded batch, each sampled request one call drawing its samples
    together); (seconds, generated tokens, rows)."""
    from contamray.pipeline.actors import answer_requests
    from contamray.pipeline.progress import Progress

    start, outputs = time.perf_counter(), []
    with Progress("contamray path", len(records), unit="rows") as progress:
        for i in range(0, len(records), chunk):
            part = answer_requests(engine, method.requests(records[i : i + chunk], cfg, 0, {}))
            outputs += part
            progress.update(len(records[i : i + chunk]), generated_tokens(part))
    rows = method.score(records, {o.key: o for o in outputs}, cfg)
    seconds = time.perf_counter() - start
    return seconds, generated_tokens(outputs), rows


def generated(completions: list) -> int:
    """Tokens generated over every sample of the completions of one engine call."""
    return sum(len(ids) for c in completions for ids in c.sample_ids)


def per_request_loop(engine, prompts: list[str], cfg) -> tuple[float, int]:
    """51 single-sample calls per prompt on the same engine: (seconds, generated tokens)."""
    from contamray.engines.wire import Sampling
    from contamray.pipeline.progress import Progress

    greedy = Sampling(max_tokens=cfg.max_tokens, temperature=0.0)
    start, tokens = time.perf_counter(), 0
    with Progress("per-request loop", len(prompts), unit="rows") as progress:
        for prompt in prompts:
            before = tokens
            for k in range(cfg.n_samples):
                sampling = Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.seed + k)
                tokens += generated(engine.complete([prompt], sampling, chat=cfg.chat))
            tokens += generated(engine.complete([prompt], greedy, chat=cfg.chat))
            progress.update(1, tokens - before)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.environ.get("CONTAMRAY_MIRROR_DIR", "../shared/benchmarks"))
    parser.add_argument("--benchmark", default="arc_challenge")
    parser.add_argument("--rows", type=int, default=50, help="examples of contamray's path (the issue: 50)")
    parser.add_argument("--loop-rows", type=int, default=0, help="examples of the per-request loop (0: --rows)")
    parser.add_argument("--max-tokens", type=int, default=100, help="tokens per output (the paper: 100)")
    parser.add_argument("--samples", type=int, default=50, help="samples per example (the paper: 50)")
    parser.add_argument("--model", default="smollm2-135m", help="embedded model name or checkpoint directory")
    parser.add_argument("--dtype", default="auto", help="engine dtype (auto: bf16 where the CPU has it fast)")
    parser.add_argument("--batch-size", type=int, default=16, help="HFEngine batch size (greedy prompts)")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                        help="prompts through the chat template (CDD's chat: true; the embedded model is an instruct "
                        "model, which ends a raw question's continuation after a few tokens)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # progress lines

    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.methods.base import get_method

    path = resolve_model_path(args.model)
    records = load_records(args.benchmark, n=args.rows, mirror_dir=Path(args.mirror)).records[: args.rows]
    method = get_method("cdd")
    cfg = method.make_config({"max_tokens": args.max_tokens, "n_samples": args.samples, "chat": args.chat})
    engine = HFEngine(path, dtype=args.dtype, batch_size=args.batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; model {path} "
          f"({engine.dtype}); {len(records)} rows of {args.benchmark}; {cfg.n_samples} samples at T "
          f"{cfg.temperature} + 1 greedy per row, <= {cfg.max_tokens} tokens each, chat={cfg.chat}")  # fmt: skip

    contamray_path(engine, method, cfg, records[:1], args.batch_size)  # warm-up
    t_ours, n_ours, rows = contamray_path(engine, method, cfg, records, args.batch_size)
    loop_rows = records[: args.loop_rows or len(records)]
    prompts = [r.input for r in loop_rows]
    per_request_loop(engine, prompts[:1], method.make_config({"max_tokens": 4, "n_samples": 2, "chat": args.chat}))
    t_loop, n_loop = per_request_loop(engine, prompts, cfg)

    peaks = [r["peakedness"] for r in rows if r.get("peakedness") is not None]
    rate_ours, rate_loop = n_ours / t_ours, n_loop / t_loop
    for label, n_rows, seconds, tokens, rate in (
        ("contamray (n=50 request + greedy, batched)", len(records), t_ours, n_ours, rate_ours),
        ("per-request loop (51 single-sample calls)", len(loop_rows), t_loop, n_loop, rate_loop),
    ):
        print(f"{label:<46} {n_rows:4d} rows {seconds:9.1f} s {tokens:9d} tokens {rate:9.1f} tokens/s")
    print(f"mean peakedness over {len(peaks)} rows: {sum(peaks) / max(1, len(peaks)):.3f}")
    print(f"ratio_vs_per_request_loop: {rate_ours / rate_loop:.2f}x")


if __name__ == "__main__":
    main()
