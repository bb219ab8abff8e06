"""Long documents matched in pieces give what matching them whole gives (issue #16, item 3).

A 3 MB document (and a second long one, with short ones beside them) is built so that a planted
benchmark item straddles every cut the scan makes at ``MAX_BYTES``: every n-gram, substring, exact input
and Llama 2 span across a cut must still be found once, at its place in the whole document, and counted
for one document. Each open method's real ``build_index`` / ``match`` / ``fold`` / ``score`` run
in-process through ``Scanner`` (the match worker's code, without Ray): with pieces and with the cut
turned off (a bound larger than any document), the folded rows and the score rows must be equal.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from contamray.corpus import pieces
from contamray.methods.base import get_method
from contamray.pipeline.actors import Scanner
from contamray.presets import method_params
from contamray.records import Record

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
MAX_BYTES = 200_000
LONG_BYTES = 3_000_000
SPLIT = ("gpt3_13gram", "ngram13", "gpt2_8gram", "ngram8", "palm", "exact_match", "gpt4_substring", "llama2_tokens")
WHOLE = ("meteor_recall", "platypus_embedding", "llm_decontaminator")  # declare no window: matched whole
FILLER = ("ba", "ce", "do", "fu", "ga", "hi", "jo", "ku", "le", "mo", "ni", "po", "qu", "re", "sa", "ti")
ITEM = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "bo", "di", "fa", "gu", "he", "ju")


def _text(rng: random.Random, n: int, syllables: tuple[str, ...]) -> str:
    return " ".join("".join(rng.choice(syllables) for _ in range(3)) for _ in range(n))


RNG = random.Random(316)
TEMPLATE = _text(RNG, 14, ITEM)


def _record(rid: str, input: str, label: str) -> Record:
    return Record(id=rid, partition="bench/test", input=input, label=label, reference=input, task="question_answering")


RECORDS = [
    _record(f"r{i}", inp, _text(RNG, 5, ITEM))
    for i, inp in enumerate(
        [
            _text(RNG, 30, ITEM),
            _text(RNG, 24, ITEM) + ", with punctuation; and Ünïcödé!",
            f"{TEMPLATE} {_text(RNG, 10, ITEM)}",
            f"{TEMPLATE} {_text(RNG, 10, ITEM)}",
            _text(RNG, 9, ITEM),  # shorter than 13 words: matched whole by the 13-gram presets
            _text(RNG, 60, ITEM),
        ]
    )
]
UNPLANTED = _record("nowhere", _text(RNG, 30, ITEM), "x")


def _copy(record: Record) -> str:
    return f"{record.input}\n{record.label}"


def _long_document(rng: random.Random, size: int) -> str:
    """Filler words with a planted item across every cut ``split_document`` will make (ASCII text: a cut
    falls at the first whitespace ``MAX_BYTES`` characters after the previous one); items rotate, and so
    does how far into the item the cut falls (always before its last word)."""
    filler = _text(rng, size // 7 + MAX_BYTES, FILLER)
    parts: list[str] = []
    length, cut, k = 0, 0, 0
    while length < size:
        item = _copy(RECORDS[[0, 1, 2, 5, 4][k % 5]])
        last_space = max(item.rfind(" "), item.rfind("\n"))
        into = (k * 37) % last_space + 1  # the cut falls this many characters into the item
        start = cut + MAX_BYTES - into  # where the item starts
        gap = start - length
        parts += [filler[length : length + gap - 1], " ", item, " "]  # filler words, maybe one cut short
        length = start + len(item) + 1
        cut = start + into + re.compile(r"\s").search(item, into).start() - into
        k += 1
    return "".join(parts)


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    rng = random.Random(5)
    long = _long_document(rng, LONG_BYTES)
    assert LONG_BYTES <= len(long.encode()) < LONG_BYTES + MAX_BYTES
    short = [{"doc_id": f"s{i}", "text": f"{_text(rng, 20, FILLER)} {_copy(r)}"} for i, r in enumerate(RECORDS)]
    second = _long_document(random.Random(6), 500_000)
    return [{"doc_id": "book", "text": long}, *short, {"doc_id": "tome", "text": second}]


def _config(name: str) -> tuple[Any, Any]:
    params = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    method = get_method(params.pop("method"))
    return method, method.make_config(method_params(params, method.Config))  # without ${run.seed}: the default


def _scan(method: Any, cfg: Any, index: Any, docs: list[dict[str, Any]], max_bytes: int) -> list[dict[str, Any]]:
    ((_, rows, _),) = Scanner([("cell", method, cfg, index)], max_bytes)(docs)
    return rows


@pytest.mark.parametrize("name", SPLIT)
def test_pieces_give_the_whole_documents_results(name: str, docs: list[dict[str, Any]]):
    method, cfg = _config(name)
    records = [*RECORDS, UNPLANTED]
    index = method.build_index(records, cfg)
    window = method.window(cfg, index)
    assert window is not None
    cut = pieces.split_document(docs[0], MAX_BYTES, window)
    assert len(cut) == 16 and all(len(p["text"].encode()) < MAX_BYTES + 4096 for p in cut)
    whole = _scan(method, cfg, index, docs, max_bytes=10 * LONG_BYTES)
    split = _scan(method, cfg, index, docs, max_bytes=MAX_BYTES)
    assert split == whole
    rows = method.score(records, split, cfg)
    assert rows == method.score(records, whole, cfg)
    found = {r["record_id"]: r for r in rows}
    assert found["r0"]["contaminated"] and found["r5"]["contaminated"] and not found["nowhere"]["contaminated"]
    assert found["r0"]["n_docs"] == 3  # the two long documents and its short one, each counted once


def test_every_cut_lies_inside_a_planted_item(docs: list[dict[str, Any]]):
    """The test document does what it says: every cut (where a piece's owned part ends) falls inside a
    planted copy, so windows across it are found only if the pieces overlap."""
    text = docs[0]["text"]
    copies = [(m.start(), m.end()) for r in RECORDS for m in re.finditer(re.escape(_copy(r)), text)]
    inner = pieces.cut_points(text, MAX_BYTES, "space")[1:-1]
    assert len(inner) == 15
    assert all(any(a < cut < b for a, b in copies) for cut in inner)


@pytest.mark.parametrize("name", ["ngram13", "gpt4_substring", "llama2_tokens", "exact_match"])
def test_pieces_own_every_unit_once(name: str, docs: list[dict[str, Any]]):
    """The owned parts tile the document: their units add up to the whole's, in order."""
    method, cfg = _config(name)
    window = method.window(cfg, method.build_index(RECORDS, cfg))
    doc = docs[-1]
    cut = pieces.split_document(doc, 50_000, window)
    assert len(cut) >= 9
    total = window.count(doc["text"])
    position = 0
    for piece in cut:
        base, lo, hi = piece[pieces.PIECE]
        assert base + lo == position and hi > lo and lo >= min(window.before, position)
        position += hi - lo
        assert window.count(piece["text"]) - hi >= min(window.after, total - position)  # its tail
    assert position == total


@pytest.mark.parametrize("name", WHOLE)
def test_methods_without_a_window_match_documents_whole(name: str):
    method, cfg = _config(name)
    assert method.window(cfg, None) is None


def test_short_documents_and_no_cut_point_stay_whole():
    window = pieces.Window("chars", len, after=3)
    doc = {"doc_id": "a", "text": "x" * 1000}
    assert pieces.split_document(doc, 100, window) == [doc]  # no whitespace to cut at
    small = {"doc_id": "b", "text": "a b c"}
    assert pieces.split_document(small, 100, window) == [small]
    assert [list(b) for b in pieces.batches([small, doc], 100, window)] == [[small, doc]]


def test_batches_are_bounded_by_bytes_and_by_documents_and_read_streams_lazily():
    docs = [{"doc_id": str(i), "text": "é" * 30} for i in range(7)]  # 60 UTF-8 bytes each
    assert [len(b) for b in pieces.batches(docs, 100, None)] == [2, 2, 2, 1]  # a batch ends at >= 100 bytes
    assert [len(b) for b in pieces.batches(docs, 10_000, None, max_docs=3)] == [3, 3, 1]
    read: list[str] = []

    def stream():
        for doc in docs:
            read.append(doc["doc_id"])
            yield doc

    first = next(pieces.batches(stream(), 10_000, None, max_docs=3))
    assert [d["doc_id"] for d in first] == read == ["0", "1", "2"]  # nothing read past the first batch
