"""A local checkpoint's weight files are checked by the plan, before Ray, Serve or a model starts
(``engines/checkpoint_files.py``): a download cut short, a shard index naming a missing shard, a file that is not
what its name says, a folder without weights - each refused naming the key, the file and the fix. Known answers:
files written by the libraries themselves (safetensors, ``torch.save``), then cut or damaged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from contamray.engines.checkpoint_files import check_weight_files
from contamray.pipeline.plan import ConfigError
from tests.test_config import plan_of

KEY = "models.m.source"


def write_weights(path: Path, name: str = "model.safetensors", rows: int = 64, seed: int = 0) -> Path:
    """A real safetensors file (two tensors, one header) under ``path``."""
    rng = np.random.default_rng(seed)
    save_file({"a": rng.standard_normal((rows, 8)).astype(np.float32), "b": np.arange(rows, dtype=np.int64)},
              str(path / name))  # fmt: skip
    return path / name


def checkpoint(tmp_path: Path, name: str = "ckpt") -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 8192}))
    (path / "tokenizer.json").write_text("{}")  # a checkpoint with its tokenizer (tests/test_tokenizer.py)
    return path


def refused(path: Path) -> str:
    with pytest.raises(ValueError) as err:
        check_weight_files(path, KEY)
    message = str(err.value)
    assert message.startswith(f"{KEY}: "), message
    return message


def test_whole_files_pass_and_a_file_cut_short_is_named_with_its_sizes(tmp_path: Path):
    path = checkpoint(tmp_path)
    weights = write_weights(path)
    check_weight_files(path, KEY)  # as the library wrote it
    whole = weights.read_bytes()
    weights.write_bytes(whole[:-100])  # a download that stopped 100 bytes early
    message = refused(path)
    assert "model.safetensors" in message and "cut short" in message
    assert f"{len(whole) - 100:,} bytes" in message and f"need {len(whole):,}" in message
    assert "copy or download the checkpoint again" in message
    weights.write_bytes(whole + b"\x00" * 10)
    assert "longer than its header says" in refused(path)
    weights.write_bytes(whole[:5])  # not even the header's length
    assert "not a readable safetensors file" in refused(path)
    weights.write_bytes(b"\x00not a checkpoint" * 64)  # what test_bad_input's corrupt checkpoint holds
    assert "not a readable safetensors file" in refused(path)
    weights.write_bytes((20).to_bytes(8, "little") + b"{not json at all....}" + b"\x00" * 64)
    assert "unreadable safetensors header" in refused(path)


def test_a_folder_without_weights_and_a_shard_index_naming_a_missing_shard(tmp_path: Path):
    path = checkpoint(tmp_path)
    assert "holds config.json but no weights" in refused(path)
    (path / "training_args.bin").write_bytes(b"PK\x03\x04 a Trainer's file")  # not weights, not read
    assert "holds config.json but no weights" in refused(path)
    for i in (1, 2, 3):
        write_weights(path, f"model-0000{i}-of-00003.safetensors", seed=i)
    index = {"metadata": {}, "weight_map": {f"t{i}": f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    check_weight_files(path, KEY)
    (path / "model-00002-of-00003.safetensors").unlink()
    message = refused(path)
    assert "model.safetensors.index.json lists 3 shard(s), and 1 are not in" in message
    assert "model-00002-of-00003.safetensors" in message
    (path / "model.safetensors.index.json").write_text("{cut")
    assert "is not a shard index" in refused(path)


def test_a_torch_zip_cut_short_is_refused_and_a_legacy_pickle_left_to_the_loader(tmp_path: Path):
    path = checkpoint(tmp_path)
    weights = path / "pytorch_model.bin"
    torch.save({"a": torch.zeros(256, 8)}, str(weights))
    check_weight_files(path, KEY)
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    assert "torch zip archive whose directory cannot be read" in refused(path)
    weights.write_bytes(b"\x80\x02legacy pickle bytes")  # not a zip: not read here (it would mean unpickling)
    check_weight_files(path, KEY)


def test_the_plan_refuses_a_cut_checkpoint_before_any_work(tmp_path: Path):
    path = checkpoint(tmp_path)
    weights = write_weights(path)
    run = ["+exp=base", "benchmark=[arc_challenge]", "method=[min_k]", "corpus=none",
           f"models.smollm2_135m.source={path}"]  # fmt: skip
    plan_of(*run)
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(ConfigError, match=r"^models\.smollm2_135m\.source: .*model\.safetensors' is cut short"):
        plan_of(*run)


def test_a_source_that_names_no_model_is_refused_before_any_work_and_on_a_cluster_a_missing_path_is_warned(
    tmp_path: Path,
):
    """A mistyped path, a folder that is no checkpoint, a bare name neither embedded nor ``org/name``: the engine would
    refuse each only in its replica, 3 constructor tries into the run. On a cluster a path the driver's node lacks
    may be mounted on the model's nodes: a warning there, naming the key."""
    run = ["+exp=base", "benchmark=[gsm8k]", "method=[perplexity]", "corpus=none"]
    missing, plain = tmp_path / "typo", tmp_path / "plain"
    plain.mkdir()
    for source, words in ((missing, "unknown model source"), (plain, "has no config.json"), ("gpt2", "org/name")):
        with pytest.raises(ConfigError, match=rf"^models\.smollm2_135m\.source: .*{words}"):
            plan_of(*run, f"models.smollm2_135m.source={source}", "ray.address=null")
    with pytest.raises(ConfigError, match=r"^reference_model\.source: unknown model source"):
        plan_of(*run, f"+reference_model={{source: {missing}}}", "ray.address=null")
    on_cluster = plan_of(*run, f"models.smollm2_135m.source={missing}", "ray.address=auto")  # planned: no Ray started
    assert [w for w in on_cluster.warnings if w.startswith("models.smollm2_135m.source: ")] == [
        f"models.smollm2_135m.source: {str(missing)!r} is not a model directory on this node (the driver's); each "
        "node that hosts the model must have it there (a shared path), or its replica will fail to start"
    ]
    with pytest.raises(ConfigError, match="unknown model source 'gpt2'"):  # no node could take it
        plan_of(*run, "models.smollm2_135m.source=gpt2", "ray.address=auto")
