"""Identical engine work from different cells is sent once and fanned back out (``engines/dedup.py``)."""

from __future__ import annotations

from contamray.engines.dedup import Dedup
from contamray.engines.wire import Output, Request, Sampling


def _score(key: str, text: str, vocab: bool = False, ids: tuple[str, ...] = ("r1",)) -> Request:
    return Request(key=key, record_ids=ids, kind="score", text=text, vocab_stats=vocab)


def _gen(key: str, text: str, **sampling: object) -> Request:
    return Request(key=key, record_ids=("r1",), kind="generate", text=text, sampling=Sampling(**sampling))


def _answer(unique: list[tuple[str, Request]]) -> list[tuple[str, Output]]:
    """What an engine would give back: the text's length as its token count, statistics when asked."""
    out = []
    for tag, req in unique:
        stats = [0.5] * len(req.text) if req.vocab_stats else []
        out.append((tag, Output(key=req.key, num_tokens=len(req.text), token_mean=stats, token_std=stats)))
    return out


def test_the_four_membership_scores_of_one_text_cost_one_forward_pass() -> None:
    items = [
        ("min_k", _score("e1|text", "alpha")),
        ("perplexity", _score("e1|text", "alpha")),
        ("zlib", _score("e1|text", "alpha")),
        ("min_k_plus_plus", _score("e1|text", "alpha", vocab=True)),
        ("min_k", _score("e2|text", "beta")),
        ("lowercase", _score("e1|lower", "ALPHA".lower())),  # the same text under another key: shared too
    ]
    work = Dedup(items)
    assert len(work.unique) == 2 and work.saved == 4
    sent = dict(work.unique)
    assert sum(r.vocab_stats for r in sent.values()) == 1  # the shared pass asks for what any sharer needs
    answered = work.expand(_answer(work.unique))
    assert len(answered) == len(items)
    got = {(owner, out.key): (out, shares) for owner, out, shares in answered}
    assert got[("min_k_plus_plus", "e1|text")][0].token_mean  # asked for the statistics: has them
    assert not got[("min_k", "e1|text")][0].token_mean  # did not ask: the copy carries none
    assert got[("min_k", "e1|text")][1] == 5 and got[("min_k", "e2|text")][1] == 1
    assert got[("lowercase", "e1|lower")][0].num_tokens == 5


def test_generations_share_only_when_prompt_sampling_and_chat_agree() -> None:
    items = [
        ("a", _gen("k", "prompt", max_tokens=16)),
        ("b", _gen("k", "prompt", max_tokens=16)),
        ("c", _gen("k", "prompt", max_tokens=32)),
        ("d", _gen("k", "prompt", max_tokens=16, seed=1)),
        ("e", Request(key="k", record_ids=("r1",), kind="generate", text="prompt", sampling=Sampling(max_tokens=16),
                      chat=True)),  # fmt: skip
        ("f", _score("k", "prompt")),
    ]
    work = Dedup(items)
    assert len(work.unique) == 5
    owners = sorted(owner for owner, _, shares in work.expand(_answer(work.unique)) if shares == 2)
    assert owners == ["a", "b"]


def test_costs_are_split_between_the_sharers() -> None:
    from contamray.pipeline.cells import EngineCosts

    same = _score("x", "same text")
    items = [("c1", same), ("c2", same), ("c3", _score("y", "other", ids=("r2",)))]
    work = Dedup(items)
    costs = EngineCosts()
    request_records = {"c1": {"x": ("r1",)}, "c2": {"x": ("r1",)}, "c3": {"y": ("r2",)}}
    costs.add_pass(work.expand(_answer(work.unique)), request_records, seconds=2.0)
    assert costs.tokens["c1"]["r1"] == costs.tokens["c2"]["r1"] == len("same text") / 2
    assert costs.tokens["c3"]["r2"] == len("other")
    total = sum(costs.seconds[c][r] for c, r in (("c1", "r1"), ("c2", "r1"), ("c3", "r2")))
    assert abs(total - 2.0) < 1e-9  # the pass's time is charged once over all its cells
