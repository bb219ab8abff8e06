"""A local checkpoint's weight files checked before any work: present, complete, readable where it is cheap.

The commonest broken checkpoint is a download or copy cut short. Loaded, it fails only inside a Serve replica,
after Ray, Serve and the engine have started - and Serve tries a replica's constructor 3 times before it gives
up, each a start of the engine (minutes for a large model on vLLM). The plan reads what it can without loading a
weight (``check_weight_files``), so the run stops before Ray starts, naming the file, what is wrong and the fix:

- a checkpoint directory (``config.json``) with no weight file at all (``model.safetensors``, shards and their
  index, ``pytorch_model.bin``, ``*.pt``/``*.pth``, ``*.gguf``);
- a shard index (``*.safetensors.index.json``, ``*.bin.index.json``) that is not JSON, or lists a shard that is
  not in the directory;
- a ``*.safetensors`` file whose header (an 8-byte little-endian length, then that much JSON: every tensor's
  byte range, `safetensors format <https://github.com/huggingface/safetensors#format>`_) cannot be read, or whose
  size is not the header's 8 + length + the end of its last tensor (the library refuses such a file too);
- a ``pytorch_model*.bin`` in torch's zip format (what ``torch.save`` writes since torch 1.6) whose zip
  directory - the end of the file - cannot be read. A ``*.bin`` in the legacy pickle format is not read here
  (it would mean unpickling), nor are a Trainer's own files beside the weights (``optimizer.pt``,
  ``training_args.bin``: not weights).

Read per file: the first 8 bytes and the header for safetensors, the zip directory at the end for ``*.bin``:
a few kilobytes of a 14 GB checkpoint. What this cannot see (a tensor of the wrong shape or none for some of the
model's, bytes flipped inside a tensor) is still the loader's to report, from the replica (``engines/hf.py``,
``serve/hosting.py``), as a ``CheckpointError``: a failure no retry can mend, so the run stops at the replica's
first failed start instead of waiting for Serve's other tries.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on a header's length
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.safetensors.index.json", "*.bin.index.json")
# what a Trainer checkpoint keeps beside the weights (torch.save files, not weights)
TRAINING_STATE = frozenset({"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt"})
FIX = "copy or download the checkpoint again (or save it again with save_pretrained)"


class CheckpointError(ValueError):
    """A checkpoint's files were read and cannot make the model (a tensor that does not fit its config, a corrupt
    file): loading it again gives the same error, so whoever starts the engine should not try again."""


def check_weight_files(path: Path, key: str) -> None:
    """Raise ``ValueError`` naming the config ``key`` (``models.<name>.source``), the file, the problem and the
    fix when the checkpoint directory ``path`` has no weights, an index naming a missing shard, or a weight file
    that is cut short or is not what its name says."""
    weights = sorted(
        {p for pattern in WEIGHT_PATTERNS for p in path.glob(pattern) if p.is_file() and p.name not in TRAINING_STATE}
    )
    if not weights:
        raise ValueError(
            f"{key}: the checkpoint directory {str(path)!r} holds config.json but no weights (model.safetensors, "
            f"sharded model-*.safetensors with their index, pytorch_model.bin); save the model's weights into it "
            f"(model.save_pretrained) or point {key} at the directory that has them"
        )
    for file in weights:
        if file.name.endswith(".index.json"):
            _check_index(file, key)
        elif file.suffix == ".safetensors":
            check_safetensors(file, key)
        elif file.suffix == ".bin" and file.name.startswith("pytorch_model"):
            _check_torch_zip(file, key)


def _check_index(file: Path, key: str) -> None:
    try:
        index = json.loads(file.read_text())
        shards = sorted(set(index["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{key}: {str(file)!r} is not a shard index (JSON with a weight_map: {err}); {FIX}") from None
    missing = [name for name in shards if not (file.parent / name).is_file()]
    if missing:
        raise ValueError(
            f"{key}: {file.name} lists {len(shards)} shard(s), and {len(missing)} are not in {str(file.parent)!r}: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; {FIX}"
        )


def check_safetensors(file: Path, key: str) -> None:
    """``file``'s safetensors header readable and its size the header's (8 + length + the last tensor's end)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"{key}: {str(file)!r} is not a readable safetensors file ({size} bytes; its first 8 bytes do not "
                f"give a header length that fits the file); {FIX}"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
        ends = [int(t["data_offsets"][1]) for name, t in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(
            f"{key}: {str(file)!r} has an unreadable safetensors header ({type(err).__name__}: {err}); {FIX}"
        ) from None
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        what = "cut short (an interrupted download or copy?)" if size < expected else "longer than its header says"
        raise ValueError(
            f"{key}: {str(file)!r} is {what}: {size:,} bytes, where its header's tensors need {expected:,}; {FIX}"
        )


def _check_torch_zip(file: Path, key: str) -> None:
    with file.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return  # the legacy pickle format: not read here
    try:
        with zipfile.ZipFile(file) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as err:
        raise ValueError(
            f"{key}: {str(file)!r} is a torch zip archive whose directory cannot be read ({err}): cut short or "
            f"corrupt; {FIX}"
        ) from None
