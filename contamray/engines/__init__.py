"""Model engines: the Engine protocol (``base``), its backends and ``build_engine`` that picks one.

- ``hf.HFEngine``: transformers; any device; the only backend with vocabulary statistics (Min-K%++).
- ``vllm.VLLMEngine``: ``vllm.LLM``; the engine for GPU clusters (also runs on vLLM's CPU build).
- ``http.HTTPEngine``: a model behind an OpenAI-compatible server (``backend: http``, black-box probing:
  generation, and prompt log-probabilities where the server returns them; no vocabulary statistics).
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
import re
from dataclasses import dataclass
from typing import Any

from contamray.engines.base import Completion, Engine, TokenScores
from contamray.engines.models import EMBEDDED_MODELS, resolve_model_path, source_choices
from contamray.engines.tokenizer import resolve_tokenizer_path

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

BACKENDS = ("auto", "hf", "vllm", "http")
HTTP_APIS = ("vllm", "openai", "openai_chat")  # what the server answers: engines/http.py
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class EngineSpec:
    """How to build one engine, as written under ``models.<name>`` in the config.

    ``backend="auto"`` takes vLLM when CUDA is available and vLLM imports, transformers otherwise.
    ``kv_cache_gib`` applies to vLLM's CPU build only (``VLLM_CPU_KVCACHE_SPACE``, unless set);
    ``gpu_memory_utilization`` / ``tensor_parallel_size`` / ``enforce_eager`` to vLLM only;
    ``batch_size`` to transformers only (vLLM schedules its own batches). ``name`` is the config key
    of the model (``models.<name>``), used in error messages. ``tokenizer`` loads the tokenizer from another
    source than the weights (a checkpoint saved without one; ``engines/tokenizer.py``).

    ``backend: http`` (``engines/http.py``) probes a model behind an OpenAI-compatible server instead:
    ``base_url`` (``http(s)://host:port``, without ``/v1``), ``served_model`` (the ``model`` field of the
    requests; default ``source``, which then only labels the model), ``api_key_env`` (the NAME of the
    environment variable holding the API key; the key itself never goes into a config), ``api`` (``vllm``:
    vLLM's extra fields - prompt log-probabilities, token ids, ``/tokenize``; ``openai``: the plain API,
    scoring with ``echo``), ``max_concurrent_requests``, ``requests_per_second`` / ``tokens_per_minute``
    (0 = no limit), ``timeout_s``, ``max_retries`` with ``backoff_s`` .. ``backoff_max_s`` and ``cache``
    (the response cache under ``$CONTAMRAY_CACHE/http``). ``max_model_len`` is the server's context
    (asked from ``GET /v1/models`` when not given).
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
    # the tokenizer's source when the checkpoint has none (a fine-tune saved without it): an embedded name, a
    # local directory or a hub id; None = the checkpoint's own (engines/tokenizer.py)
    tokenizer: str | None = None
    # transformers: read a prompt prefix that several requests share once and continue each from its cache
    # (engines/prefix.py); false reads every prompt whole - the same answers but for the last bits of a float
    share_prefixes: bool = True
    # backend: http (an OpenAI-compatible server, engines/http.py)
    base_url: str = ""
    served_model: str = ""
    api_key_env: str = ""
    api: str = "vllm"
    max_concurrent_requests: int = 8
    requests_per_second: float = 0.0
    tokens_per_minute: float = 0.0
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    cache: bool = True
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
        spec = cls(name=name, **params)
        check_http(dataclasses.asdict(spec), spec.where)
        return spec


def check_http(params: dict[str, Any], where: str) -> None:
    """The ``backend: http`` keys of a model spec, checked; each error names ``<where>.<key>`` and the fix.

    An ``api_key_env`` that is not a variable name (the key pasted in by mistake) is refused without
    repeating the value."""
    if str(params.get("backend", "")).lower() != "http":
        return
    if params.get("tokenizer"):
        raise ValueError(f"{where}.tokenizer: an http model is tokenised by its server; remove the key")
    url = str(params.get("base_url") or "")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.base_url: an http model needs the server's URL, e.g. http://127.0.0.1:8000 "
                         f"(got {url!r})")  # fmt: skip
    if url.rstrip("/").endswith("/v1"):
        raise ValueError(f"{where}.base_url: give the server's root without /v1 (the engine adds /v1/completions); "
                         f"got {url!r}")  # fmt: skip
    env = str(params.get("api_key_env") or "")
    if env and not ENV_NAME.match(env):
        raise ValueError(f"{where}.api_key_env must be the NAME of an environment variable (letters, digits, _), not "
                         "the key itself (the value is not repeated here); export the key and name its variable")
    if params.get("api", "vllm") not in HTTP_APIS:
        raise ValueError(f"{where}.api: {params.get('api')!r} is not one of {', '.join(HTTP_APIS)}")
    positive = {"max_concurrent_requests": 1, "timeout_s": 1e-9}
    at_least_zero = ("requests_per_second", "tokens_per_minute", "max_retries", "backoff_s", "backoff_max_s")
    for key, low in [*positive.items(), *((k, 0) for k in at_least_zero)]:
        value = params.get(key)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}.{key}: expected a number, got {value!r}") from None
        if number < low:
            raise ValueError(f"{where}.{key}: must be {'> 0' if low else '>= 0'}, got {value!r}")


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
    if backend == "http":
        return _http_engine(spec)
    path = resolve_model_path(spec.source, where=f"{spec.where}.source")
    tokenizer = resolve_tokenizer_path(spec.tokenizer, where=f"{spec.where}.tokenizer") if spec.tokenizer else None
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
            tokenizer_path=tokenizer,
            share_prefixes=spec.share_prefixes,
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
        tokenizer_path=tokenizer,
    )


def _http_engine(spec: EngineSpec) -> Engine:
    """An ``HTTPEngine`` for ``spec`` (no model is loaded: the server hosts it)."""
    from contamray.engines.http import HTTPEngine

    check_http(dataclasses.asdict(spec), spec.where)
    return HTTPEngine(
        base_url=spec.base_url,
        model=spec.served_model or spec.source,
        api_key_env=spec.api_key_env,
        api=spec.api,
        max_concurrent_requests=spec.max_concurrent_requests,
        requests_per_second=spec.requests_per_second,
        tokens_per_minute=spec.tokens_per_minute,
        timeout_s=spec.timeout_s,
        max_retries=spec.max_retries,
        backoff_s=spec.backoff_s,
        backoff_max_s=spec.backoff_max_s,
        max_model_len=spec.max_model_len,
        cache=spec.cache,
        seed=spec.seed,
        name=f"http:{spec.name or spec.source}",
        where=spec.where,
    )
