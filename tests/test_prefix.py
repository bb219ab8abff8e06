"""Prompts and texts that start alike are read once (``engines/prefix.py``, ``HFEngine._generate_ids`` and
``HFEngine._score_shared``).

Known answers: planted groups of prompts sharing a prefix are batched together and apart from each other;
on the real model, guided prompting's own prompts (two datasets, guided and general instructions) give the
same greedy completions with and without sharing while the engine reads a fraction of the prompt tokens,
a prompt sampled ``n`` times gives the same samples with its prefix read once, and multiple-choice texts
(a question alone and with each option) get the scores of the texts read whole.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest
import torch

from contamray.benchmarks import load_records
from contamray.engines import resolve_model_path
from contamray.engines.hf import HFEngine
from contamray.engines.prefix import SHARE_MIN, common_prefix, prefix_batches, shareable
from contamray.engines.wire import Sampling
from contamray.methods.base import get_method


def test_common_prefix_and_what_is_worth_sharing() -> None:
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix([[5], [6]]) == 0 and common_prefix([]) == 0
    long = list(range(40))
    assert shareable([long, long + [99]]) == 39  # each row keeps a token of its own to read
    assert shareable([long]) == 0 and shareable([long], repeats=3) == 39  # one prompt: only when sampled n times
    assert shareable([long[:SHARE_MIN], long[: SHARE_MIN - 1] + [7]]) == 0  # too short to pay a pass


def test_planted_groups_are_batched_together_and_apart() -> None:
    rng = random.Random(0)
    heads = {"a": [rng.randrange(1000) for _ in range(40)], "b": [rng.randrange(1000) for _ in range(40)]}
    seqs, group = [], []
    for name, head in heads.items():
        for _ in range(20):
            seqs.append(head + [rng.randrange(1000) for _ in range(rng.randrange(5, 30))])
            group.append(name)
    for _ in range(7):  # prompts sharing nothing worth it
        seqs.append([1000 + rng.randrange(1000) for _ in range(rng.randrange(5, 60))])
        group.append("none")
    batches = prefix_batches(seqs, batch_size=16, new_tokens=12)
    assert sorted(i for b in batches for i in b) == list(range(len(seqs)))
    assert all(1 <= len(b) <= 16 for b in batches)
    for b in batches:
        assert len({group[i] for i in b}) == 1, [group[i] for i in b]  # never mixed
        if group[b[0]] != "none" and len(b) > 1:
            assert shareable([seqs[i] for i in b]) >= 40
    assert len([b for b in batches if group[b[0]] == "a"]) == 2  # 20 rows: two batches, not one per row
    lone = [b for b in batches if group[b[0]] == "none"]
    assert [len(seqs[i]) for b in lone for i in b] == sorted((len(seqs[i]) for b in lone for i in b), reverse=True)


@pytest.fixture(scope="module")
def engines() -> dict[bool, HFEngine]:
    path = resolve_model_path("smollm2-135m")
    return {share: HFEngine(path, dtype="float32", batch_size=8, share_prefixes=share) for share in (True, False)}


@contextlib.contextmanager
def positions_read(engine: HFEngine) -> Iterator[list[int]]:
    """A counter of the token positions the model's embedding layer reads (prompt and generated tokens)."""
    read = [0]

    def count(_module: torch.nn.Module, args: tuple) -> None:
        read[0] += args[0].numel()

    handle = engine.model.get_input_embeddings().register_forward_pre_hook(count)
    try:
        yield read
    finally:
        handle.remove()


def complete_counting(engines: dict[bool, HFEngine], prompts: list[str], sampling: Sampling) -> tuple[dict, dict]:
    out, read = {}, {}
    for share, engine in engines.items():
        with positions_read(engine) as counter:
            out[share] = engine.complete(prompts, sampling)
        read[share] = counter[0]
    return out, read


def test_guided_prompts_give_the_same_completions_reading_their_instruction_once(engines, mirror_dir) -> None:
    method = get_method("guided_prompting")
    cfg = method.make_config({"max_tokens": 6, "seed": 0})
    records = load_records("synthetic_facts", config="set2", split="test").records[:4]
    records += load_records("arc_challenge", mirror_dir=mirror_dir).records[:4]
    prompts = [r.text for r in method.requests(records, cfg, 0, {})]  # guided and general, two datasets
    sampling = Sampling(max_tokens=6, temperature=0.0)
    out, read = complete_counting(engines, prompts, sampling)
    assert [c.sample_ids for c in out[True]] == [c.sample_ids for c in out[False]]
    assert [c.text for c in out[True]] == [c.text for c in out[False]]
    assert [c.prompt_tokens for c in out[True]] == [c.prompt_tokens for c in out[False]]  # a request's cost
    print("token positions read with / without sharing:", read[True], read[False])
    assert read[True] < 0.75 * read[False]


def test_a_prompt_sampled_n_times_is_read_once_and_keeps_its_samples(engines) -> None:
    prompt = ["Question: a farmer has 17 sheep and all but 9 run away. How many sheep does the farmer have left?"]
    sampling = Sampling(max_tokens=10, temperature=1.0, seed=3, n=6)
    out, read = complete_counting(engines, prompt, sampling)
    (shared,), (whole,) = out[True], out[False]
    assert shared.sample_ids == whole.sample_ids and len(set(map(tuple, shared.sample_ids))) > 1
    # six rows read the whole prompt; now one reads all but its last token and six rows read that token
    assert read[False] - read[True] == 5 * (shared.prompt_tokens - 1)


def test_a_model_whose_generate_takes_no_prefilled_cache_reads_prompts_whole(engines, caplog) -> None:
    engine = HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=8)
    original = engine.model.generate

    def without_cache(*args, **kwargs):  # as an architecture that cannot continue from a given cache
        if kwargs.get("past_key_values") is not None:
            raise TypeError("this model does not take past_key_values")
        return original(*args, **kwargs)

    engine.model.generate = without_cache
    head = "Answer the question about the invented town below in one short sentence, without explanation.\n"
    prompts = [head + "Q: When was Varnholt founded?\nA:", head + "Q: How many people live in Ostrel?\nA:"]
    sampling = Sampling(max_tokens=5, temperature=0.0)
    with caplog.at_level("WARNING", logger="contamray.engines.hf"):
        out = engine.complete(prompts, sampling)
    assert "prompts are read whole" in caplog.text and not engine._share_prefixes
    assert out == engines[False].complete(prompts, sampling)


def score_counting(engines: dict[bool, HFEngine], texts: list[str], **kwargs) -> tuple[dict, dict]:
    out, read = {}, {}
    for share, engine in engines.items():
        with positions_read(engine) as counter:
            out[share] = engine.score(texts, with_vocab_stats=True, **kwargs)
        read[share] = counter[0]
    return out, read


def assert_same_scores(shared: list, whole: list) -> None:
    """The same ids scored, and the same numbers to float32 rounding (a prefix read once sums otherwise)."""
    assert [s.token_ids for s in shared] == [w.token_ids for w in whole]
    for s, w in zip(shared, whole, strict=True):
        for a, b in ((s.token_logprobs, w.token_logprobs), (s.token_mean, w.token_mean), (s.token_std, w.token_std)):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4), (a, b)


@pytest.mark.parametrize("chat", [False, True])
def test_multiple_choice_texts_score_as_read_whole_reading_their_question_once(engines, mirror_dir, chat) -> None:
    """The held-out accuracy gap's requests - each question with each option appended (and alone, raw), or as a
    chat turn and each option its reply - share the question: scored with it read once per row group, every text's
    log-probabilities (and Min-K%++'s vocabulary statistics) are those of the text read whole, for well under half
    the reading."""
    method = get_method("heldout_accuracy")
    form = {"chat": True, "template": "{input}\n{choices}", "answer": "letter_option"} if chat else {}
    cfg = method.make_config({"reference": "heldout", **form})
    records = load_records("arc_challenge", mirror_dir=mirror_dir).records[:6]
    requests = method.requests(records, cfg, 0, {})
    replies = [r.reply for r in requests] if chat else None
    out, read = score_counting(engines, [r.text for r in requests], replies=replies)
    assert_same_scores(out[True], out[False])
    print("token positions read with / without sharing:", read[True], read[False])
    assert read[True] < 0.5 * read[False]


def test_texts_sharing_nothing_worth_it_are_scored_whole(engines) -> None:
    texts = ["The first text shares nothing.", "Another text, of another length entirely, here.", "x y"]
    out, read = score_counting(engines, texts)
    assert_same_scores(out[True], out[False])
    assert read[True] == read[False]


def test_a_model_whose_decoder_takes_no_cache_scores_texts_whole(engines, caplog) -> None:
    engine = HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=8)
    decoder = engine.model.get_decoder()

    def without_cache(**kwargs):  # as an architecture that cannot read on from a given cache
        if kwargs.get("use_cache"):
            raise TypeError("this model keeps no cache")
        return decoder(**kwargs)

    engine.model.get_decoder = lambda: without_cache
    head = "Answer the question about the invented town below in one short sentence, without explanation.\n"
    texts = [head + "Q: When was Varnholt founded?\nA: 1312", head + "Q: How many people live in Ostrel?\nA: Few"]
    with caplog.at_level("WARNING", logger="contamray.engines.hf"):
        out = engine.score(texts, with_vocab_stats=True)
    assert "texts are scored whole" in caplog.text and not engine._share_prefixes
    assert_same_scores(out, engines[False].score(texts, with_vocab_stats=True))


# Models a user brings are not all Llama-like: position ids from the attention mask (GPT-2, OPT's learned
# offsets), ALiBi (BLOOM), rotary (GPT-NeoX, Qwen2), multi-query caches (Falcon) each continue from a
# prefilled cache in their own code. Tiny random-weight models of each, with the embedded tokenizer: their
# greedy and sampled completions (different per prompt, random weights) must not depend on sharing, and the
# engine's token scores must be the model's own log-probabilities.
TINY = {
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 256},
    "opt": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_dim": 128,
            "max_position_embeddings": 256, "word_embed_proj_dim": 64},
    "bloom": {"n_layer": 2, "hidden_size": 64, "n_head": 4},
    "gpt_neox": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
                 "max_position_embeddings": 256},
    "falcon": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "multi_query": True,
               "new_decoder_architecture": False},
    "qwen2": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 256},
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_other_architectures_share_prefixes_and_score_as_their_model(model_type, tokenizer, tmp_path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **TINY[model_type])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    head = "You are given the first piece of an instance from the test split of a dataset. Finish it exactly. "
    prompts = [head + s for s in ("The capital of France is", "Two plus two is four", "Question: why? Answer:", "x")]
    out, scores = {}, {}
    for share in (True, False):
        engine = HFEngine(str(tmp_path), dtype="float32", batch_size=8, share_prefixes=share)
        greedy = engine.complete(prompts, Sampling(max_tokens=8))
        sampled = engine.complete(prompts[:2], Sampling(max_tokens=6, temperature=1.0, n=3, seed=1))
        scores[share] = engine.score(prompts, with_vocab_stats=True)  # the prompts scored as texts share it too
        out[share] = ([c.sample_ids for c in greedy], [c.sample_ids for c in sampled], engine._share_prefixes)
    assert shareable(engine.encode_prompts(prompts, False)) >= SHARE_MIN  # the prompts do share a prefix
    assert out[True][2], "sharing fell back to whole prompts or texts"
    assert out[True][:2] == out[False][:2]
    assert len({tuple(ids[0]) for ids in out[True][0]}) > 1  # the prompts' answers differ: the check is not empty
    # and the token scores, prefix read once or not (decoder + output embeddings where they equal the logits), are
    # the model's own
    for share in (True, False):
        for text, scored in zip(prompts, scores[share], strict=True):
            ids = torch.tensor([engine.encode([text])[0]])
            with torch.inference_mode():
                logp = torch.log_softmax(engine.model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            own = logp.gather(1, ids[0, 1:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(scored.token_logprobs), own, atol=1e-4), share
            assert torch.allclose(torch.tensor(scored.token_mean), (logp.exp() * logp).sum(-1), atol=1e-4), share
