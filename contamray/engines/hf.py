"""The transformers backend: any causal LM ``from_pretrained`` can load, on CPU or GPU (bf16 where the
hardware computes in it, else float32).

Why it exists beside vLLM: it is the only backend that gives the full next-token distribution cheaply,
which Min-K%++ needs (mean and standard deviation of log p over the vocabulary at every position), it
loads in about a second (tests, small models, CPU-only machines), and it needs no engine process.

Conventions shared with ``VLLMEngine`` (both backends must return the same numbers):

- Tokenisation is the tokenizer's own ``text -> ids`` with its special tokens (``add_special_tokens``),
  done by this process, so both backends see the same ids. ``count_tokens`` counts those ids.
- ``score`` returns ``log p(id_i | id_<i)`` for ``i >= 1``: ``count_tokens(text) - 1`` values. When the
  tokenizer prepends a BOS token, id_0 is BOS, so *every* text token is scored (the first one given
  BOS); when it does not (SmolLM2, GPT-2, Llama-3 base tokenizers vary), the first text token has no
  prefix and is not scored. ``token_ids`` are the scored ids ``id_1 ..``.
- A text longer than ``max_context`` tokens is scored on its first ``max_context`` tokens; a prompt is
  cut from the left so that it plus ``max_tokens`` fits (as lm-evaluation-harness does), since the end
  of a prompt is what the continuation depends on. Neither cut is silent: the tokens left out are
  returned (``TokenScores.truncated``, ``Completion.truncated``) and one warning per call counts them.
- ``generate(..., chat=True)`` wraps each prompt as one user turn in the tokenizer's chat template
  (``base.encode_prompts``); a tokenizer without one gets the raw text (one warning per engine; a scored reply
  follows it after a space, ``base.plain_reply``). A chat
  prompt too long for the context is cut from the left like any other (its template header goes
  first; the user text's end and the assistant prompt stay).
- ``generate`` returns only the new text, cut before the first stop string (the stop string itself is
  not returned, as vLLM's default), special tokens skipped.

Scoring never materialises a ``[batch x seq x vocab]`` float32 tensor: the decoder's last hidden
states are taken once per batch, and the output head is applied to chunks of scored positions, each
chunk reduced at once to the target log-probability (target logit minus a logsumexp) and, if asked,
the vocabulary mean and standard deviation of log p under p (Min-K%++, Zhang et al. 2024:
``mu = sum_v p_v log p_v``, ``sigma = sqrt(sum_v p_v (log p_v - mu)^2)``). Because some architectures
change logits after the head (Gemma-2 soft-capping, Cohere logit scaling), the engine checks once at
load time that ``head(decoder(x))`` reproduces ``model(x).logits`` and otherwise falls back to the
model's own logits (still reduced chunk by chunk).

Prompts to generate from and texts to score are batched by the prefixes they share (``engines/prefix.py``:
the prompts of a method often start with the same instruction; a multiple-choice method scores each question
alone and with every option appended), and a shared prefix is read once: its key/value cache is copied to
every row, which reads only its own rest (``_generate_ids``, ``_score_shared``; the prefix's own positions are
reduced once). Other texts are length-bucketed: sorted by token count, batched, and results put back in input
order, so padding waste is small. A batch that runs out of memory is halved and retried down to one
request (``base.halving``); a text or prompt that does not fit alone fails with the reason, the rest is
answered. Scoring pads on the right (positions stay 0..n-1), generation on the
left (what ``generate`` needs for decoder-only models).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from contamray.engines.base import (
    Completion,
    TokenScores,
    check_window,
    encode_prompts,
    encode_texts,
    halving,
    has_chat_template,
    is_out_of_memory,
    keep_head,
    keep_tail,
    mark_replies,
    score_rolling,
    scored_ids,
    token_limits,
    warn_truncated,
)
from contamray.engines.checkpoint_files import CheckpointError
from contamray.engines.models import context_in_config
from contamray.engines.prefix import length_buckets, prefix_batches, shareable
from contamray.engines.tokenizer import TokenizerError, check_vocabulary, load_tokenizer
from contamray.engines.wire import Sampling

log = logging.getLogger(__name__)

# the context assumed for a checkpoint whose config states none of models._CONTEXT_KEYS
_UNSTATED_CONTEXT = 2048

DTYPES: dict[str, torch.dtype | str] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "auto": "auto",
}


def native_dtype(on_gpu: bool) -> str:
    """``dtype: auto``: bfloat16 where the hardware computes in it, float32 elsewhere.

    A GPU (bf16 since Ampere) or a CPU with bf16 instructions (AVX-512 BF16 / AMX) runs bf16 at least
    as fast as float32 with half the memory. Any other CPU emulates bf16: SmolLM2-135M's forward pass
    measured 6x slower in bf16 than in float32 on an AVX2 EPYC, and 3.1x slower on 2 Xeon cores with
    AVX-512 but no BF16 (2026-12-07: 10.2 s against 3.3 s for 8 x 256 tokens) - where oneDNN's own check
    (``torch.ops.mkldnn._is_mkldnn_bf16_supported``, true on any AVX-512 core) chose bf16 before.
    """
    if on_gpu:
        return "bfloat16" if not torch.cuda.is_available() or torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_computes_bf16() else "float32"


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX-512 BF16 or AMX), as torch's CPU feature detection reads it."""
    cpu = torch.cpu
    if hasattr(cpu, "_is_avx512_bf16_supported") and hasattr(cpu, "_is_amx_tile_supported"):
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # an older torch: oneDNN's check


def parse_dtype(dtype: str | torch.dtype, where: str = "dtype", on_gpu: bool = False) -> torch.dtype:
    """``"bfloat16"`` / ``"float32"`` / ``"auto"`` (``native_dtype``) ... -> torch dtype; the error
    names the config key."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in DTYPES:
        raise ValueError(f"{where}: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    value = DTYPES[key]
    return DTYPES[native_dtype(on_gpu)] if value == "auto" else value  # type: ignore[return-value]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    end = len(text)
    for s in stop:
        if s:
            pos = text.find(s)
            if 0 <= pos < end:
                end = pos
    return text[:end]


def _require_tokens(encoded: Sequence[Sequence[int]]) -> None:
    """Generation needs at least one prompt token (an empty text without BOS has none)."""
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt #{i} is empty (no tokens): there is nothing to continue from")


def _token_scores(
    ids: Sequence[int], logprobs: torch.Tensor, means: torch.Tensor | None, stds: torch.Tensor | None, start: int
) -> TokenScores:
    """``TokenScores`` of ``ids``: positions ``start ..`` of the reduced log-probabilities (and vocabulary means
    and standard deviations, when asked for)."""
    end = start + len(ids)
    return TokenScores(
        token_logprobs=logprobs[start:end].tolist(),
        token_ids=list(ids),
        token_mean=means[start:end].tolist() if means is not None else [],
        token_std=stds[start:end].tolist() if stds is not None else [],
    )


def check_loaded_weights(loading: dict[str, Any], model_path: str, where: str) -> None:
    """Refuse a checkpoint that leaves some of the model's tensors without weights (``from_pretrained``'s
    ``missing_keys``): transformers starts them at random, logs a table and goes on, and every score the model
    then gives is noise. A shard or a layer lost in a copy, or weights saved with another ``config.json``.
    Tensors the model has no place for (``unexpected_keys``: a value head, a vision tower, extra layers) are
    logged, not refused: most are benign, and transformers already drops the ones it knows to be."""
    unexpected = sorted(loading.get("unexpected_keys") or ())
    if unexpected:
        log.warning(
            "%s.source: %d tensor(s) of the checkpoint %r have no place in the model and are not used: %s%s",
            where, len(unexpected), model_path, ", ".join(unexpected[:6]), " ..." if len(unexpected) > 6 else "",
        )
    missing = sorted(loading.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise CheckpointError(
            f"{where}.source: the checkpoint {model_path!r} has no weights for {len(missing)} of the model's "
            f"tensors ({shown}); transformers would start them at random and every score would be noise. Its "
            "weight files are incomplete or were saved with another config.json: copy every shard, or save the "
            "model again with save_pretrained"
        )


class HFEngine:
    """Engine backed by a transformers causal LM (see the module docstring for the conventions)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str | torch.dtype = "auto",
        batch_size: int = 16,
        max_model_len: int | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        seed: int = 0,
        chunk_bytes: int = 2**28,
        name: str = "",
        where: str = "model",
        tokenizer_path: str | None = None,
        share_prefixes: bool = True,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if batch_size < 1:
            raise ValueError(f"{where}.batch_size: must be >= 1, got {batch_size}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = parse_dtype(dtype, where=f"{where}.dtype", on_gpu=self.device.type == "cuda")
        self.batch_size = batch_size
        self.chunk_bytes = chunk_bytes
        self.seed = seed
        torch.manual_seed(seed)  # sampled generations reseed per call from Sampling.seed
        self.name = name or f"hf:{model_path}"
        self._warned_no_template = False
        explicit = tokenizer_path is not None
        try:
            self.tokenizer = load_tokenizer(tokenizer_path or model_path, where, explicit, trust_remote_code)
            self.model, loading = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code, output_loading_info=True
            )
        except TokenizerError:
            raise
        except OSError as exc:
            raise OSError(
                f"{where}.source: cannot load model {model_path!r} with transformers ({exc}); use an "
                "embedded model name, a local checkpoint directory, or a hub id reachable from here"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - a corrupt checkpoint: safetensors, config and shape errors
            raise CheckpointError(
                f"{where}.source: cannot load model {model_path!r} with transformers ({type(exc).__name__}: "
                f"{exc}); its files are corrupt or incomplete: download or convert the checkpoint again"
            ) from exc
        check_loaded_weights(loading, model_path, where)
        self.model.to(self.device).eval()
        check_vocabulary(self.tokenizer, self.model.get_input_embeddings().num_embeddings, where, explicit)
        self.dtype = next(self.model.parameters()).dtype
        self.pad_id = self._pad_id()
        limit = context_in_config(self.model.config) or _UNSTATED_CONTEXT
        if max_model_len is not None:
            if max_model_len < 2:
                raise ValueError(f"{where}.max_model_len: must be >= 2, got {max_model_len}")
            limit = min(limit, max_model_len)
        self.max_context: int = int(limit)
        self._fused_head = self._check_fused_head()
        self._share_prefixes = share_prefixes

    # ------------------------------------------------------------------ tokens
    def _pad_id(self) -> int:
        tok = self.tokenizer
        for candidate in (
            tok.pad_token_id,
            tok.eos_token_id,
            getattr(self.model.config, "pad_token_id", None),
        ):
            if isinstance(candidate, int):
                return candidate
        return 0  # masked out everywhere; the id itself never matters

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with the tokenizer's special tokens (the sequence the model sees)."""
        return encode_texts(self.tokenizer, texts)

    def encode_prompts(self, prompts: Sequence[str], chat: bool = False) -> list[list[int]]:
        """Prompt ids as ``generate`` feeds them (before any cut): with ``chat``, through the chat template."""
        if chat and not has_chat_template(self.tokenizer) and not self._warned_no_template:
            log.warning("%s: the tokenizer has no chat template; chat requests use the raw text (a reply after a "
                        "space)", self.name)  # fmt: skip
            self._warned_no_template = True
        return encode_prompts(self.tokenizer, prompts, chat)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.encode(texts)]

    # ----------------------------------------------------------------- scoring
    def score(
        self,
        texts: list[str],
        with_vocab_stats: bool = False,
        context_len: int = 0,
        stride: int = 0,
        replies: Sequence[str] | None = None,
    ) -> list[TokenScores]:
        ids, turns = scored_ids(self, texts, replies)
        if context_len:  # rolling windows over each text's ids: nothing is cut
            check_window(context_len, stride, self.max_context, self.name)
            return mark_replies(score_rolling(self.score_ids, ids, context_len, stride, with_vocab_stats), turns)
        encoded, truncated = keep_head(ids, self.max_context)
        warn_truncated(self.name, "texts", truncated, self.max_context, "scored on their first tokens")
        results = self.score_ids(encoded, with_vocab_stats)
        for res, n in zip(results, truncated):
            res.truncated = n
        return mark_replies(results, turns)

    def score_ids(self, encoded: list[list[int]], with_vocab_stats: bool = False) -> list[TokenScores]:
        """Scores of token id sequences (each at most the model's context): texts sharing a prefix batched
        together and the prefix read once (``engines/prefix.py``, as prompts to generate from), the rest batched
        by length."""
        results: list[TokenScores | None] = [None] * len(encoded)
        scorable = [i for i, ids in enumerate(encoded) if len(ids) >= 2]
        for i, ids in enumerate(encoded):
            if len(ids) < 2:
                results[i] = TokenScores(token_logprobs=[])
        seqs = [encoded[i] for i in scorable]
        if self._share_prefixes:
            batches = prefix_batches(seqs, self.batch_size, new_tokens=0)
        else:
            batches = length_buckets([len(s) for s in seqs], self.batch_size)
        with torch.inference_mode():
            for batch in batches:
                idx = [scorable[b] for b in batch]
                scored = halving(  # out of memory: the batch is halved and retried, then a text fails alone
                    lambda part: self._score_batch([encoded[i] for i in part], with_vocab_stats),
                    idx,
                    lambda _, reason: TokenScores(token_logprobs=[], error=reason),
                    self.name,
                )
                for i, res in zip(idx, scored):
                    results[i] = res
        return [r for r in results if r is not None]

    def _score_batch(self, seqs: list[list[int]], with_stats: bool) -> list[TokenScores]:
        shared = shareable(seqs) if self._share_prefixes else 0
        if shared:
            try:
                return self._score_shared(seqs, shared, with_stats)
            except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
                log.warning("%s: cannot reuse a text prefix's cache (%s); texts are scored whole", self.name, exc)
                self._share_prefixes = False
        ids, mask = self._pad_right(seqs)
        # Positions 0..n-2 of each sequence predict tokens 1..n-1.
        rows = torch.cat([torch.full((len(s) - 1,), b, dtype=torch.long) for b, s in enumerate(seqs)])
        cols = torch.cat([torch.arange(len(s) - 1) for s in seqs])
        targets = ids[rows, cols + 1].to(self.device)
        states, _ = self._states(ids, mask)
        picked = states[rows.to(self.device), cols.to(self.device)]
        del states
        lp, mu, sd = self._reduce(picked, targets, with_stats)
        out, start = [], 0
        for s in seqs:
            n = len(s) - 1
            out.append(_token_scores(s[1:], lp, mu, sd, start))
            start += n
        return out

    def _score_shared(self, seqs: list[list[int]], shared: int, with_stats: bool) -> list[TokenScores]:
        """Texts whose first ``shared`` ids are the same: the prefix is read once (its key/value cache copied to
        every row, as ``_generate_ids`` does for prompts) and each row reads only its rest, right-padded after
        the prefix (positions ``shared ..``). The prefix's own positions are reduced once; its last position
        predicts each row's first own token."""
        prefix = torch.tensor([seqs[0][:shared]], device=self.device)
        head_states, cache = self._states(prefix, None, cache=True)
        cache.batch_repeat_interleave(len(seqs))
        rest, rest_mask = self._pad_right([s[shared:] for s in seqs])
        mask = torch.cat([torch.ones_like(rest_mask[:, :1]).expand(-1, shared), rest_mask], dim=1)
        rest_states, _ = self._states(rest, mask, cache=cache)
        # row b's targets are its ids shared..: the prefix's last position, then the rest's all but last
        own = torch.cat([head_states[:, -1:].expand(len(seqs), -1, -1), rest_states], dim=1)
        rows = torch.cat([torch.full((len(s) - shared,), b, dtype=torch.long) for b, s in enumerate(seqs)])
        cols = torch.cat([torch.arange(len(s) - shared) for s in seqs])
        targets = torch.tensor([t for s in seqs for t in s[shared:]], device=self.device)
        lp, mu, sd = self._reduce(own[rows.to(self.device), cols.to(self.device)], targets, with_stats)
        del own, rest_states
        first = self._reduce(head_states[0, : shared - 1], prefix[0, 1:], with_stats)
        head = _token_scores(seqs[0][1:shared], *first, 0)
        out, start = [], 0
        for s in seqs:
            n = len(s) - shared
            tail = _token_scores(s[shared:], lp, mu, sd, start)
            out.append(TokenScores(
                token_logprobs=head.token_logprobs + tail.token_logprobs,
                token_ids=list(s[1:]),
                token_mean=head.token_mean + tail.token_mean,
                token_std=head.token_std + tail.token_std,
            ))  # fmt: skip
            start += n
        return out

    def _states(self, ids: torch.Tensor, mask: torch.Tensor | None, cache: Any = None) -> tuple[torch.Tensor, Any]:
        """What the output head reads at every position (the decoder's last hidden states when the head is plain,
        else the model's logits), and the key/value cache when one is given or asked for (``cache=True``)."""
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if cache is not None:
            kwargs.update(use_cache=True, past_key_values=None if cache is True else cache)
        if self._fused_head:
            out = self.model.get_decoder()(**kwargs)
            states = out.last_hidden_state
        else:
            out = self.model(**kwargs)
            states = out.logits
        return (states, out.past_key_values) if cache is not None else (states, None)

    def _reduce(
        self, picked: torch.Tensor, targets: torch.Tensor, with_stats: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Each picked position's target log-probability (and, with ``with_stats``, the vocabulary mean and
        standard deviation of log p), the output head applied to chunks of positions (module docstring)."""
        head: Callable[[torch.Tensor], torch.Tensor] = (
            self.model.get_output_embeddings() if self._fused_head else (lambda x: x)
        )
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        per_row = vocab * 4 * (5 if with_stats else 2)  # float32 logits + temporaries
        chunk = max(1, self.chunk_bytes // per_row)
        lp_parts, mu_parts, sd_parts = [], [], []
        for start in range(0, picked.shape[0], chunk):
            logits = head(picked[start : start + chunk]).float()
            lse = torch.logsumexp(logits, dim=-1)
            tgt = targets[start : start + chunk]
            lp_parts.append(logits.gather(1, tgt[:, None]).squeeze(1) - lse)
            if with_stats:
                logp = logits.sub_(lse[:, None])  # in place: logits are not needed any more
                p = logp.exp()
                mu = (p * logp).sum(-1)
                var = (p * (logp - mu[:, None]).square()).sum(-1)
                mu_parts.append(mu)
                sd_parts.append(var.clamp_min(0).sqrt())
            del logits
        logprobs = torch.cat(lp_parts).cpu()
        means = torch.cat(mu_parts).cpu() if with_stats else None
        stds = torch.cat(sd_parts).cpu() if with_stats else None
        return logprobs, means, stds

    def _pad_right(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[b, : len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _pad_left(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            if s:
                ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
                mask[b, width - len(s) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _check_fused_head(self) -> bool:
        """True when ``output_embeddings(decoder(x))`` equals ``model(x).logits`` for this architecture."""
        try:
            decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        except (AttributeError, NotImplementedError):
            return False
        if decoder is None or head is None:
            return False
        ids = torch.tensor([[self.pad_id, 1, 2, 3, 4, 5, 6, 7]], device=self.device) % int(
            head.weight.shape[0]
        )
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            try:
                ours = head(decoder(input_ids=ids, attention_mask=mask).last_hidden_state).float()
            except (TypeError, AttributeError, ValueError):
                return False
            theirs = self.model(input_ids=ids, attention_mask=mask).logits.float()
        same = ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-3, atol=1e-3)
        if not same:
            log.info(
                "%s: logits are post-processed after the head; scoring uses the model's logits", self.name
            )
        return bool(same)

    # -------------------------------------------------------------- generation
    def generate(self, prompts: list[str], sampling: Sampling, chat: bool = False) -> list[str]:
        """The new text of each prompt (see ``complete``)."""
        return [c.text for c in self.complete(prompts, sampling, chat=chat)]

    def complete(
        self, prompts: list[str], sampling: Sampling, chat: bool = False, max_tokens: Sequence[int] | None = None
    ) -> list[Completion]:
        """One completion per prompt, with the prompt tokens read, generated and left out.

        ``max_tokens`` (one per prompt, default ``sampling.max_tokens``): the batch generates up to the
        largest and each completion keeps its own first tokens - for greedy decoding exactly what a call
        of its own gives.
        """
        from transformers import GenerationConfig

        limits = token_limits(len(prompts), sampling, max_tokens, self.max_context)
        rooms = [self.max_context - m for m in limits]
        encoded, truncated = keep_tail(self.encode_prompts(prompts, chat), rooms)
        _require_tokens(encoded)
        most = max(limits, default=sampling.max_tokens)
        warn_truncated(self.name, "prompts", truncated, min(rooms, default=0), "cut from the left to leave max_tokens")
        greedy = sampling.temperature <= 0
        config_kwargs: dict[str, Any] = {
            "max_new_tokens": most,
            "do_sample": not greedy,
            "pad_token_id": self.pad_id,
            "eos_token_id": self._eos_ids(),
        }
        if not greedy:
            config_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        stops = [s for s in sampling.stop if s]
        if stops:
            config_kwargs["stop_strings"] = stops
        extra: dict[str, Any] = {"tokenizer": self.tokenizer} if stops else {}
        n = max(1, int(sampling.n))
        results = [Completion(text="", prompt_tokens=len(ids), truncated=k) for ids, k in zip(encoded, truncated)]
        with torch.inference_mode():
            if greedy:  # batched; n greedy samples are one sample n times
                gen_config = GenerationConfig(**config_kwargs)

                def run(part: list[int]) -> list[list[list[int]]]:
                    new = self._generate_ids([encoded[i] for i in part], gen_config, extra)
                    return [[new_ids] * n for new_ids in new]

                for bucket in prefix_batches(encoded, self.batch_size, most):
                    # out of memory: the bucket is halved and retried, then a prompt fails alone
                    for i, samples in zip(bucket, halving(run, bucket, self._failed(results), self.name)):
                        if samples is not None:
                            self._fill(results[i], encoded[i], samples, limits[i], stops)
            else:  # one call per prompt, seeded first: its samples do not depend on what else is in the batch

                def run_one(part: list[int]) -> list[list[list[int]]]:
                    (i,) = part
                    torch.manual_seed(sampling.seed)
                    gen_config = GenerationConfig(**{**config_kwargs, "max_new_tokens": limits[i]})
                    return [self._generate_ids([encoded[i]], gen_config, extra, repeats=n)]

                for i in range(len(encoded)):
                    (samples,) = halving(run_one, [i], self._failed(results), self.name)
                    if samples is not None:
                        self._fill(results[i], encoded[i], samples, limits[i], stops)
        return results

    def _generate_ids(
        self, seqs: list[list[int]], gen_config: Any, extra: dict[str, Any], repeats: int = 1
    ) -> list[list[int]]:
        """The new ids of each prompt, ``repeats`` rows per prompt in order (a sampled prompt's ``n``), from one
        ``model.generate`` call (the one place generation runs).

        A prefix the prompts share (``prefix.shareable``: all but the last token of a prompt sampled ``n``
        times, or a long common start of a batch) is read once: its key/value cache, copied to every row,
        is passed to ``generate``, which reads only the rest. The rows are ``[prefix][left padding][rest]``
        with the padding masked out, so each rest continues at the prefix's next position.
        """
        shared = shareable(seqs, repeats) if self._share_prefixes else 0
        rows = len(seqs) * repeats
        if shared:
            try:  # (under complete's inference mode)
                prefix = torch.tensor([seqs[0][:shared]], device=self.device)
                _, cache = self._states(prefix, None, cache=True)  # the decoder alone when the head is plain
                cache.batch_repeat_interleave(rows)
            except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
                log.warning("%s: cannot reuse a prompt prefix's cache (%s); prompts are read whole", self.name, exc)
                self._share_prefixes, shared = False, 0
        if not shared:
            ids, mask = self._pad_left(seqs)
            config = copy.copy(gen_config)
            config.num_return_sequences = repeats
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extra)
            return out[:, ids.shape[1] :].tolist()
        rest, rest_mask = self._pad_left([s[shared:] for s in seqs])
        ids = torch.cat([prefix.expand(len(seqs), -1), rest], dim=1)
        mask = torch.cat([torch.ones_like(ids[:, :shared]), rest_mask], dim=1)
        if repeats > 1:
            ids, mask = ids.repeat_interleave(repeats, dim=0), mask.repeat_interleave(repeats, dim=0)
        try:
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, past_key_values=cache, generation_config=gen_config, **extra
            )
        except Exception as exc:  # noqa: BLE001 - an architecture whose generate takes no prefilled cache
            if is_out_of_memory(exc):
                raise  # halving's: the batch is split
            log.warning("%s: generation from a prompt prefix's cache failed (%s: %s); prompts are read whole",
                        self.name, type(exc).__name__, exc)  # fmt: skip
            self._share_prefixes = False
            return self._generate_ids(seqs, gen_config, extra, repeats)
        return out[:, ids.shape[1] :].tolist()

    @staticmethod
    def _failed(results: list[Completion]) -> Callable[[int, str], None]:
        """``halving``'s answer for a prompt that runs out of memory alone: its completion carries the reason."""

        def fail(i: int, reason: str) -> None:
            results[i].error = reason

        return fail

    def _fill(
        self, result: Completion, prompt_ids: list[int], samples: list[list[int]], limit: int, stops: list[str]
    ) -> None:
        """A completion's samples from the generated ids (each cut at end-of-sequence and ``limit``)."""
        for new_ids in samples:
            kept = self._until_eos(new_ids)[:limit]
            result.samples.append(cut_at_stop(self._decode_continuation(prompt_ids, kept), stops))
            result.sample_ids.append(kept)
            result.new_tokens += len(kept)
        result.text = result.samples[0]

    def _eos_ids(self) -> list[int] | None:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return None
        return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]

    def _until_eos(self, new_ids: list[int]) -> list[int]:
        """The generated ids before the first end-of-sequence id (the rest is padding)."""
        eos = set(self._eos_ids() or [])
        kept: list[int] = []
        for t in new_ids:
            if t in eos:
                break
            kept.append(t)
        return kept

    def _decode_continuation(self, prompt_ids: list[int], kept: list[int]) -> str:
        """Decode the new ids in the context of the prompt (some tokenizers drop a leading space alone)."""
        if not kept:
            return ""
        tok = self.tokenizer
        whole = tok.decode(prompt_ids + kept, skip_special_tokens=True)
        head = tok.decode(prompt_ids, skip_special_tokens=True)
        if whole.startswith(head):
            return whole[len(head) :]
        return tok.decode(kept, skip_special_tokens=True)
