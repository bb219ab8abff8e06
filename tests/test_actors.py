"""Engine answers are matched to requests by position: cells may share request keys in one batch."""

from __future__ import annotations

from contamray.engines import EngineSpec, build_engine
from contamray.methods.base import Request, Sampling
from contamray.pipeline.actors import answer_requests, byte_bounded


def test_same_key_requests_with_different_options_get_their_own_answers():
    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="float32"))
    text = "The capital of France is Paris."
    requests = [
        Request(key="r1|text", record_ids=("r1",), kind="score", text=text, vocab_stats=True),
        Request(key="r1|text", record_ids=("r1",), kind="score", text=text, vocab_stats=False),
        Request(key="r1|gen", record_ids=("r1",), kind="generate", text=text, sampling=Sampling(max_tokens=4)),
    ]
    with_stats, without_stats, generated = answer_requests(engine, requests)
    assert len(with_stats.token_mean) == with_stats.num_tokens > 0
    assert without_stats.token_mean == [] and without_stats.num_tokens == with_stats.num_tokens
    assert with_stats.token_logprobs == without_stats.token_logprobs
    assert generated.text and not generated.error


def test_match_batches_are_cut_into_pieces_bounded_by_bytes():
    """A corpus batch is matched in pieces of about ``max_bytes`` of UTF-8 text: a book-length document
    alone, short ones together, none cut or lost, in order."""
    docs = [{"doc_id": str(i), "text": ("x" * 50) if i % 7 else ("é" * 3000)} for i in range(60)]
    pieces = list(byte_bounded(docs, 1000))
    assert [d for piece in pieces for d in piece] == docs
    for piece in pieces:
        sizes = [len(d["text"].encode()) for d in piece]
        assert sum(sizes[:-1]) < 1000  # only the piece's last document may cross the bound
    assert [len(p) for p in pieces if len(p[-1]["text"]) == 3000 and len(p) == 1]  # a "book" alone
