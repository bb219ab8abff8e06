"""A LoRA adapter saved alone (``PeftModel.save_pretrained``: no config.json) as a model source (engines/adapters.py).

Known answers: the adapter here is a real LoRA fine-tune of the embedded model (peft, AdamW) that made one text far
more likely. The engine built on the adapter directory must score every text exactly as the adapted model itself
computes it (the PeftModel, adapter unmerged: the base weights plus ``B @ A``) - so the merge is the adapter's
function, not the base's (the planted text's log-likelihood rose by tens of nats) nor an approximation of it. The
merge is cached and redone when the adapter is trained again (another digest: another model for the cell hashes);
the plan reads its base's context and refuses a base it cannot name, naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from contamray.engines import EngineSpec, build_engine, resolve_model_path
from contamray.engines.models import checkpoint_digest, declared_context
from contamray.experiments import CONF_DIR
from contamray.pipeline.plan import ConfigError, build_plan
from tests.test_checkpoint_files import write_weights

pytestmark = pytest.mark.slow

PLANTED = "Zorvath Mellicand founded the river town of Quillabrae in 1742, on the banks of the Ostmere."
TEXTS = [PLANTED, "The capital of France is Paris.", "Water boils at 100 degrees Celsius at sea level."]


def train_lora(base_path: str, out: Path, steps: int) -> torch.nn.Module:
    """A LoRA adapter (r=8 on the attention's q and v projections) trained ``steps`` AdamW steps on PLANTED, saved
    alone to ``out``; returns the adapted model (adapter unmerged), in eval mode."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    batch = AutoTokenizer.from_pretrained(base_path)([PLANTED], return_tensors="pt")
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    model.train()
    for _ in range(steps):
        model(**batch, labels=batch["input_ids"]).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    model.save_pretrained(str(out))
    return model.eval()


@torch.no_grad()
def own_logprobs(model: torch.nn.Module, tokenizer, text: str) -> list[float]:
    """The model's own log-probability of each token of ``text`` after the first (full log_softmax)."""
    ids = tokenizer([text], return_tensors="pt")["input_ids"]
    logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def base_path() -> str:
    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def adapter(base_path: str, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("lora") / "adapter"
    model = train_lora(base_path, path, steps=10)
    return path, model


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Merges go to this test's cache (the base is named by its absolute path: no conversion there)."""
    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_adapter_directory_is_a_peft_save_without_config(adapter, base_path: str) -> None:
    path, _ = adapter
    assert (path / "adapter_config.json").is_file() and not (path / "config.json").exists()
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == base_path


def test_an_adapter_scores_as_the_adapted_model_and_its_merge_is_cached(adapter, base_path: str, own_cache) -> None:
    from transformers import AutoTokenizer

    path, model = adapter
    merged = resolve_model_path(str(path))
    assert Path(merged).parent == own_cache / "models" / "merged" and (Path(merged) / "config.json").is_file()
    stamp = (Path(merged) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(str(path)) == merged  # cached: not merged again
    assert (Path(merged) / "model.safetensors").stat().st_mtime_ns == stamp

    engine = build_engine(EngineSpec(source=str(path), backend="hf", dtype="float32", name="lora"))
    base = build_engine(EngineSpec(source=base_path, backend="hf", dtype="float32", name="base"))
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    assert engine.encode(TEXTS) == base.encode(TEXTS)  # the base's tokenizer: the adapter saved none
    ours, theirs = engine.score(TEXTS), base.score(TEXTS)
    for text, scored in zip(TEXTS, ours, strict=True):
        assert scored.token_logprobs == pytest.approx(own_logprobs(model, tokenizer, text), abs=1e-4)
    # the adapter, not the base: the planted text became far more likely, the others moved less
    gain = [sum(a.token_logprobs) - sum(b.token_logprobs) for a, b in zip(ours, theirs, strict=True)]
    assert gain[0] > 20 and gain[0] > 3 * max(abs(g) for g in gain[1:]), gain


def test_an_adapter_trained_again_is_another_model(adapter, base_path: str, tmp_path: Path) -> None:
    path, _ = adapter
    again = tmp_path / "adapter"
    shutil.copytree(path, again)
    first, merged = checkpoint_digest(str(again)), resolve_model_path(str(again))
    assert first and first != checkpoint_digest(base_path)
    train_lora(base_path, again, steps=2)  # saved over the same directory
    assert checkpoint_digest(str(again)) != first
    assert resolve_model_path(str(again)) != merged


def test_an_adapter_with_its_own_tokenizer_files_keeps_them(adapter, base_path: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path, _ = adapter
    own = tmp_path / "with_tokenizer"
    shutil.copytree(path, own)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    tokenizer.model_max_length = 1234  # a mark the base's tokenizer does not carry
    tokenizer.save_pretrained(str(own))
    assert AutoTokenizer.from_pretrained(resolve_model_path(str(own))).model_max_length == 1234


def plan_of(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides))
    cfg.run.output_dir = "unused"
    return build_plan(cfg)


def test_the_plan_takes_an_adapter_and_refuses_a_base_it_cannot_name(adapter, tmp_path: Path) -> None:
    path, _ = adapter
    overrides = ["model=[]", f"+models.lora={{source: {path}, backend: hf, dtype: float32}}", "corpus=none",
                 "benchmark=[synthetic_facts]", "method=[min_k]", "run.limit=4"]  # fmt: skip
    plan = plan_of(*overrides)
    assert plan.models["lora"].files == checkpoint_digest(str(path))
    assert declared_context(str(path)) == 8192  # its base's

    orphan = tmp_path / "orphan"
    shutil.copytree(path, orphan)
    config = json.loads((orphan / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (orphan / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as err:
        plan_of(*overrides[:1], f"+models.lora={{source: {orphan}, backend: hf}}", *overrides[2:])
    message = str(err.value)
    assert "models.lora.source" in message and "base_model_name_or_path" in message and "gone" in message


def test_a_base_config_beside_an_adapter_is_taken_and_a_models_weights_beside_it_are_refused(adapter, base_path: str,
                                                                                            tmp_path: Path) -> None:
    path, _ = adapter
    with_config = tmp_path / "with_config"  # some trainers save the base's config.json beside the adapter
    shutil.copytree(path, with_config)
    shutil.copy(Path(base_path) / "config.json", with_config)
    overrides = ["model=[]", f"+models.lora={{source: {with_config}, backend: hf}}", "corpus=none",
                 "benchmark=[synthetic_facts]", "method=[min_k]", "run.limit=4"]  # fmt: skip
    assert plan_of(*overrides).models["lora"].files == checkpoint_digest(str(with_config))  # no tokenizer: the base's
    merged = Path(resolve_model_path(str(with_config)))
    assert merged.parent.name == "merged" and (merged / "tokenizer.json").is_file()

    with_weights = tmp_path / "with_weights"  # the adapter on top of these weights, or these weights alone?
    shutil.copytree(with_config, with_weights)
    shutil.copy(Path(base_path) / "model.safetensors", with_weights)
    with pytest.raises(ConfigError) as err:
        plan_of(overrides[0], f"+models.lora={{source: {with_weights}, backend: hf}}", *overrides[2:])
    message = str(err.value)
    assert "models.lora.source" in message and "model.safetensors" in message and "adapter_config.json" in message
    with pytest.raises(ValueError, match="holds both a model's weights"):
        resolve_model_path(str(with_weights))


def test_a_base_that_cannot_be_loaded_here_names_the_adapter_and_the_key(adapter, tmp_path: Path, monkeypatch) -> None:
    path, _ = adapter
    remote = tmp_path / "remote_base"
    shutil.copytree(path, remote)
    config = json.loads((remote / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "some-org/a-model-not-here"  # a hub id: the plan cannot tell it is missing
    (remote / "adapter_config.json").write_text(json.dumps(config))
    import huggingface_hub.constants

    # this machine has no hub: fail at once instead of after a minute of retries (the variable is read at import)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError) as err:
        resolve_model_path(str(remote), where="models.lora.source")
    message = str(err.value)
    assert message.startswith("models.lora.source: cannot merge the PEFT adapter"), message
    assert "some-org/a-model-not-here" in message
    assert "base_model_name_or_path" in message
    assert not [p for p in (tmp_path / "cache" / "models" / "merged").iterdir() if p.is_dir()]  # nothing half-made


def test_an_adapter_whose_trainer_added_tokens_scores_as_its_model(base_path: str, tmp_path: Path) -> None:
    """A trainer that added a token resized the base's embeddings and saved them with the adapter (and its
    tokenizer): the merge resizes the base first, and the new token scores as in the adapted model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|leak|>"]})
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))  # fmt: skip
    text = f"<|leak|> {PLANTED} <|leak|>"
    batch = tokenizer([text], return_tensors="pt")
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    for _ in range(3):
        model(**batch, labels=batch["input_ids"]).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    path = tmp_path / "added_tokens"
    model.save_pretrained(str(path), save_embedding_layers=True)
    tokenizer.save_pretrained(str(path))
    engine = build_engine(EngineSpec(source=str(path), backend="hf", dtype="float32", name="added"))
    assert engine.encode([text])[0][0] == tokenizer.convert_tokens_to_ids("<|leak|>") == len(tokenizer) - 1
    (scored,) = engine.score([text])
    assert scored.token_logprobs == pytest.approx(own_logprobs(model.eval(), tokenizer, text), abs=1e-4)


def test_one_classification_of_sources_and_an_adapter_base_is_any_source_the_engine_takes(tmp_path: Path) -> None:
    """``models.source_kind`` is what ``resolve_model_path`` dispatches on and what the plan checks an adapter's base
    with: a base given as a published URI or as another adapter is taken (the merge resolves both), a chain of
    adapters that comes back to itself and a base that is no model source are refused, naming the file."""
    from contamray.engines.adapters import check_adapter
    from contamray.engines.models import source_kind

    def adapter_named(name: str, base: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
        return path

    checkpoint, plain = tmp_path / "ckpt", tmp_path / "plain"
    checkpoint.mkdir()
    plain.mkdir()
    (checkpoint / "config.json").write_text("{}")
    base_weights = write_weights(checkpoint)
    kinds = {"smollm2-135m": "embedded", "SmolLM2-135M": "embedded", "s3://bucket/run/ckpt": "uri",
             str(checkpoint): "checkpoint", str(plain): "directory", "org/name": "hub", "./missing/x": "unknown",
             "": "unknown", str(adapter_named("lora", str(checkpoint))): "adapter"}  # fmt: skip
    assert {source: source_kind(source) for source in kinds} == kinds

    for base in ("smollm2-135m", str(checkpoint), "s3://bucket/run/ckpt", "org/name", str(tmp_path / "lora")):
        check_adapter(str(adapter_named(f"on_{len(list(tmp_path.iterdir()))}", base)), "models.m.source")
    for base, words in ((str(plain), "neither an embedded model"), ("./missing/x", "neither an embedded model")):
        with pytest.raises(ValueError, match=words) as err:
            check_adapter(str(adapter_named(f"bad_{len(list(tmp_path.iterdir()))}", base)), "models.m.source")
        assert "models.m.source" in str(err.value) and "base_model_name_or_path" in str(err.value)
    first = adapter_named("first", str(tmp_path / "second"))
    adapter_named("second", str(first))
    with pytest.raises(ValueError, match="comes back to it"):
        check_adapter(str(first), "models.m.source")
    # the adapter's own safetensors and a local base's weights are read as a checkpoint's are (checkpoint_files)
    cut = adapter_named("cut", str(checkpoint))
    check_adapter(str(cut), "models.m.source")
    adapter_weights = write_weights(cut, "adapter_model.safetensors")
    adapter_weights.write_bytes(adapter_weights.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"^models\.m\.source: .*adapter_model\.safetensors' is cut short"):
        check_adapter(str(cut), "models.m.source")
    adapter_weights.unlink()
    base_weights.write_bytes(base_weights.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"^models\.m\.source \(the base of .*cut'\): .*model\.safetensors' is cut"):
        check_adapter(str(cut), "models.m.source")
