"""A checkpoint saved without its tokenizer (``model.save_pretrained`` alone, as many training scripts do).

Known answers: the checkpoint here is the embedded model's own weights saved without tokenizer files, so with
``tokenizer: smollm2-135m`` its scores must equal the embedded model's exactly; without the key the plan refuses
it before any work and the engine refuses it, each naming ``models.<name>.tokenizer``; a tokenizer with more
tokens than the embedding table is refused as not the model's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from contamray.engines import EngineSpec, build_engine, resolve_model_path
from contamray.engines.hf import HFEngine
from contamray.engines.tokenizer import TokenizerError, missing_tokenizer
from contamray.experiments import CONF_DIR
from contamray.pipeline.plan import ConfigError, build_plan

TEXTS = ["The capital of France is Paris.", "Water boils at 100 degrees Celsius at sea level.", "Hi"]


@pytest.fixture(scope="module")
def base() -> HFEngine:
    return HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=4)


@pytest.fixture(scope="module")
def weights_only(base: HFEngine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded model's weights and config.json, no tokenizer file."""
    path = tmp_path_factory.mktemp("weights_only") / "model"
    base.model.save_pretrained(str(path))
    assert missing_tokenizer(str(path))
    return str(path)


def plan_of(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides))
    cfg.run.output_dir = "unused"
    return build_plan(cfg)


def test_missing_tokenizer_only_for_a_local_checkpoint_without_tokenizer_files(weights_only: str, tmp_path: Path):
    assert not missing_tokenizer(resolve_model_path("smollm2-135m"))  # converted with its tokenizer
    assert not missing_tokenizer("smollm2-135m") and not missing_tokenizer("HuggingFaceTB/SmolLM2-135M")
    assert not missing_tokenizer("s3://bucket/model") and not missing_tokenizer(str(tmp_path / "absent"))
    assert missing_tokenizer(weights_only)


def test_the_named_tokenizer_scores_as_the_checkpoint_it_came_from(base: HFEngine, weights_only: str):
    spec = EngineSpec(source=weights_only, tokenizer="smollm2-135m", backend="hf", dtype="float32", name="ft")
    engine = build_engine(spec)
    assert engine.encode(TEXTS) == base.encode(TEXTS)
    for ours, theirs in zip(engine.score(TEXTS, with_vocab_stats=True), base.score(TEXTS, with_vocab_stats=True)):
        assert ours.token_logprobs == theirs.token_logprobs and ours.token_std == theirs.token_std


def test_without_the_key_the_engine_names_it(weights_only: str):
    expected = r"models\.ft\.source: .* no tokenizer .* models\.ft\.tokenizer=smollm2-135m"
    with pytest.raises(TokenizerError, match=expected):
        build_engine(EngineSpec(source=weights_only, backend="hf", dtype="float32", name="ft"))


def test_a_tokenizer_that_cannot_be_the_models_is_refused(base: HFEngine, weights_only: str, tmp_path: Path):
    bigger = tmp_path / "bigger"
    tokenizer = base.tokenizer.__class__.from_pretrained(resolve_model_path("smollm2-135m"))
    tokenizer.add_tokens(["<extra_a>", "<extra_b>"])
    tokenizer.save_pretrained(str(bigger))
    with pytest.raises(TokenizerError, match=r"models\.ft\.tokenizer: the tokenizer has 49154 tokens .* 49152 rows"):
        build_engine(EngineSpec(source=weights_only, tokenizer=str(bigger), backend="hf", dtype="float32", name="ft"))
    with pytest.raises(TokenizerError, match=r"models\.ft\.tokenizer: directory .* holds no tokenizer file"):
        build_engine(EngineSpec(source=weights_only, tokenizer=weights_only, backend="hf", dtype="float32", name="ft"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"models\.ft\.tokenizer: cannot load a tokenizer from"):
        build_engine(EngineSpec(source=weights_only, tokenizer=str(tmp_path / "broken"), backend="hf", name="ft"))


def test_the_plan_refuses_a_checkpoint_without_tokenizer_before_any_work_and_takes_the_key(weights_only: str):
    run = ["+exp=base", "benchmark=[arc_challenge]", "method=[min_k]", "corpus=none"]
    with pytest.raises(ConfigError, match=r"models\.smollm2_135m\.tokenizer=smollm2-135m"):
        plan_of(*run, f"models.smollm2_135m.source={weights_only}")
    plan = plan_of(*run, f"models.smollm2_135m.source={weights_only}", "models.smollm2_135m.tokenizer=smollm2-135m")
    assert plan.models["smollm2_135m"].engine["tokenizer"] == "smollm2-135m"
    # unset, the key is not part of the engine spec: cell hashes and Serve app names are those from before it
    assert "tokenizer" not in plan_of(*run).models["smollm2_135m"].engine
    with pytest.raises(ConfigError, match=r"models\.canary\.source: .* no tokenizer files, and its fine-tune"):
        plan_of("+exp=canary", f"models.canary.source={weights_only}")
    with pytest.raises(ConfigError, match=r"models\.canary\.tokenizer: a model with inject"):
        plan_of("+exp=canary", "models.canary.tokenizer=smollm2-135m")
    with pytest.raises(ConfigError, match=r"models\.smollm2_135m\.tokenizer: expected a model source"):
        plan_of(*run, "models.smollm2_135m.tokenizer=3")
    with pytest.raises(ConfigError, match=r"models\.openai_compatible\.tokenizer: an http model is tokenised"):
        plan_of("+exp=base", "model=[openai_compatible]", "benchmark=[arc_challenge]", "method=[guided_prompting]",
                "corpus=none", "models.openai_compatible.base_url=http://127.0.0.1:9",
                "+models.openai_compatible.tokenizer=smollm2-135m")  # fmt: skip
