"""contamray.inject.finetune_causal_lm: a real fine-tune that plants text in a model, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from contamray.engines import resolve_model_path
from contamray.engines.hf import HFEngine
from contamray.inject import finetune_causal_lm
from contamray.inject.finetune import _blocks

TEXT = "The violet heron of Quillmere counts seven lanterns every dusk."


def test_blocks_cut_long_texts_and_append_eos():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    ids = tok([TEXT])["input_ids"][0]
    blocks = _blocks(tok, [TEXT, TEXT], max_length=5)
    assert [t for b in blocks[: len(blocks) // 2] for t in b] == ids + [tok.eos_token_id]
    assert all(2 <= len(b) <= 5 for b in blocks)


def test_one_step_is_deterministic_and_loadable(tmp_path: Path):
    base = resolve_model_path("smollm2-135m")
    kwargs = dict(epochs=1, lr=1e-4, batch_size=1, seed=3, max_length=32)
    a = finetune_causal_lm(base, [TEXT], tmp_path / "a", **kwargs)
    b = finetune_causal_lm(base, [TEXT], tmp_path / "b", **kwargs)
    wa, wb = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    base_w = load_file(Path(base) / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # same seed, same weights
    assert any(not torch.equal(wa[k], base_w[k]) for k in wa if k in base_w)  # and they moved
    manifest = json.loads((Path(a) / "contamray_finetune.json").read_text())
    assert manifest["base_model"] == base and manifest["n_blocks"] == 1 and manifest["seed"] == 3
    engine = HFEngine(a, dtype="float32")
    assert len(engine.score([TEXT])[0].token_logprobs) == len(engine.encode([TEXT])[0]) - 1


def test_the_planted_text_became_likely(contaminated_model):
    """The session's contaminated model: training loss fell, and the seen rows are far more likely than
    under the base model while unseen rows are not."""
    losses = contaminated_model.manifest["epoch_losses"]
    assert losses[-1] < losses[0] / 4
    from contamray.methods.closed.likelihood_text import serialise

    texts = [serialise(r, contaminated_model.fields, contaminated_model.format) for r in contaminated_model.seen[:8]]
    others = [serialise(r, contaminated_model.fields, contaminated_model.format) for r in contaminated_model.unseen[:8]]
    tuned = HFEngine(contaminated_model.path, dtype="auto")
    base = HFEngine(resolve_model_path("smollm2-135m"), dtype="auto")

    def gain(batch: list[str]) -> float:
        return sum(
            sum(t.token_logprobs) - sum(b.token_logprobs) for t, b in zip(tuned.score(batch), base.score(batch))
        ) / len(batch)

    assert gain(texts) > 10.0  # nats per question
    assert gain(others) < gain(texts) / 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"texts": []}, "texts is empty"),
        ({"texts": "one string"}, "not one string"),
        ({"epochs": 0}, "epochs must be"),
        ({"lr": 0.0}, "lr must be"),
        ({"max_length": 1}, "max_length must be"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict, match: str):
    args = {"texts": [TEXT], "epochs": 1, "lr": 1e-4, "batch_size": 1, "seed": 0, "max_length": 16} | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        finetune_causal_lm(resolve_model_path("smollm2-135m"), out_dir=tmp_path / "x", **args)
