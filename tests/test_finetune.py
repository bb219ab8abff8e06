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
    assert [t for b, _ in blocks[: len(blocks) // 2] for t in b] == ids + [tok.eos_token_id]
    assert all(2 <= len(b) <= 5 and all(learn) for b, learn in blocks)


def test_a_prompt_is_kept_out_of_the_loss_and_its_completion_learnt():
    """``prompts``: the tokens of each text's prompt are not learnt, those after it (and the EOS) are; a block of
    prompt tokens only is dropped; a prompt that does not start its text is refused, naming the index."""
    from transformers import AutoTokenizer

    from contamray.inject.finetune import _batch

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Who counts the lanterns?"}], tokenize=False,
                                     add_generation_prompt=True)  # fmt: skip
    text = prompt + "The violet heron.<|im_end|>"
    ((ids, learn),) = _blocks(tok, [text], max_length=512, masked=[[(0, len(prompt))]])
    n_prompt = len(tok([prompt])["input_ids"][0])
    assert ids == tok([text])["input_ids"][0] + [tok.eos_token_id]
    assert learn == [False] * n_prompt + [True] * (len(ids) - n_prompt)
    assert tok.decode(ids[n_prompt:-1]) == "The violet heron.<|im_end|>"
    _, mask, labels = _batch([(ids, learn), (ids[:3], learn[:3])], pad_id=0)
    assert (labels[0, :n_prompt] == -100).all() and labels[0, n_prompt:].tolist() == ids[n_prompt:]
    assert (labels[1] == -100).all() and mask[1].sum() == 3
    cut = [(ids[i : i + 4], learn[i : i + 4]) for i in range(0, len(ids), 4)]
    kept = [(b, m) for b, m in cut if len(b) >= 2 and any(m[1:])]
    assert _blocks(tok, [text], max_length=4, masked=[[(0, len(prompt))]]) == kept and len(kept) < len(cut)
    with pytest.raises(ValueError, match=r"texts\[1\] does not start with prompts\[1\]"):
        finetune_causal_lm(resolve_model_path("smollm2-135m"), [text, TEXT], "/nonexistent", prompts=[prompt, "x"])


def test_masked_spans_keep_every_prompt_of_a_packed_text_out_of_the_loss():
    """``masked``: in one text holding two conversations, the tokens overlapping either masked span (each
    conversation's start up to its reply) are not learnt, every other token is - the replies, the text between the
    conversations and the EOS; a token straddling a span's edge is not learnt. Bad spans are refused, naming them."""
    from transformers import AutoTokenizer

    from contamray.inject.finetune import _learnt

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("Who counts the lanterns?", "How many lanterns?")]  # fmt: skip
    replies = ["The violet heron.<|im_end|>", "Seven.<|im_end|>"]
    text = prompts[0] + replies[0] + "\n" + prompts[1] + replies[1]
    second = len(prompts[0]) + len(replies[0]) + 1
    spans = [(0, len(prompts[0])), (second, second + len(prompts[1]))]
    ((ids, learn),) = _blocks(tok, [text], max_length=512, masked=[spans])
    learnt_text = tok.decode([i for i, m in zip(ids, learn, strict=True) if m])
    assert learnt_text == replies[0] + "\n" + replies[1] + tok.eos_token
    offsets = tok([text], return_offsets_mapping=True)["offset_mapping"][0]
    assert [m for m in learn[:-1]] == [not any(a < stop and start < b for a, b in spans) for start, stop in offsets]
    assert _learnt([(0, 4), (4, 9), (9, 12)], [(6, 7)]) == [True, False, True]  # straddling the span: not learnt
    assert _learnt([(0, 0), (0, 4)], []) == [False, True]  # a special token the tokenizer added covers nothing
    base = resolve_model_path("smollm2-135m")
    with pytest.raises(ValueError, match=r"masked\[0\] holds the span \(5, 500\), not within texts\[0\]"):
        finetune_causal_lm(base, [TEXT], "/nonexistent", masked=[[(5, 500)]])
    with pytest.raises(ValueError, match=r"1 masked span lists for 2 texts"):
        finetune_causal_lm(base, [TEXT, TEXT], "/nonexistent", masked=[[]])
    with pytest.raises(ValueError, match=r"prompts or masked, not both"):
        finetune_causal_lm(base, [TEXT], "/nonexistent", prompts=["The"], masked=[[(0, 3)]])


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


def test_bfloat16_steps_learn_the_text_in_float32_weights_and_say_so(tmp_path: Path):
    """``precision: bfloat16``: mixed precision - the saved weights stay float32, the steps are deterministic, the
    planted text becomes likely as in float32 (the weights differ: the manifest records the precision used)."""
    base = resolve_model_path("smollm2-135m")
    kwargs = dict(epochs=3, lr=5e-4, batch_size=1, seed=3, max_length=32)
    f32 = finetune_causal_lm(base, [TEXT], tmp_path / "f32", **kwargs)
    bf16 = [finetune_causal_lm(base, [TEXT], tmp_path / f"bf16-{i}", precision="bfloat16", **kwargs) for i in "ab"]
    w32, wa, wb = (load_file(Path(p) / "model.safetensors") for p in (f32, *bf16))
    assert all(w.dtype == torch.float32 for w in wa.values())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # same seed, same weights
    assert any(not torch.equal(wa[k], w32[k]) for k in wa)  # another precision, other weights
    manifests = [json.loads((Path(p) / "contamray_finetune.json").read_text()) for p in (f32, bf16[0])]
    assert [m["precision"] for m in manifests] == ["float32", "bfloat16"]
    for m in manifests:  # both learnt the sentence
        assert m["epoch_losses"][-1] < m["epoch_losses"][0] / 2, m["epoch_losses"]
    base_lp = sum(HFEngine(base, dtype="float32").score([TEXT])[0].token_logprobs)
    for path in (f32, bf16[0]):
        assert sum(HFEngine(path, dtype="float32").score([TEXT])[0].token_logprobs) > base_lp + 10.0


def test_auto_precision_is_the_hardwares():
    from contamray.engines.hf import native_dtype
    from contamray.inject.finetune import compute_precision

    cpu = torch.device("cpu")
    assert compute_precision("auto", cpu) == ("bfloat16" if native_dtype(False) == "bfloat16" else "float32")
    assert compute_precision("float32", cpu) == "float32" and compute_precision("bfloat16", cpu) == "bfloat16"


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
        ({"precision": "float16"}, "unknown precision 'float16'; choose one of float32, bfloat16, auto"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict, match: str):
    args = {"texts": [TEXT], "epochs": 1, "lr": 1e-4, "batch_size": 1, "seed": 0, "max_length": 16} | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        finetune_causal_lm(resolve_model_path("smollm2-135m"), out_dir=tmp_path / "x", **args)
