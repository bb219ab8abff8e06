"""Model engines: the Engine protocol (``base``), its backends and ``build_engine`` that picks one.

- ``hf.HFEngine``: transformers; any device; the only backend with vocabulary statistics (Min-K%++).
- ``vllm.VLLMEngine``: ``vllm.LLM``; the engine for GPU clusters (also runs on vLLM's CPU build).
- ``models.resolve_model_path``: a model source (embedded name, local directory, hub id) -> a path.

Both backends tokenise the same way and score the same positions (see ``hf.py``), so a method's
numbers do not depend on the backend beyond floating-point noise (measured in tests/test_engines.py).
Both count what they leave out of a text or prompt longer than the context (``TokenScores.truncated``,
``Completion.truncated``, one warning per call) and render ``chat`` prompts through the tokenizer's
chat template (``base.encode_prompts``).
``vllm`` is imported only when a vLLM engine is built, so this package imports without it.

Example::

    from contamray.engines import EngineSpec, build_engine
    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="float32", name="target"))
    engine.score(["The capital of France is Paris."])[0].token_logprobs   # 6 negative numbers
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

from contamray.engines.base import Completion, Engine, TokenScores
from contamray.engines.models import EMBEDDED_MODELS, resolve_model_path, source_choices

__all__ = [
    "BACKENDS",
    "Completion",
    "EMBEDDED_MODELS",
    "Engine",
    "EngineSpec",
    "TokenScores",
    "build_engine",
    "pick_backend",
    "resolve_model_path",
    "source_choices",
]

BACKENDS = ("auto", "hf", "vllm")


@dataclass
class EngineSpec:
    """How to build one engine, as written under ``models.<name>`` in the config.

    ``backend="auto"`` takes vLLM when CUDA is available and vLLM imports, transformers otherwise.
    ``kv_cache_gib`` applies to vLLM's CPU build only (``VLLM_CPU_KVCACHE_SPACE``, unless set);
    ``gpu_memory_utilization`` / ``tensor_parallel_size`` / ``enforce_eager`` to vLLM only;
    ``batch_size`` to transformers only (vLLM schedules its own batches). ``name`` is the config key
    of the model (``models.<name>``), used in error messages.
    """

    source: str
    backend: str = "auto"
    dtype: str = "auto"  # bfloat16 where the hardware computes in it, else float32 (engines.hf.native_dtype)
    batch_size: int = 16
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 2
    enforce_eager: bool = True
    trust_remote_code: bool = False
    seed: int = 0
    name: str = ""

    @property
    def where(self) -> str:
        return f"models.{self.name or '<name>'}"

    @classmethod
    def from_config(cls, name: str, params: dict[str, Any]) -> EngineSpec:
        """Build from the plain mapping under ``models.<name>``; unknown keys are an error naming them."""
        params = dict(params)
        known = {f.name for f in dataclasses.fields(cls)} - {"name"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(
                f"models.{name}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
            )
        if "source" not in params:
            raise ValueError(f"models.{name}.source is missing; expected {source_choices()}")
        return cls(name=name, **params)


def _vllm_usable() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install is "not usable", whatever it raises
        return False
    return True


def pick_backend(spec: EngineSpec) -> str:
    """The concrete backend for ``spec`` (``auto`` resolved); the error names the config key."""
    backend = str(spec.backend).lower()
    if backend not in BACKENDS:
        raise ValueError(
            f"{spec.where}.backend: unknown backend {spec.backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    if backend != "auto":
        return backend
    import torch

    return "vllm" if torch.cuda.is_available() and _vllm_usable() else "hf"


def build_engine(spec: EngineSpec, streaming: bool = False) -> Engine:
    """Build the engine ``spec`` describes (the model is converted/loaded here).

    ``streaming``: a vLLM engine runs as vLLM's async engine, each request added as it arrives, so calls
    from several threads share its running batch (``VLLMEngine``); a Serve replica asks for it.
    Transformers has no such engine and ignores it."""
    backend = pick_backend(spec)
    path = resolve_model_path(spec.source, where=f"{spec.where}.source")
    label = f"{backend}:{spec.name or spec.source}"
    if backend == "hf":
        from contamray.engines.hf import HFEngine

        return HFEngine(
            path,
            dtype=spec.dtype,
            batch_size=spec.batch_size,
            max_model_len=spec.max_model_len,
            trust_remote_code=spec.trust_remote_code,
            seed=spec.seed,
            name=label,
            where=spec.where,
        )
    from contamray.engines.vllm import VLLMEngine

    return VLLMEngine(
        path,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        tensor_parallel_size=spec.tensor_parallel_size,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        kv_cache_gib=spec.kv_cache_gib,
        enforce_eager=spec.enforce_eager,
        trust_remote_code=spec.trust_remote_code,
        seed=spec.seed,
        name=label,
        where=spec.where,
        streaming=streaming,
    )
