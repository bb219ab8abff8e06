"""Generation and scoring on the transformers backend with and without shared prefixes (``engines/prefix.py``).

Four workloads of the methods' own requests, on the embedded SmolLM2-135M in float32, ``--threads`` torch
threads, each answered by ``pipeline.actors.answer_requests`` (as a replica answers a batch) on two engines
that differ only in ``share_prefixes``:

- guided prompting's completions: guided and general prompts of ``--rows`` ARC-Challenge and as many
  ``synthetic_facts`` rows (instructions of ~60 and ~40 tokens shared per dataset);
- its judge: the paper's few-shot judge prompt for each ARC row's guided completion (a long shared prefix);
- CDD: ``--rows`` GSM8K questions, each one greedy request and one request for ``--samples`` samples;
- multiple-choice scoring: the held-out accuracy gap's score requests for ``--rows`` ARC-Challenge rows (each
  question alone and with each of its options appended), in the raw form and as chat turns with replies.

Per workload: seconds without and with sharing, their ratio, and how many answers are identical (greedy
and seeded samples alike: the same tokens are expected; scores: every log-probability within 1e-4). The last line is
``prefix_sharing_ratio_unshared_over_shared: <x>x``, over the four workloads' total seconds.

    python bench/prefix_sharing.py --mirror ../shared/benchmarks [--rows 20 --samples 10 --threads 1]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def workloads(mirror: Path, rows: int, samples: int, answer) -> dict[str, list]:  # noqa: ANN001
    from contamray.benchmarks import load_records
    from contamray.engines.wire import Request, Sampling
    from contamray.methods.base import get_method
    from contamray.methods.closed.guided_prompting import _key, prepare
    from contamray.methods.closed.guided_prompts import JUDGE_STOP, clean_completion, judge_prompt

    guided = get_method("guided_prompting")
    cfg = guided.make_config({"max_tokens": 12, "seed": 0})
    arc = load_records("arc_challenge", mirror_dir=mirror).records[:rows]
    facts = load_records("synthetic_facts", config="set2", split="test").records[:rows]
    stage0 = guided.requests(arc + facts, cfg, 0, {})
    completions = {o.key: o for o in answer(stage0)}  # the judge needs completions to judge
    judge = [
        Request(key=f"{r.id}|judge", record_ids=(r.id,), kind="generate", stage=1, engine="judge",
                text=judge_prompt(prepare(r, cfg).second, clean_completion(completions[_key(r.id, "guided")].text)),
                sampling=Sampling(max_tokens=cfg.judge_max_tokens, temperature=0.0, stop=JUDGE_STOP, seed=0))
        for r in arc
    ]  # fmt: skip
    cdd = get_method("cdd")
    cdd_cfg = cdd.make_config({"n_samples": samples, "max_tokens": 24, "seed": 0})
    gsm8k = load_records("gsm8k", mirror_dir=mirror).records[:rows]
    accuracy = get_method("heldout_accuracy")
    raw = accuracy.make_config({"reference": "heldout"})
    chat = accuracy.make_config({"reference": "heldout", "chat": True, "template": "{input}\n{choices}",
                                 "answer": "letter_option"})  # fmt: skip
    scores = accuracy.requests(arc, raw, 0, {}) + accuracy.requests(arc, chat, 0, {})
    return {"guided prompting": stage0, "judge": judge, "cdd": cdd.requests(gsm8k, cdd_cfg, 0, {}),
            "multiple-choice scores": scores}  # fmt: skip


def same_answer(a, b) -> bool:  # noqa: ANN001 - two Outputs of one request
    if a.token_logprobs or b.token_logprobs:  # a score: the same numbers to float32 rounding
        return len(a.token_logprobs) == len(b.token_logprobs) and all(
            abs(x - y) <= 1e-4 for x, y in zip(a.token_logprobs, b.token_logprobs)
        )
    return a.token_ids == b.token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "benchmarks")
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (bfloat16 rounds the two paths apart)")
    args = parser.parse_args()

    import torch

    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.pipeline.actors import answer_requests

    torch.set_num_threads(args.threads)
    path = resolve_model_path("smollm2-135m")
    engines = {share: HFEngine(path, dtype=args.dtype, batch_size=16, share_prefixes=share) for share in (False, True)}
    work = workloads(args.mirror, args.rows, args.samples, lambda reqs: answer_requests(engines[True], reqs))
    total = {False: 0.0, True: 0.0}
    for name, requests in work.items():
        seconds, answers = {}, {}
        for share, engine in engines.items():
            start = time.perf_counter()
            answers[share] = answer_requests(engine, requests)
            seconds[share] = time.perf_counter() - start
            total[share] += seconds[share]
        same = sum(same_answer(a, b) for a, b in zip(answers[False], answers[True], strict=True))
        ratio = seconds[False] / seconds[True]
        print(f"{name}: {len(requests)} requests, {seconds[False]:.1f} s read whole, {seconds[True]:.1f} s sharing "
              f"prefixes ({ratio:.2f}x); {same} of {len(requests)} answers identical")  # fmt: skip
    print(f"prefix_sharing_ratio_unshared_over_shared: {total[False] / total[True]:.2f}x")


if __name__ == "__main__":
    main()
