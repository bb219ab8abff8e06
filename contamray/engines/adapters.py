"""A PEFT adapter (LoRA and its kin) as a model source: merged into its base model once, then cached.

Why: a model fine-tuned with LoRA (peft, TRL, axolotl and most training scripts) is often saved as its adapter
alone - ``adapter_config.json`` and ``adapter_model.safetensors``, no weights of a model (some trainers add the
base's ``config.json``) - and a contaminated model a user brings may be exactly that. transformers loads such a
directory only with ``peft`` installed and then runs the adapter beside the base weights; vLLM serves it only as a
LoRA request on an engine started with ``enable_lora``; and the plan reads a checkpoint's ``config.json`` (its
context, its files). So the adapter is merged into its base with peft's own ``merge_and_unload`` (each adapted
weight becomes ``W + scaling * B @ A``: the function the adapted model computes) in float32, and saved with a
tokenizer as a plain checkpoint under ``$CONTAMRAY_CACHE/models/merged/``, which every engine (transformers, vLLM,
a Serve replica on any node) loads as it loads any directory.

The base is the adapter's ``base_model_name_or_path`` (``adapter_config.json``), resolved as any model source: an
embedded name (``smollm2-135m``), a local directory, a hub id. The tokenizer is the adapter directory's when it
holds one (trainers save it beside the adapter: it may add tokens), else the base's. The cache entry is named by
a digest of the adapter's files (names, sizes, modification times, as ``models.checkpoint_digest``) and of the
base (its resolved path and, for a local one, its files), so an adapter or a base trained again is merged again;
the same digest is part of the run's cell hashes. A directory holding a model's weights *and* an adapter is refused
(transformers would run the adapter on top of those weights, vLLM would load the weights alone).

Example (a config): ``models.mine.source: /ckpt/lora-gsm8k`` - a directory written by ``PeftModel.save_pretrained``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
# a model's own weights (transformers' file names): beside an adapter they make the directory ambiguous
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def adapter_dir(source: str) -> Path | None:
    """``source`` as a local PEFT adapter directory (one holding ``adapter_config.json``), or None."""
    from contamray.engines.models import source_kind

    return Path(source.strip()).expanduser() if source_kind(source) == "adapter" else None


def _own_weights(path: Path) -> list[str]:
    return [name for name in WEIGHT_FILES if (path / name).is_file()]


def adapter_base(path: Path, where: str) -> str:
    """The base model source an adapter names (``base_model_name_or_path``); errors name the file, key and fix.

    A directory holding a model's weights as well as an adapter is refused: transformers would run the adapter on
    top of those weights, vLLM would load the weights alone - which model it is must be said by the layout (the
    adapter in a directory of its own, naming the model's as its base)."""
    if own := _own_weights(path):
        raise ValueError(
            f"{where}: {str(path)!r} holds both a model's weights ({', '.join(own)}) and a PEFT adapter "
            f"({ADAPTER_CONFIG}), so which model it is depends on the loader; keep the adapter in a directory of its "
            "own whose base_model_name_or_path names the model's directory, or give a merged checkpoint "
            "(peft merge_and_unload) without the adapter files"
        )
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: {path / ADAPTER_CONFIG} cannot be read as JSON ({exc}); it is not a PEFT "
                         "adapter directory written by save_pretrained") from None  # fmt: skip
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise ValueError(
            f"{where}: the PEFT adapter at {str(path)!r} names no base model ({ADAPTER_CONFIG}: "
            "base_model_name_or_path is empty); set it to the model the adapter was trained on (an embedded name "
            "such as smollm2-135m, a local directory or a hub id)"
        )
    base = base.strip()
    if Path(base).expanduser().resolve() == path.resolve():
        raise ValueError(f"{where}: the PEFT adapter at {str(path)!r} names itself as its base ({ADAPTER_CONFIG}: "
                         "base_model_name_or_path); set it to the model the adapter was trained on")  # fmt: skip
    return base


def check_adapter(source: str, where: str, _seen: frozenset[Path] = frozenset()) -> None:
    """What a plan checks of an adapter source before any work: peft is installed, the adapter's safetensors
    files are whole (``checkpoint_files``), and the base is a model source ``models.resolve_model_path`` takes
    (``models.source_kind``: an embedded name, a local checkpoint - its weight files checked too -, a published
    URI, a hub id, or another adapter, checked the same way; a chain that comes back to itself is refused)."""
    from contamray.engines.checkpoint_files import check_safetensors, check_weight_files
    from contamray.engines.models import source_kind

    path = adapter_dir(source)
    if path is None:
        return
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors(file, where)
    base = adapter_base(path, where)
    kind = source_kind(base)
    if kind == "checkpoint":
        check_weight_files(Path(base).expanduser(), f"{where} (the base of {str(path)!r})")
    if kind in ("directory", "unknown"):
        raise ValueError(
            f"{where}: the PEFT adapter at {str(path)!r} was trained on {base!r} ({ADAPTER_CONFIG}: "
            "base_model_name_or_path), which is neither an embedded model, a local checkpoint directory, a published "
            "URI nor a hub id; point base_model_name_or_path at a copy of that model, or merge the adapter "
            "(peft merge_and_unload) and give the merged checkpoint as the source"
        )
    if kind == "adapter":
        seen = _seen | {path.resolve()}
        if Path(base).expanduser().resolve() in seen:
            raise ValueError(f"{where}: the PEFT adapter at {str(path)!r} names as its base {base!r}, an adapter whose "
                             "chain of bases comes back to it; set base_model_name_or_path to the model the adapter "
                             "was trained on")  # fmt: skip
        check_adapter(base, f"{where} (the base of {str(path)!r})", seen)
    _require_peft(where)


def _require_peft(where: str) -> None:
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ValueError(f"{where}: a PEFT adapter directory needs the `peft` package to be merged into its base; "
                         "install it (pip install peft), or give a merged checkpoint as the source")  # fmt: skip


def adapter_digest(path: Path, where: str = "model source") -> str:
    """A digest of the adapter's files and of its base (see the module docstring)."""
    return _digest(path, adapter_base(path, where))


def _digest(path: Path, base: str) -> str:
    from contamray.corpus.fingerprint import file_listing
    from contamray.engines.models import checkpoint_digest

    parts = {"adapter": file_listing(str(path.resolve())), "base": base, "base_files": checkpoint_digest(base)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def merged_checkpoint(path: Path, where: str) -> Path:
    """The adapter at ``path`` merged into its base: a cached plain checkpoint directory (built on first use)."""
    from contamray.engines.models import build_cached, cache_root, resolve_model_path

    base = adapter_base(path, where)
    _require_peft(where)
    base_path = resolve_model_path(base, where=f"{where} (the adapter's base, {ADAPTER_CONFIG}: "
                                                "base_model_name_or_path)")  # fmt: skip
    digest = _digest(path, base)  # adapter_digest's, its config read once
    target = cache_root() / "merged" / f"{path.name}-{digest}"
    try:
        return build_cached(
            target,
            lambda out: _merge(path, base_path, out),
            {"adapter": str(path.resolve()), "base": base, "digest": digest},
        )
    except (OSError, ValueError, RuntimeError, KeyError) as exc:  # what transformers and peft raise for bad files
        raise ValueError(
            f"{where}: cannot merge the PEFT adapter at {str(path)!r} into its base {base!r} ({ADAPTER_CONFIG}: "
            f"base_model_name_or_path): {type(exc).__name__}: {str(exc)[:500]}; point base_model_name_or_path at a "
            "local copy of the model the adapter was trained on (an embedded name, a directory), or give a merged "
            "checkpoint (peft merge_and_unload) as the source"
        ) from exc


def _merge(adapter: Path, base_path: str, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from contamray.engines.tokenizer import TOKENIZER_FILES

    log.info("merging the PEFT adapter %s into its base %s (one-off) -> %s", adapter, base_path, out)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    own_tokenizer = any((adapter / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter) if own_tokenizer else base_path)
    if len(tokenizer) > base.get_input_embeddings().weight.shape[0]:  # tokens the trainer added: the adapter
        base.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # holds their trained rows
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
