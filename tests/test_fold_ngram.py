"""``fold`` of the word-level open-data matchers (n-gram overlap and its configs, exact match, Llama 2
tokens): faithful to the one-batch scan, bounded in the number of copies, with known decisions.

The benchmark is made of invented words (no corpus text can collide with it by chance); the corpus has
full copies, a question without its answer, a partial copy (the first 14 words of a question), a
label-only copy, a 13-word phrase in 12 documents (more than GPT-3's 10), a 9-word example (matched
whole by 13-gram configs), and unrelated documents. Pure Python: no Ray, no model.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from contamray.methods.base import get_method
from contamray.methods.open import ngram_overlap as ngo
from contamray.records import Record
from tests.fold_check import assert_fold_bounded, assert_fold_faithful

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "bo", "di", "fa", "gu", "he", "ju")
NGRAM_CONFIGS = ("gpt2_8gram", "gpt3_13gram", "ngram8", "ngram13", "palm")
CLEAN, IO, IL = "clean", "input_only", "input_and_label"


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(SYLLABLES) for _ in range(4)) for _ in range(n)]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(_words(rng, n))


def _rec(rid: str, input: str, label: str) -> Record:
    return Record(id=rid, partition="bench/test", input=input, label=label, reference=input, task="question_answering")


RNG = random.Random(16)
PHRASE = _text(RNG, 13)  # "common boilerplate": 13 words in 12 documents
RECORDS = [
    _rec("full", _text(RNG, 20), _text(RNG, 6)),  # copied whole, three times
    _rec("question", _text(RNG, 30), _text(RNG, 4)),  # its question alone, twice
    _rec("partial", _text(RNG, 20), _text(RNG, 5)),  # its first 14 words, once
    _rec("label", _text(RNG, 16), _text(RNG, 14)),  # its label alone, once
    _rec("frequent", f"{PHRASE} {_text(RNG, 7)}", _text(RNG, 4)),  # only its phrase, in 12 documents
    _rec("short", _text(RNG, 6), _text(RNG, 3)),  # 9 words, copied whole
    _rec("tiny", _text(RNG, 3), _text(RNG, 2)),  # 5 words: never checked
    _rec("clean", _text(RNG, 18), _text(RNG, 5)),  # nowhere
]
BY_ID = {r.id: r for r in RECORDS}


def _whole(r: Record) -> str:
    return f"{r.input}\n{r.label}"


def _corpus() -> list[dict[str, Any]]:
    rng = random.Random(7)
    texts = [f"{_text(rng, 30)} {_whole(BY_ID['full'])} {_text(rng, 20)}" for _ in range(3)]
    texts += [f"{_text(rng, 25)}. {BY_ID['question'].input}" for _ in range(2)]
    texts.append(" ".join(BY_ID["partial"].input.split()[:14]) + f" {_text(rng, 10)}")
    texts.append(f"{_text(rng, 12)} {BY_ID['label'].label} {_text(rng, 12)}")
    texts += [f"{_text(rng, 8)} {PHRASE} {_text(rng, 8)}" for _ in range(12)]
    texts.append(f"{_text(rng, 5)} {_whole(BY_ID['short'])} {_text(rng, 5)}")
    texts.append(_whole(BY_ID["tiny"]))
    texts += [_text(rng, 60) for _ in range(10)]  # unrelated
    ids = rng.sample(range(10_000), len(texts))  # doc_id order is not corpus order
    return [{"doc_id": f"doc{i:05d}", "text": t} for i, t in zip(ids, texts, strict=True)]


def _copies(k: int) -> list[dict[str, Any]]:
    """The benchmark copied ``k`` times (one document per example per copy) and 5 unrelated documents."""
    rng = random.Random(k)
    docs = [{"doc_id": f"c{c:03d}-{r.id}", "text": _whole(r)} for c in range(k) for r in RECORDS]
    return docs + [{"doc_id": f"u{i}", "text": _text(rng, 40)} for i in range(5)]


def _config(name: str, **extra: Any) -> tuple[Any, Any]:
    params = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    method = get_method(params.pop("method"))
    return method, method.make_config({**params, **extra})


def _types(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {row["record_id"]: row["contamination_type"] for row in rows}


# known decisions of each config on the planted corpus; a label-only copy is "label_only", an example
# matched only through the phrase in 12 documents is "frequent_only" under GPT-3's limit of 10
LO, FO = "label_only", "frequent_only"
EXPECTED = {
    "gpt3_13gram": {"full": IL, "question": IO, "partial": IO, "label": LO, "frequent": FO, "short": IL},
    "ngram13": {"full": IL, "question": IO, "partial": IO, "label": LO, "frequent": IO, "short": IL},
    "gpt2_8gram": {"full": IL, "question": IO, "partial": IO, "label": LO, "frequent": IO, "short": IL},
    "ngram8": {"full": IL, "question": IO, "partial": IO, "label": LO, "frequent": IO, "short": IL},
    # PaLM: 70 % of the 8-grams; partial 7 of 18, label 7 of 23, question 23 of 27, frequent 6 of 17
    "palm": {"full": IL, "question": IO, "partial": CLEAN, "label": CLEAN, "frequent": CLEAN, "short": IL},
    # exact match: whole inputs of at least 3 words, so the 3-word input of "tiny" is checked too
    "exact_match": {
        "full": IL,
        "question": IO,
        "partial": CLEAN,
        "label": CLEAN,
        "frequent": CLEAN,
        "short": IL,
        "tiny": IL,
    },
    # Llama 2: Dirty at 80 % of the tokens in spans of 10+; the question is 30 of 34 tokens
    "llama2_tokens": {
        "full": IL,
        "question": IO,
        "partial": CLEAN,
        "label": CLEAN,
        "frequent": CLEAN,
        "short": CLEAN,
    },
}


@pytest.mark.parametrize("name", [*NGRAM_CONFIGS, "exact_match", "llama2_tokens"])
def test_fold_is_faithful_with_known_decisions(name: str):
    method, cfg = _config(name)
    rows = assert_fold_faithful(method, cfg, RECORDS, _corpus(), splits=8, seed=len(name))
    assert _types(rows) == {"tiny": CLEAN, **EXPECTED[name], "clean": CLEAN}


@pytest.mark.parametrize("name", [*NGRAM_CONFIGS, "exact_match", "llama2_tokens"])
@pytest.mark.parametrize("max_evidence", [0, 2])
def test_fold_is_faithful_with_little_evidence(name: str, max_evidence: int):
    method, cfg = _config(name, max_evidence=max_evidence)
    rows = assert_fold_faithful(method, cfg, RECORDS, _corpus(), splits=4, seed=max_evidence)
    assert all(len(row["doc_ids"]) <= max_evidence and len(row["spans"]) <= max_evidence for row in rows)


@pytest.mark.parametrize("name", [*NGRAM_CONFIGS, "exact_match", "llama2_tokens"])
def test_fold_is_bounded_in_the_copies(name: str):
    method, cfg = _config(name)
    assert_fold_bounded(method, cfg, RECORDS, _copies)


def test_counts_are_numbers_and_evidence_the_first_documents():
    method, cfg = _config("ngram13", max_evidence=2)
    index = method.build_index(RECORDS, cfg)
    folded = method.fold(method.match(_copies(60), index, cfg), cfg)
    full = next(row for row in folded if row["record_id"] == "full")
    assert full["n_docs"] == 60 and set(full["gram_docs"]) == {1}
    assert sorted(set(full["hit_doc"])) == ["c000-full", "c001-full"]
    assert len(full["text"]) == 2  # the example's first two texts, no more
    row = next(r for r in method.score(RECORDS, folded, cfg) if r["record_id"] == "full")
    assert (row["n_docs"], row["doc_ids"], row["matched_total"]) == (60, ["c000-full", "c001-full"], 14)
    assert row["spans"] == [
        {"doc_id": "c000-full", "start": 0, "end": 26, "unit": "word"},
        {"doc_id": "c001-full", "start": 0, "end": 26, "unit": "word"},
    ]


def test_gpt3_frequency_limit_across_folds():
    """The phrase's 13-gram is in 12 documents: no fold of 6 sees more than 10, the merge does; the
    count is capped at limit + 1 and the documents matched only through it stop counting."""
    method, cfg = _config("gpt3_13gram")
    phrase_docs = [d for d in _corpus() if PHRASE in d["text"]]
    assert len(phrase_docs) == 12
    halves = [ngo.fold(ngo.match(phrase_docs[i::2], ngo.build_index(RECORDS, cfg), cfg), cfg) for i in range(2)]
    for half in halves:
        (row,) = half
        assert (row["record_id"], row["gram_docs"], row["n_docs"], len(set(row["hit_doc"]))) == ("frequent", [6], 6, 6)
    (merged,) = ngo.fold(halves[0] + halves[1], cfg)
    assert (merged["gram_docs"], merged["n_docs"], merged["hit_doc"], merged["text"]) == ([11], 0, [], [])
    (row,) = [r for r in ngo.score(RECORDS, [merged], cfg) if r["record_id"] == "frequent"]
    assert (row["contaminated"], row["matched_total"], row["n_docs"], row["doc_ids"]) == (False, 0, 0, [])


def test_a_merge_holds_no_hit_of_a_gram_past_the_frequency_limit():
    """Folded one document at a time, the phrase's 12 documents reach the merge as 12 rows: once its gram passes
    the limit (10), the merge drops the hits it held and keeps none of the later rows' - the driver's fold holds
    no hit per copy of a widely copied item (and gives the fold of the whole)."""
    method, cfg = _config("gpt3_13gram")
    docs = [d for d in _corpus() if PHRASE in d["text"]]
    # each document matched by a process of its own (an index counts the documents it has emitted a gram for)
    rows = [row for d in docs for row in ngo.fold(ngo.match([d], ngo.build_index(RECORDS, cfg), cfg), cfg)]
    assert len(rows) == 12
    example = ngo._Example(rows[0]["partition"], limit=cfg.max_doc_frequency)
    held = []
    for row in rows:
        example.add(row)
        held.append(len(example.hits))
    assert held[9] > 0 and held[10:] == [0, 0]
    whole = ngo.fold(ngo.match(docs, ngo.build_index(RECORDS, cfg), cfg), cfg)
    assert ngo.fold(rows, cfg) == whole and (whole[0]["gram_docs"], whole[0]["hit_doc"]) == ([11], [])


def test_score_takes_match_rows_folded_rows_and_arrow_tables_alike():
    method, cfg = _config("gpt3_13gram")
    index = method.build_index(RECORDS, cfg)
    docs = _corpus()
    raw = [method.match(docs[:20], index, cfg), method.match(docs[20:], index, cfg)]
    expected = method.score(RECORDS, raw[0] + raw[1], cfg)
    mixed = method.fold(raw[0], cfg) + raw[1]
    assert method.score(RECORDS, mixed, cfg) == expected
    assert method.fold(mixed, cfg) == method.fold(raw[0] + raw[1], cfg)
    table = pa.Table.from_pylist(method.fold(mixed, cfg))
    assert method.score(RECORDS, table, cfg) == expected


def test_match_rows_without_a_needed_column_are_named():
    method, cfg = _config("ngram13")
    row = method.match(_copies(1), method.build_index(RECORDS, cfg), cfg)[0]
    del row["doc_offset"]
    with pytest.raises(ValueError, match="lacks doc_offset"):
        method.fold([row], cfg)


# --------------------------------------------------------------------------- honest types (issue #16 item 5)


def test_label_share_decides_input_and_label():
    """The question copied with the first 3 of its 20 answer words: 3 overlap 13-grams touch the label,
    which made it input_and_label; 3 of 20 label words (15 %) is input_only at the default 0.5."""
    record = _rec("r", _text(random.Random(1), 20), _text(random.Random(2), 20))
    words = f"{record.input} {record.label}".split()
    docs = [{"doc_id": "d", "text": " ".join(words[:23])}]
    for share, expected in ((0.5, IO), (0.15, IL), (0.2, IO)):
        method, cfg = _config("ngram13", min_label_share=share)
        (row,) = method.score([record], method.match(docs, method.build_index([record], cfg), cfg), cfg)
        assert (row["matched_overlap"], row["matched_input_words"], row["matched_label_words"]) == (3, 20, 3)
        assert row["contamination_type"] == expected
    with pytest.raises(ValueError, match="min_label_share"):
        _config("ngram13", min_label_share=0)


def test_verdict_counts_label_only_and_frequent_only_apart():
    method, cfg = _config("gpt3_13gram")
    index = method.build_index(RECORDS, cfg)
    rows = method.score(RECORDS, method.match(_corpus(), index, cfg), cfg)
    frequent = next(r for r in rows if r["record_id"] == "frequent")
    assert (frequent["contaminated"], frequent["matched_total"], frequent["matched_ignored"]) == (False, 0, 1)
    details = method.reduce(rows, cfg).details
    counts = {k: details[k] for k in ("n_input_only", "n_input_and_label", "n_label_only", "n_frequent_only")}
    assert counts == {"n_input_only": 2, "n_input_and_label": 2, "n_label_only": 1, "n_frequent_only": 1}
    assert details["n_clean"] == 2 and details["n_contaminated"] == 5  # tiny and clean; frequent is neither
    assert details["label_only_rate"] == pytest.approx(1 / 8)


# --------------------------------------------------------------------------- template n-grams (issue #16)

TRNG = random.Random(1216)
TEMPLATE = _text(TRNG, 14)  # a question template both items open with: two 13-grams, seven 8-grams
TEMPLATED = [
    _rec("planted", f"{TEMPLATE} {_text(TRNG, 12)}", _text(TRNG, 4)),  # copied verbatim, twice
    _rec("sibling", f"{TEMPLATE} {_text(TRNG, 12)}", _text(TRNG, 4)),  # nowhere: only its template is found
    _rec("own", _text(TRNG, 26), _text(TRNG, 4)),  # copied verbatim, no template
    _rec("other", _text(TRNG, 26), _text(TRNG, 4)),  # nowhere
]
TEMPLATED_IDS = {r.id: r for r in TEMPLATED}


def _templated_corpus() -> list[dict[str, Any]]:
    rng = random.Random(3)
    texts = [f"{_text(rng, 20)} {_whole(TEMPLATED_IDS['planted'])} {_text(rng, 9)}" for _ in range(2)]
    texts.append(f"{_text(rng, 7)}. {_whole(TEMPLATED_IDS['own'])}")
    texts += [_text(rng, 50) for _ in range(6)]
    return [{"doc_id": f"t{i:02d}", "text": t} for i, t in enumerate(texts)]


# the sibling shares only the template with the planted item: set apart under any-collision rules; PaLM's
# 70 % is out of its reach (7 of its 23 8-grams); with template_min_items null it is found, as in the papers
TEMPLATE_EXPECTED = {
    "gpt3_13gram": ("template_only", IO),
    "ngram13": ("template_only", IO),
    "gpt2_8gram": ("template_only", IO),
    "ngram8": ("template_only", IO),
    "palm": (CLEAN, CLEAN),
}


@pytest.mark.parametrize("name", NGRAM_CONFIGS)
def test_an_item_sharing_only_template_ngrams_is_template_only(name: str):
    method, cfg = _config(name)
    assert cfg.template_min_items == 2  # declared in the method's YAML
    rows = assert_fold_faithful(method, cfg, TEMPLATED, _templated_corpus(), splits=6, seed=3)
    sibling_type, faithful_type = TEMPLATE_EXPECTED[name]
    assert _types(rows) == {"planted": IL, "sibling": sibling_type, "own": IL, "other": CLEAN}
    by_id = {row["record_id"]: row for row in rows}
    assert [by_id[r]["contaminated"] for r in ("planted", "sibling", "own", "other")] == [True, False, True, False]
    # the planted item is dirty on its own n-grams; the template's are counted apart
    n_template = 14 - cfg.n + 1
    assert (by_id["planted"]["matched_template"], by_id["planted"]["n_docs"]) == (n_template, 2)
    assert by_id["planted"]["matched_total"] == by_id["planted"]["n_ngrams"] - n_template
    assert (by_id["sibling"]["matched_total"], by_id["sibling"]["matched_template"]) == (0, n_template)
    if sibling_type == "template_only":  # its evidence: where the template was found
        assert by_id["sibling"]["doc_ids"] == ["t00", "t01"] and by_id["sibling"]["n_docs"] == 2
    # the papers' rule: every n-gram counts
    method, faithful = _config(name, template_min_items=None)
    rows = assert_fold_faithful(method, faithful, TEMPLATED, _templated_corpus(), splits=3, seed=5)
    assert _types(rows) == {"planted": IL, "sibling": faithful_type, "own": IL, "other": CLEAN}
    assert all(row["matched_template"] == 0 for row in rows)


def test_template_only_is_counted_apart_in_the_verdict():
    method, cfg = _config("gpt3_13gram")
    rows = method.score(TEMPLATED, method.match(_templated_corpus(), method.build_index(TEMPLATED, cfg), cfg), cfg)
    verdict = method.reduce(rows, cfg)
    details = verdict.details
    assert (details["n_contaminated"], details["n_template_only"], details["n_clean"]) == (2, 1, 1)
    assert details["template_only_rate"] == pytest.approx(1 / 4) and verdict.rate == pytest.approx(2 / 4)
    assert details["template_min_items"] == 2
    assert details["summary"] == (
        "2 of 4 examples found in the corpus (2 input and label); "
        "1 matched only template n-grams shared with other benchmark items (not counted clean)"
    )


def test_template_grams_are_counted_per_distinct_item():
    """An n-gram repeated inside one item is not a template; held by two items, or three, it is."""
    method, cfg = _config("ngram13")
    phrase = _text(random.Random(9), 13)
    twice = _rec("twice", f"{phrase} {_text(random.Random(10), 3)} {phrase}", _text(random.Random(11), 2))
    index = method.build_index([twice], cfg)
    hits = method.match([{"doc_id": "d", "text": phrase}], index, cfg)
    assert {row["ngram_items"] for row in hits} == {1}
    others = [_rec(f"o{i}", f"{phrase} {_text(random.Random(20 + i), 5)}", "x") for i in range(2)]
    index = method.build_index([twice, *others], cfg)
    hits = method.match([{"doc_id": "d", "text": phrase}], index, cfg)
    assert {row["record_id"]: row["ngram_items"] for row in hits} == {"twice": 3, "o0": 3, "o1": 3}
    with pytest.raises(ValueError, match="template_min_items"):
        _config("ngram13", template_min_items=1)


def test_fold_is_bounded_with_template_grams():
    method, cfg = _config("gpt3_13gram")

    def copies(k: int) -> list[dict[str, Any]]:
        return [{"doc_id": f"c{c:03d}-{r.id}", "text": _whole(r)} for c in range(k) for r in TEMPLATED]

    assert_fold_bounded(method, cfg, TEMPLATED, copies)
