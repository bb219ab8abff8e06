"""How much faster a fine-tune computes in bfloat16 than in float32 (``finetune_causal_lm(precision=...)``).

``contamray inject`` and the tests' contaminated models fine-tune SmolLM2-135M on CPU. Where the hardware computes
in bfloat16 (AVX-512 BF16 or AMX, a GPU), ``precision: bfloat16`` (mixed precision under ``torch.autocast``: float32
weights, gradients and optimiser state) is faster; on an AVX2 CPU torch emulates bfloat16 and it is slower - this
script measures whichever machine it runs on. One run: the same texts, epochs and seed fine-tuned in float32 and
in bfloat16, alternated ``--repeats`` times, on ``--threads`` torch threads (the tests' workers use one). Also
printed: each run's final epoch loss (the two precisions learn alike; the weights differ). The last line is
``finetune_speedup_bfloat16_over_float32: <x>x`` (median float32 seconds over median bfloat16 seconds).

    python bench/finetune_precision.py [--tokens 1024] [--epochs 2] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def text_of(tokens: int) -> str:
    """About ``tokens`` tokens of generated trivia (``synthetic_facts``: no file needed)."""
    from contamray.benchmarks.synthetic import generate_rows

    rows = generate_rows("set1", "train")
    return "\n".join(f"{r['question']} {r['answer_sentence']}" for r in rows)[: tokens * 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per training block (one block per step)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from contamray.engines import resolve_model_path
    from contamray.engines.hf import native_dtype
    from contamray.inject.finetune import MANIFEST, finetune_causal_lm

    torch.set_num_threads(args.threads)
    base = resolve_model_path("smollm2-135m")
    text = text_of(args.tokens)
    print(f"torch {torch.__version__}, {args.threads} thread(s); this CPU's native dtype: {native_dtype(False)}")
    seconds: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for precision in seconds:
                out = Path(tmp) / f"{precision}-{repeat}"
                finetune_causal_lm(base, [text], out, epochs=args.epochs, lr=1e-4, batch_size=1, seed=0,
                                   max_length=args.tokens, precision=precision)  # fmt: skip
                manifest = json.loads((out / MANIFEST).read_text())
                seconds[precision].append(manifest["seconds"])
                spent, loss = manifest["seconds"], manifest["epoch_losses"][-1]
                print(f"{precision}: {manifest['n_blocks']} block(s) x {args.epochs} epochs in {spent:.1f} s, "
                      f"last epoch loss {loss:.4f}")  # fmt: skip
    f32, bf16 = statistics.median(seconds["float32"]), statistics.median(seconds["bfloat16"])
    print(f"finetune_speedup_bfloat16_over_float32: {f32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
