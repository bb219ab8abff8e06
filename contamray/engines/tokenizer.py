"""A model's tokenizer: from its checkpoint, or from ``models.<name>.tokenizer`` when the checkpoint has none.

A fine-tune saved with ``model.save_pretrained`` alone (a common training script) is a directory of weights
and ``config.json`` without tokenizer files; transformers then fails with a message about sentencepiece and
slow tokenizers that says nothing about the cause. Here such a checkpoint is recognised - at plan time
(``missing_tokenizer``) and when an engine loads it (``load_tokenizer``) - and the error names the key that
fixes it: ``models.<name>.tokenizer``, the model the checkpoint was fine-tuned from (an embedded name such as
``smollm2-135m``, a local directory or a hub id; vLLM's ``tokenizer=`` argument, transformers'
``AutoTokenizer`` on that source). A tokenizer named apart from the model with more tokens than the model's embedding
table cannot be the model's and is refused (``check_vocabulary``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Files one of which every tokenizer ``AutoTokenizer`` loads from a directory writes (fast tokenizers,
# their config, sentencepiece models, BPE vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt", "sentencepiece.bpe.model")  # fmt: skip


class TokenizerError(ValueError):
    """A tokenizer that cannot be the model's, or none where one is needed; the message names the key to set."""


def _holds_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def missing_tokenizer(source: str) -> bool:
    """True when ``source`` is a local checkpoint directory (``config.json``) without any tokenizer file;
    False otherwise - also when it cannot be known here (an embedded name, a hub id, a URI)."""
    from contamray.engines.adapters import adapter_dir
    from contamray.engines.models import local_checkpoint

    path = local_checkpoint(source)  # a PEFT adapter's merge takes its base's tokenizer when it has none
    return path is not None and adapter_dir(source) is None and not _holds_tokenizer(path)


def resolve_tokenizer_path(source: str, where: str) -> str:
    """What ``AutoTokenizer.from_pretrained`` should load for ``<where>.tokenizer``: a local directory holding
    tokenizer files (no ``config.json`` needed), else any model source (``engines.models.resolve_model_path``:
    an embedded model converted on first use, a published URI, a hub id)."""
    from contamray.engines.models import resolve_model_path

    path = Path(str(source).strip()).expanduser() if isinstance(source, str) and source.strip() else None
    if path is not None and path.is_dir():
        if not _holds_tokenizer(path):
            raise TokenizerError(f"{where}: directory {str(path)!r} holds no tokenizer file (none of "
                                 f"{', '.join(TOKENIZER_FILES)}); point it at a directory written by "
                                 "tokenizer.save_pretrained, an embedded name or a hub id")  # fmt: skip
        return str(path.resolve())
    return resolve_model_path(source, where=where)


def no_tokenizer_message(where: str, source: str) -> str:
    """The error for a checkpoint without tokenizer files, naming the key and the fix."""
    return (
        f"{where}.source: {source!r} holds model weights but no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, "
        f"...): a fine-tune saved without its tokenizer. Set {where}.tokenizer to the model it was fine-tuned from "
        f"(e.g. {where}.tokenizer=smollm2-135m, a directory with tokenizer files or a hub id), or save the "
        "tokenizer beside the weights (tokenizer.save_pretrained)"
    )


def load_tokenizer(path: str, where: str, explicit: bool, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; errors name ``<where>.tokenizer`` when the tokenizer was given
    apart from the model (``explicit``), else the source and the ``tokenizer`` key that fixes a checkpoint
    without one."""
    from transformers import AutoTokenizer

    if not explicit and missing_tokenizer(path):
        raise TokenizerError(no_tokenizer_message(where, path))
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, TypeError for bad files
        if not explicit:
            raise
        raise TokenizerError(
            f"{where}.tokenizer: cannot load a tokenizer from {path!r} ({type(exc).__name__}: {exc}); give the model "
            "the checkpoint was fine-tuned from: an embedded name (smollm2-135m), a directory with tokenizer files "
            "or a hub id"
        ) from exc


def check_vocabulary(tokenizer: Any, embedding_rows: int, where: str, explicit: bool) -> None:
    """Refuse a tokenizer given apart from the model (``explicit``) that can emit ids past the model's embedding
    table: it is not this model's. A checkpoint's own tokenizer is not second-guessed (a few published ones
    declare special tokens their embedding table lacks and work, since those tokens never occur)."""
    size = len(tokenizer)
    if explicit and size > embedding_rows:
        raise TokenizerError(
            f"{where}.tokenizer: the tokenizer has {size} tokens but the model's embedding table {embedding_rows} "
            f"rows, so it is not this model's tokenizer; set {where}.tokenizer to the model the checkpoint was "
            "fine-tuned from"
        )
