"""The chat form's cost: where a reply starts, from the tokenizer instead of a second scoring request.

The membership scores' chat form (``chat: true`` / ``both``) scores each example as a conversation - its input the
user's turn in the model's chat template, its label the reply - and keeps the reply's tokens. Until 2026-11-29 each
conversation was sent with a second request, the user's turn alone, whose scored length said where the reply starts
(the same vocabulary statistics for Min-K%++: a second forward pass of the turn). Now the engine answers with the
turn's token count (``Output.prompt_tokens``, from the tokenizer; ``engines.base.scored_ids``) and the turn is not
scored on its own.

Measured here, in one run, on the embedded model: the requests of the six membership scores under ``chat: both``
for ``--rows`` rows of a benchmark, answered by the HF engine as the calibration shares them (``SharedEngines``:
one answer per distinct text, Min-K%++'s vocabulary statistics serving Min-K%, perplexity and zlib) - (a) as sent
now, (b) with each chat-form request's turn also scored alone (the old requests). The scores of (a) are checked
equal to (b)'s (the reply's positions cut by the turn's scored length, as before). The last line is
``ratio_turn_scored_alone_over_engine_offsets: <x>x`` (the seconds of (b) over (a)).

    python bench/chat_form.py --mirror ../shared/benchmarks [--benchmark arc_challenge --rows 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.environ.get("CONTAMRAY_MIRROR_DIR", "../shared/benchmarks"))
    parser.add_argument("--benchmark", default="arc_challenge")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    import torch

    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.methods.base import get_method
    from contamray.validate.calibrate import MEMBERSHIP, SharedEngines

    records = load_records(args.benchmark, n=args.rows, mirror_dir=Path(args.mirror)).records
    engine = HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=args.batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(records)} rows of {args.benchmark}")
    methods = [(get_method(n), get_method(n).make_config({"chat": "both"})) for n in MEMBERSHIP]
    requests = [r for method, cfg in methods for r in method.requests(records, cfg, 0, {})]
    chat = [r for r in requests if r.chat]
    turns = [dataclasses.replace(r, key=f"{r.key}/turn", reply="") for r in chat]
    engine.score(["warm-up"] * 2)

    def timed(reqs: list) -> tuple[float, dict]:
        shared = SharedEngines({"target": engine, "reference": engine})
        start = time.perf_counter()
        out = shared.answer(reqs)
        return time.perf_counter() - start, out

    t_now, now = timed(requests)
    t_old, old = timed(requests + turns)
    for r, turn in zip(chat, turns, strict=True):  # the same reply positions either way
        full, alone = old[r.key], old[turn.key]
        assert now[r.key].prompt_tokens - 1 == len(alone.token_logprobs), r.key
        gap = max(abs(a - b) for a, b in zip(full.token_logprobs, now[r.key].token_logprobs, strict=True))
        assert gap < 1e-4, (r.key, gap)  # batches pad differently: equal to float32 rounding
    distinct = len({(r.engine, r.text, r.reply, r.chat) for r in requests})
    print(f"{len(requests)} requests of the six scores under chat: both ({distinct} distinct texts x engines, "
          f"{len(chat)} in the chat form)")
    print(f"  engine offsets (now):             {t_now:7.1f} s")
    print(f"  + each turn scored alone (before): {t_old:7.1f} s ({len(turns)} more requests)")
    print(f"ratio_turn_scored_alone_over_engine_offsets: {t_old / t_now:.2f}x")


if __name__ == "__main__":
    main()
