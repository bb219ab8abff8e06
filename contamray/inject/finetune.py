"""Plant a benchmark in a model: a small, real causal-LM fine-tune (full weights, AdamW, float32 weights).

Why it exists: closed-data detectors can only be *tested* on a model whose training data is known.
Hub models cannot be fetched here, so tests (and ``contamray inject``) build a contaminated model by
continuing to train a base model on chosen texts, e.g. one benchmark partition serialised in its
canonical order (what Oren et al. 2023's sharded likelihood test must then detect). The fine-tuned
checkpoint is an ordinary ``save_pretrained`` directory that both engines load.

How the texts become training sequences: each text is tokenised with the tokenizer's special tokens,
an EOS token is appended when the tokenizer has one (a document end, as in pre-training corpora), and
the ids are cut into consecutive blocks of at most ``max_length`` tokens (no overlap; a text shorter
than ``max_length`` is one block). Blocks are batched with right padding (padding is masked out of
the attention and of the loss), shuffled each epoch by a generator seeded with ``seed``. The loss is
the model's own next-token cross-entropy over all real tokens - or, with ``prompts`` (supervised fine-tuning's
"completion only" loss, as TRL's ``SFTTrainer`` computes it for prompt-completion data), over the tokens after each
text's prompt: ``prompts[i]`` is the start of ``texts[i]`` (e.g. a conversation's user turn rendered with the
assistant's generation prompt), and a token is learnt when it starts at or after the prompt's end (the
fast tokenizer's character offsets; the appended EOS is learnt). A chat model tuned so never learns its prompts'
text, only its replies given them. ``masked`` is the general form, for packed texts holding many conversations (an
injected stream, ``contamray.inject.stream``): per text, character spans ``[start, end)`` kept out of the loss; a
token is learnt unless it overlaps one (``prompts[i]`` is ``masked[i] = [(0, len(prompts[i]))]``).

Precision (``precision``): ``float32`` (the default) computes in float32; ``bfloat16`` computes the forward and
backward passes in bfloat16 under ``torch.autocast`` (mixed precision: the weights, their gradients and AdamW's
state stay float32, the loss is computed in float32), as fine-tunes on GPUs run; ``auto`` picks bfloat16 where the
hardware computes in it (a GPU, a CPU with AVX-512 BF16 or AMX: ``engines.hf.native_dtype``) and float32
elsewhere (any other CPU emulates bfloat16, several times slower). Measured on 2 EPYC cores with AVX-512 BF16, one
thread, SmolLM2-135M (``bench/finetune_precision.py``, 2026-11-27): bfloat16 1.63x as fast on 1,024-token blocks
(21.3 s against 33.7-35.9 s for 4 steps), 1.42x on 512-token blocks; the last epoch's loss within 1 %.
The two give different weights (so a cache key hashes the precision asked for, and the manifest records the one
used); the default stays float32 so that a spec trains the same model on every machine.

Determinism: the weights, the batch order and the optimiser depend only on the inputs and ``seed``
(``torch.manual_seed``; deterministic algorithms requested for the duration of the call, dropout off
via ``model.train()`` on a config with zero dropout - the caller's model config decides). On the same
machine and torch build two calls give identical weights.

Example::

    from contamray.engines import resolve_model_path
    from contamray.inject import finetune_causal_lm
    path = finetune_causal_lm(resolve_model_path("smollm2-135m"), ["text one", "text two"], "/tmp/ft",
                              epochs=3, lr=1e-4, batch_size=2, seed=0, max_length=256)
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from contamray.inject.spec import PRECISIONS
from contamray.inject.stream import Span
from contamray.pipeline.progress import Progress

log = logging.getLogger(__name__)

MANIFEST = "contamray_finetune.json"


def compute_precision(precision: str, device: torch.device, where: str = "finetune_causal_lm: precision") -> str:
    """The precision a fine-tune computes in on ``device``: ``float32`` or ``bfloat16`` (``auto`` resolved, see the
    module docstring); the error names ``where``."""
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    from contamray.engines.hf import native_dtype

    return "bfloat16" if native_dtype(device.type == "cuda") == "bfloat16" else "float32"


Block = tuple[list[int], list[bool]]  # token ids, and whether each is learnt (in the loss)


def _learnt(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[bool]:
    """Per token (its character offsets), whether it is learnt: it covers characters (special tokens added by the
    tokenizer cover none) and overlaps no masked span."""
    ordered = sorted(spans)
    ends = [b for _, b in ordered]
    learnt = []
    for start, stop in offsets:
        k = bisect.bisect_right(ends, start)  # the first span ending after the token starts
        learnt.append(stop > start and not (k < len(ordered) and ordered[k][0] < stop))
    return learnt


def _blocks(
    tokenizer: object, texts: Sequence[str], max_length: int, masked: Sequence[Sequence[Span]] | None = None
) -> list[Block]:
    """Token blocks of at most ``max_length`` ids, in text order, each id marked learnt or not (``masked``: see the
    module docstring); a block with nothing to learn is dropped."""
    eos = getattr(tokenizer, "eos_token_id", None)
    encoded = tokenizer(list(texts), add_special_tokens=True, return_offsets_mapping=masked is not None)  # type: ignore[operator]
    blocks: list[Block] = []
    for k, ids in enumerate(encoded["input_ids"]):
        ids = list(ids)
        learnt = [True] * len(ids) if masked is None else _learnt(encoded["offset_mapping"][k], masked[k])
        if isinstance(eos, int):
            ids.append(eos)
            learnt.append(True)
        for start in range(0, len(ids), max_length):
            block, learn = ids[start : start + max_length], learnt[start : start + max_length]
            if len(block) >= 2 and any(learn[1:]):  # a single id, or only prompt ids, has no target to learn
                blocks.append((block, learn))
    return blocks


def _batch(blocks: list[Block], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(b) for b, _ in blocks)
    ids = torch.full((len(blocks), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(blocks), width), dtype=torch.long)
    learnt = torch.zeros((len(blocks), width), dtype=torch.bool)
    for i, (b, learn) in enumerate(blocks):
        ids[i, : len(b)] = torch.tensor(b, dtype=torch.long)
        mask[i, : len(b)] = 1
        learnt[i, : len(b)] = torch.tensor(learn, dtype=torch.bool)
    labels = ids.masked_fill(~learnt, -100)  # padding is never learnt
    return ids, mask, labels


def _autocast(compute: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 mixed precision for the forward pass (the backward follows it), or nothing for float32."""
    if compute == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW, fused where torch supports it (measured here: ~1 s per step for 135M float32 parameters
    against 3-10 s for the default multi-tensor loop on 2 busy cores; same update rule)."""
    try:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def finetune_causal_lm(
    base_model_path: str,
    texts: Sequence[str],
    out_dir: str | Path,
    epochs: int = 3,
    lr: float = 1e-4,
    batch_size: int = 4,
    seed: int = 0,
    max_length: int = 512,
    weight_decay: float = 0.0,
    precision: str = "float32",
    prompts: Sequence[str] | None = None,
    masked: Sequence[Sequence[Span]] | None = None,
) -> str:
    """Fine-tune all weights of ``base_model_path`` on ``texts``; save model + tokenizer to ``out_dir``.

    Returns ``out_dir`` as a string. ``epochs`` full passes over the blocks, AdamW with constant
    learning rate ``lr`` (no warm-up: a few epochs on a few hundred blocks do not need one), on CPU (or
    the default CUDA device when there is one), computing in ``precision`` (see the module docstring). Writes
    ``contamray_finetune.json`` beside the weights: the base model, a hash of the texts and every parameter, so a
    checkpoint says what was planted in it. ``prompts``: per text, its start kept out of the loss; ``masked``: per
    text, character spans kept out of the loss (module docstring; one or the other). Raises ValueError naming the
    argument on bad input.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(texts, str):
        raise TypeError("finetune_causal_lm: texts must be a sequence of strings, not one string")
    texts = list(texts)
    if not texts or not any(t.strip() for t in texts):
        raise ValueError("finetune_causal_lm: texts is empty; give at least one non-empty text to train on")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"finetune_causal_lm: texts[{bad[0]}] is {type(texts[bad[0]]).__name__}, expected str")
    for name, value, low in (("epochs", epochs, 1), ("batch_size", batch_size, 1), ("max_length", max_length, 2)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"finetune_causal_lm: {name} must be an integer >= {low}, got {value!r}")
    if not lr > 0:
        raise ValueError(f"finetune_causal_lm: lr must be > 0, got {lr!r}")
    if prompts is not None:
        prompts = list(prompts)
        if len(prompts) != len(texts):
            raise ValueError(f"finetune_causal_lm: {len(prompts)} prompts for {len(texts)} texts; give one per text")
        bad = [i for i, (t, q) in enumerate(zip(texts, prompts, strict=True)) if not t.startswith(q)]
        if bad:
            raise ValueError(f"finetune_causal_lm: texts[{bad[0]}] does not start with prompts[{bad[0]}]; each prompt "
                             "is the start of its text (the part kept out of the loss)")  # fmt: skip
        if masked is not None:
            raise ValueError("finetune_causal_lm: give prompts or masked, not both (a prompt is masked (0, its end))")
        masked = [[(0, len(q))] for q in prompts]
    elif masked is not None:
        masked = [[(int(a), int(b)) for a, b in spans] for spans in masked]
        if len(masked) != len(texts):
            raise ValueError(f"finetune_causal_lm: {len(masked)} masked span lists for {len(texts)} texts; give one "
                             "per text (an empty list learns the text whole)")  # fmt: skip
        bad = [(i, a, b) for i, spans in enumerate(masked) for a, b in spans if not 0 <= a < b <= len(texts[i])]
        if bad:
            i, a, b = bad[0]
            raise ValueError(f"finetune_causal_lm: masked[{i}] holds the span ({a}, {b}), not within texts[{i}] "
                             f"(length {len(texts[i])}); spans are [start, end) offsets, start < end")  # fmt: skip

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    compute = compute_precision(precision, device)
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        torch.manual_seed(seed)
        tokenizer = AutoTokenizer.from_pretrained(base_model_path)
        model = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32)
        model.to(device)
        pad_id = tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else 0
        blocks = _blocks(tokenizer, texts, max_length, masked)
        if not blocks:
            raise ValueError(
                "finetune_causal_lm: the texts tokenise to fewer than 2 tokens each"
                + (", or have no token outside their prompts / masked spans" if masked is not None else "")
                + "; nothing to learn"
            )
        optimiser = _adamw(model, lr, weight_decay)
        order_rng = torch.Generator().manual_seed(seed)
        model.train()
        start = time.perf_counter()
        losses: list[float] = []
        steps = epochs * math.ceil(len(blocks) / batch_size)
        what = f"fine-tune of {Path(base_model_path).name} ({len(blocks)} blocks x {epochs} epochs, {compute})"
        progress = Progress(what, steps, unit="steps")
        for epoch in range(epochs):
            order = torch.randperm(len(blocks), generator=order_rng).tolist()
            epoch_loss, n_batches = 0.0, 0
            for b in range(0, len(order), batch_size):
                ids, mask, labels = _batch([blocks[i] for i in order[b : b + batch_size]], pad_id)
                with _autocast(compute, device):
                    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
                loss = float(out.loss.detach())
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"finetune_causal_lm: loss became {loss} at epoch {epoch}; lower lr ({lr})"
                    )
                out.loss.backward()
                optimiser.step()
                optimiser.zero_grad(set_to_none=True)
                epoch_loss += loss
                n_batches += 1
                progress.update(1, tokens=int(mask.sum()))
            losses.append(epoch_loss / max(1, n_batches))
            log.info("finetune epoch %d/%d: mean loss %.4f", epoch + 1, epochs, losses[-1])
        progress.close()
        model.eval()
        out_path = Path(out_dir)
        out_path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_path))
        tokenizer.save_pretrained(str(out_path))
        digest = hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()
        (out_path / MANIFEST).write_text(
            json.dumps(
                {
                    "base_model": str(base_model_path),
                    "texts_sha256": digest,
                    "loss": ("after each prompt" if prompts is not None else
                             "outside the masked spans" if masked is not None else "every token"),
                    **({"prompts_sha256": hashlib.sha256("\x1e".join(prompts).encode("utf-8")).hexdigest()}
                       if prompts is not None else {}),
                    **({"masked_sha256": hashlib.sha256(json.dumps(masked).encode("utf-8")).hexdigest(),
                        "masked_chars": sum(b - a for spans in masked for a, b in spans)}
                       if masked is not None and prompts is None else {}),
                    "n_texts": len(texts),
                    "n_blocks": len(blocks),
                    "epochs": epochs,
                    "lr": lr,
                    "batch_size": batch_size,
                    "seed": seed,
                    "max_length": max_length,
                    "weight_decay": weight_decay,
                    "precision": compute,
                    "epoch_losses": losses,
                    "seconds": round(time.perf_counter() - start, 2),
                },
                indent=2,
            )
        )
    finally:
        torch.use_deterministic_algorithms(deterministic_before)
    return str(out_path)
