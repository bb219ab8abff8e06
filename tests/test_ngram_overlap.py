"""n-gram overlap (GPT-2 / GPT-3 style) on a corpus with planted benchmark items whose answer is known.

The corpus is XSum documents (BBC articles) from the benchmark mirror used as filler, with GSM8K and
ARC-Challenge examples planted into it: verbatim (input + label: found as input_and_label), question
only (found as input_only), near-misses (every 5th word changed, so no 8- or 13-gram survives: not
found), a 10-word span (found by 8-grams, not by 13-grams), a 9-word example (matched whole) and a
6-word example (too short to be checked, as in GPT-3 App. C). It is written as jsonl, jsonl.gz,
parquet and text files and read both with ``iter_documents`` and through Ray Data.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contamray.corpus import iter_documents, read_corpus
from contamray.methods.base import get_method
from contamray.methods.open import ngram_overlap as ngo
from contamray.metrics import ngrams as ng
from contamray.metrics import rolling
from contamray.records import Record

GSM = "openai/gsm8k/main/test.jsonl"
ARC = "allenai/ai2_arc/ARC-Challenge/test.jsonl"
XSUM = "EdinburghNLP/xsum/default/test.jsonl"
GSM_PART = "gsm8k/main/test"
ARC_PART = "arc_challenge/ARC-Challenge/test"
ARC_ROWS = (0, 1, 2, 3, 6, 7, 15, 218)  # 15: 9 words in all (matched whole); 218: 6 words (too short)


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _arc_answer(row: dict) -> str:
    return row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]


def _records(mirror: Path) -> dict[str, Record]:
    records = {}
    for i, row in enumerate(_jsonl(mirror / GSM)[:12]):
        records[f"gsm{i}"] = Record(
            id=f"gsm8k/{i}",
            partition=GSM_PART,
            input=row["question"],
            label=row["answer"],
            reference=row["question"],
            task="question_answering",
        )
    arc = _jsonl(mirror / ARC)
    for i in ARC_ROWS:
        row = arc[i]
        records[f"arc{i}"] = Record(
            id=row["id"],
            partition=ARC_PART,
            input=row["question"],
            label=_arc_answer(row),
            reference=row["question"],
            task="multiple_choice",
            choices=tuple(row["choices"]["text"]),
            answer=row["answerKey"],
        )
    return records


def verbatim(r: Record) -> str:
    return f"{r.input}\n{r.label}"


def near_miss(r: Record) -> str:
    """Every 5th normalised word of input + label replaced, so no window of >= 5 words survives."""
    words = ng.words(verbatim(r))
    for i in range(4, len(words), 5):
        words[i] = "quux" if words[i] != "quux" else "quuz"
    return " ".join(words)


# doc index -> (record key, how it is planted); filler doc i is XSum row 200 + i
PLANTS = {
    2: ("gsm0", "verbatim"),
    5: ("gsm3", "input_only"),
    7: ("gsm5", "near_miss"),
    9: ("gsm9", "span10"),
    21: ("gsm1", "verbatim"),
    22: ("gsm2", "verbatim"),
    25: ("gsm2", "verbatim"),
    27: ("gsm4", "input_only"),
    30: ("gsm6", "near_miss"),
    41: ("arc0", "verbatim"),
    44: ("arc2", "near_miss"),
    45: ("arc218", "verbatim"),
    52: ("arc1", "input_only"),
    55: ("arc15", "verbatim"),
}
N_DOCS = 60


def _planted_text(filler: str, record: Record, how: str) -> str:
    """Verbatim / near-miss / span go after the first paragraph; input-only ends the document, so no
    label (or filler that could start like the label) follows the question."""
    if how == "input_only":
        return f"{filler}\n{record.input}"
    head, _, tail = filler.partition("\n")
    if how == "verbatim":
        middle = verbatim(record)
    elif how == "near_miss":
        middle = near_miss(record)
    else:  # span10: 10 consecutive words from the middle of the question
        middle = " ".join(ng.words(record.input)[5:15])
    return f"{head}\n{middle}\n{tail}"


def build_corpus(mirror: Path, records: dict[str, Record], root: Path) -> dict[int, str]:
    """Write the corpus; returns doc index -> document text."""
    filler = [row["document"] for row in _jsonl(mirror / XSUM)[200 : 200 + N_DOCS]]
    texts = {}
    for i, text in enumerate(filler):
        if i in PLANTS:
            key, how = PLANTS[i]
            text = _planted_text(text, records[key], how)
        texts[i] = text
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "part-0.jsonl", "w", encoding="utf-8") as f:
        for i in range(0, 20):
            f.write(json.dumps({"text": texts[i], "source": "xsum"}) + "\n")
            if i == 3:
                f.write('{"text": "a broken line\n')  # not JSON: skipped and reported
            if i == 11:
                f.write(json.dumps({"body": "no text field here"}) + "\n")  # skipped and reported
    with gzip.open(root / "part-1.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(20, 40):
            f.write(json.dumps({"text": texts[i]}) + "\n")
    pq.write_table(pa.table({"text": [texts[i] for i in range(40, 50)]}), root / "part-2.parquet")
    (root / "texts").mkdir(exist_ok=True)
    for i in range(50, N_DOCS):
        (root / "texts" / f"doc-{i}.txt").write_text(texts[i], encoding="utf-8")
    return texts


@pytest.fixture(scope="module")
def planted(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    records = _records(mirror_dir)
    root = tmp_path_factory.mktemp("corpus")
    texts = build_corpus(mirror_dir, records, root)
    docs = list(iter_documents(root))
    return {"records": records, "root": root, "texts": texts, "docs": docs}


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def run(records: list[Record], docs: list[dict], **params) -> tuple[list[dict], dict[str, dict], object]:
    method = get_method("ngram_overlap")
    cfg = method.make_config(params)
    index = method.build_index(records, cfg)
    matches = []
    for start in range(0, len(docs), 16):  # batches, as the pipeline sends them
        matches.extend(method.match(docs[start : start + 16], index, cfg))
    table = method.score(records, matches, cfg)
    return matches, {row["record_id"]: row for row in table}, cfg


# --------------------------------------------------------------------------- hashing and words


def _window_reference(w: np.ndarray, j: int, n: int) -> int:
    """``mix64(sum_k w[j+k] * B**k + n)`` mod 2**64 in plain Python ints."""
    mod = 1 << 64
    raw = sum(int(w[j + k]) * pow(rolling.BASE, k, mod) for k in range(n)) % mod
    return rolling.mix64_int((raw + n) % mod)


def test_window_hashes_are_the_mixed_polynomial_of_the_word_hashes():
    rng = np.random.default_rng(0)
    w = rng.integers(0, 2**64, size=3000, dtype=np.uint64)
    for n in (1, 3, 4, 5, 8, 12, 13, 17):
        got = ng.window_hashes(w, n)
        assert got.dtype == np.uint64 and got.shape == (len(w) - n + 1,)
        for j in (0, 1, 777, len(got) - 1):
            assert int(got[j]) == _window_reference(w, j, n)
        # the same content hashes the same wherever it is
        assert int(ng.window_hashes(w[100 : 100 + n], n)[0]) == int(got[100])
    assert ng.window_hashes(w[:5], 13).shape == (0,)
    assert len(set(ng.window_hashes(w, 8).tolist())) == len(w) - 7  # no collisions among 2993


def test_word_hashes_are_the_reference_word_hash():
    text = "Janet’s ducks lay 16 eggs, per day!"
    assert ng.words(text) == ["janets", "ducks", "lay", "16", "eggs", "per", "day"]
    assert ng.word_hashes(text).tolist() == [ng.word_hash(w.encode()) for w in ng.words(text)]
    assert ng.word_hash(b"ab") != ng.word_hash(b"ba") and ng.word_hash(b"a") != ng.word_hash(b"a\x00")


def test_token_batch_equals_one_document_at_a_time(mirror_dir: Path):
    texts = [row["document"] for row in _jsonl(mirror_dir / XSUM)[:50]] + ["", "  ", "café ÉTÉ ½ — x"]
    batch = ng.TokenBatch(texts, "gpt3")
    for d, text in enumerate(texts):
        hashes, words = ng.word_hashes_and_words(text, "gpt3")
        assert batch.hashes[d].tolist() == hashes.tolist()
        assert batch.words[d][:] == words and len(batch.words[d]) == len(words)
        assert batch.words[d][2:5] == words[2:5]
    windows = batch.windows(8)
    assert windows.hashes.tolist() == ng.hash_windows(batch.hashes, 8).hashes.tolist()


def test_normalisations_follow_the_papers():
    text = "Don't stop: the U.S. state-of-the-art\u00a0CAFÉ_bar costs $3.50!"
    # GPT-3: lowercase, punctuation deleted, split on whitespace
    assert ng.words(text, "gpt3") == ["dont", "stop", "the", "us", "stateoftheart", "cafébar", "costs", "350"]
    # GPT-2: lower-cased alphanumeric words, everything else a delimiter
    assert ng.words(text, "gpt2") == [
        "don", "t", "stop", "the", "u", "s", "state", "of", "the", "art", "café", "bar", "costs", "3", "50",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown normalization"):
        ng.words(text, "gpt4")


def test_fast_word_path_equals_the_reference_regexes(mirror_dir: Path):
    texts = [
        json.dumps(row, ensure_ascii=False)
        for rel in (GSM, ARC, XSUM, "truthfulqa/truthful_qa/generation/validation.jsonl")
        for row in _jsonl(mirror_dir / rel)[:400]
    ]
    texts += ["", "  \t", "!!!", "a\x1cb\x00c", "İstanbul ﬁne ½ x² 日本語、句読点。\u2028next"]
    for style in ng.NORMALIZATIONS:
        for text in texts:
            assert [w.decode() for w in ng._word_bytes(text, style)] == ng.words(text, style)


def test_batch_windows_never_cross_documents():
    a, b = ng.word_hashes("one two three four five"), ng.word_hashes("six seven eight")
    hashes, doc, offset = ng.batch_windows([a, ng.word_hashes(""), b], 3)
    assert doc.tolist() == [0, 0, 0, 2]
    assert offset.tolist() == [0, 1, 2, 0]
    assert hashes.tolist() == ng.window_hashes(a, 3).tolist() + ng.window_hashes(b, 3).tolist()


# --------------------------------------------------------------------------- the benchmark side


def _rec(rid: str, input: str, label: str, partition: str = "p") -> Record:
    return Record(
        id=rid, partition=partition, input=input, label=label, reference=input, task="question_answering"
    )


def test_regions_follow_the_datatrove_worked_example():
    cfg = ngo.NGramOverlapConfig(n=4, min_words=1)
    grams = ngo.example_grams(_rec("r", "A B C D E", "F G"), cfg)
    want = {
        "input": {"a b c d", "b c d e"},
        "label": set(),
        "overlap": {"c d e f", "d e f g"},
    }
    for region, hashes in zip(ngo.REGIONS, grams.hashes, strict=True):
        expected = {int(ng.ngram_hashes(g, 4)[0]) for g in want[region]}
        assert set(hashes.tolist()) == expected, region
    assert grams.status == ngo.STATUS_NGRAMS and grams.counts == (2, 0, 2)


def test_short_examples_follow_gpt3():
    cfg = ngo.NGramOverlapConfig()  # n=13, min_words=8, short_examples="whole"
    whole = ngo.example_grams(_rec("r", "at which temperature does water freeze", "0 degrees Celsius"), cfg)
    assert whole.status == ngo.STATUS_WHOLE and whole.gram_len == 9 and whole.counts == (0, 0, 1)
    short = ngo.example_grams(_rec("r", "Which is a renewable resource?", "trees"), cfg)
    assert short.status == ngo.STATUS_TOO_SHORT and short.counts == (0, 0, 0)
    skipped = ngo.example_grams(
        _rec("r", "at which temperature does water freeze", "0 degrees Celsius"),
        ngo.NGramOverlapConfig(short_examples="skip"),
    )
    assert skipped.status == ngo.STATUS_TOO_SHORT
    assert ngo.example_grams(_rec("r", "?!", ""), cfg).status == ngo.STATUS_EMPTY


def test_index_is_compact_and_survives_pickling(planted):
    records = list(planted["records"].values())
    cfg = ngo.NGramOverlapConfig()
    index = ngo.build_index(records, cfg)
    assert set(index.tables) == {13, 9}  # 13-grams, plus the one 9-word example matched whole
    table = index.tables[13]
    assert table.keys.dtype == np.uint64 and np.all(np.diff(table.keys.astype(np.float64)) >= 0)
    assert len(np.unique(table.keys)) == len(table.keys)
    docs = planted["docs"]
    before = ngo.match(docs, index, cfg)
    index.lookup(13, table.keys[:3])  # builds this process's lookup tables
    assert index._finders
    clone = pickle.loads(pickle.dumps(index))
    assert clone._finders == {}
    assert ngo.match(list(docs), clone, cfg) == before
    assert len(pickle.dumps(index)) < 64 * index.n_grams + 4096


# --------------------------------------------------------------------------- the planted corpus


def test_corpus_reads_every_filler_document(planted):
    docs = planted["docs"]
    assert len(docs) == N_DOCS  # the broken line and the row without text were skipped
    assert {d["text"] for d in docs} == set(planted["texts"].values())


def _expect_full(row: dict) -> None:
    assert row["contaminated"] and row["contamination_type"] == "input_and_label"
    assert row["matched_input"] == row["n_input_ngrams"] > 0
    assert row["matched_label"] == row["n_label_ngrams"]
    assert row["matched_overlap"] == row["n_overlap_ngrams"] > 0
    assert row["fraction_matched"] == 1.0


def _expect_input_only(row: dict) -> None:
    assert row["contaminated"] and row["contamination_type"] == "input_only"
    assert row["matched_input"] == row["n_input_ngrams"] > 0
    assert row["matched_label"] == row["matched_overlap"] == 0


def _expect_clean(row: dict) -> None:
    assert not row["contaminated"] and row["contamination_type"] == "clean"
    assert row["matched_total"] == 0 and row["n_docs"] == 0 and row["doc_ids"] == []


def test_planted_items_found_with_13_grams(planted):
    recs = planted["records"]
    matches, rows, cfg = run(list(recs.values()), planted["docs"])
    by_key = {key: rows[r.id] for key, r in recs.items()}
    for key in ("gsm0", "gsm1", "gsm2", "arc0"):
        _expect_full(by_key[key])
        assert by_key[key]["n_label_ngrams"] > 0 or key == "arc0"  # ARC's answer is < 13 words
    for key in ("gsm3", "gsm4", "arc1"):
        _expect_input_only(by_key[key])
    # the 9-word ARC example, matched as a whole (GPT-3 Sec. 4)
    whole = by_key["arc15"]
    assert whole["status"] == "whole_example" and whole["ngram_len"] == 9
    assert (whole["n_ngrams"], whole["matched_overlap"]) == (1, 1)
    assert whole["contamination_type"] == "input_and_label"
    # planted verbatim but 6 words long: not checked (GPT-3 App. C), counted clean
    short = by_key["arc218"]
    assert short["status"] == "too_short" and short["n_ngrams"] == 0
    _expect_clean(short)
    # near-misses, the 10-word span and everything not planted
    for key in ("gsm5", "gsm6", "arc2", "gsm9", "gsm7", "gsm8", "gsm10", "gsm11", "arc3", "arc6", "arc7"):
        _expect_clean(by_key[key])
    # evidence: which documents
    doc_ids = [d["doc_id"] for d in planted["docs"]]
    texts = [d["text"] for d in planted["docs"]]
    docs_of = {
        key: sorted(doc_ids[texts.index(planted["texts"][i])] for i, (k, _) in PLANTS.items() if k == key)
        for key in ("gsm0", "gsm2", "arc15")
    }
    assert by_key["gsm2"]["n_docs"] == 2 and by_key["gsm2"]["doc_ids"] == docs_of["gsm2"]
    assert by_key["gsm0"]["doc_ids"] == docs_of["gsm0"]
    assert by_key["arc15"]["evidence"] == ["at which temperature does water freeze 0 degrees celsius"]
    assert docs_of["arc15"][0].endswith("doc-55.txt")
    # word offset of the first input 13-gram of gsm0: right after the filler's first paragraph
    first = min(
        (m for m in matches if m["record_id"] == recs["gsm0"].id and m["region"] == "input"),
        key=lambda m: m["doc_offset"],
    )
    head = planted["texts"][2].partition("\n")[0]
    assert first["doc_offset"] == len(ng.words(head))
    assert first["ngram"] == " ".join(ng.words(recs["gsm0"].input)[:13])
    # one match row per distinct (record, doc, n-gram, region)
    keys = [(m["record_id"], m["doc_id"], m["ngram_hash"], m["region"]) for m in matches]
    assert len(keys) == len(set(keys))


def test_partition_verdicts(planted):
    recs = planted["records"]
    _, rows, cfg = run(list(recs.values()), planted["docs"])
    method = get_method("ngram_overlap")
    gsm = method.reduce([r for r in rows.values() if r["partition"] == GSM_PART], cfg)
    assert (gsm.n_examples, gsm.n_failed, gsm.p_value) == (12, 0, None)
    assert gsm.rate == pytest.approx(5 / 12) and gsm.statistic == gsm.rate and gsm.contaminated
    assert gsm.details["n_input_only"] == 2 and gsm.details["n_input_and_label"] == 3
    assert gsm.details["input_only_rate"] == pytest.approx(2 / 12)
    assert gsm.details["input_and_label_rate"] == pytest.approx(3 / 12)
    arc = method.reduce([r for r in rows.values() if r["partition"] == ARC_PART], cfg)
    assert arc.rate == pytest.approx(3 / 8)
    assert (arc.details["n_input_only"], arc.details["n_input_and_label"]) == (1, 2)
    assert (arc.details["n_too_short"], arc.details["n_whole_example"]) == (1, 1)
    # GPT-2's statistic: the share of the partition's n-grams found
    gsm_rows = [r for r in rows.values() if r["partition"] == GSM_PART]
    want = 100 * sum(r["matched_total"] for r in gsm_rows) / sum(r["n_ngrams"] for r in gsm_rows)
    assert gsm.details["ngram_overlap_pct"] == pytest.approx(want)
    # a threshold above the rate clears the partition
    strict = method.make_config({"partition_threshold": 0.5})
    assert not method.reduce(gsm_rows, strict).contaminated
    with pytest.raises(ValueError, match="one partition at a time"):
        method.reduce(list(rows.values()), cfg)


def test_8_grams_find_the_10_word_span_13_grams_do_not(planted):
    recs = planted["records"]
    gsm9 = recs["gsm9"]
    _, rows13, _ = run([gsm9], planted["docs"], n=13)
    _expect_clean(rows13[gsm9.id])
    _, rows8, _ = run(list(recs.values()), planted["docs"], n=8)
    row = rows8[gsm9.id]
    assert row["contamination_type"] == "input_only"
    assert row["matched_input"] == 10 - 8 + 1 and row["matched_label"] == row["matched_overlap"] == 0
    by_key = {key: rows8[r.id] for key, r in recs.items()}
    for key in ("gsm0", "gsm1", "gsm2", "arc0"):
        _expect_full(by_key[key])
    for key in ("gsm3", "gsm4", "arc1"):
        _expect_input_only(by_key[key])
    # with n=8 the 9-word example has two 8-grams, both spanning question and answer
    arc15 = by_key["arc15"]
    assert (arc15["status"], arc15["n_overlap_ngrams"], arc15["matched_overlap"]) == ("ngrams", 2, 2)
    for key in ("gsm5", "gsm6", "arc2", "gsm7", "gsm8", "gsm10", "gsm11", "arc3", "arc6", "arc7", "arc218"):
        _expect_clean(by_key[key])


def test_ray_data_pipeline_gives_the_same_matches(planted, ray_local):
    ray = ray_local
    records = list(planted["records"].values())
    method = get_method("ngram_overlap")
    cfg = method.make_config({})
    index_ref = ray.put(method.build_index(records, cfg))

    def match_batch(batch: dict[str, np.ndarray]) -> dict[str, list[str]]:
        docs = [
            {"doc_id": str(d), "text": str(t)} for d, t in zip(batch["doc_id"], batch["text"], strict=True)
        ]
        rows = method.match(docs, ray.get(index_ref), cfg)
        return {"match": [json.dumps(r, sort_keys=True) for r in rows]}

    dataset = read_corpus(str(planted["root"]))
    assert dataset.count() == N_DOCS
    via_ray = dataset.map_batches(match_batch, batch_size=8).take_all()
    direct, rows, _ = run(records, planted["docs"])
    assert sorted(r["match"] for r in via_ray) == sorted(json.dumps(m, sort_keys=True) for m in direct)
    assert method.score(records, [json.loads(r["match"]) for r in via_ray], cfg) == list(rows.values())


# --------------------------------------------------------------------------- edge cases and options


def test_example_split_across_two_documents_is_not_found():
    words = [f"w{i}" for i in range(20)]
    record = _rec("r", " ".join(words), "")
    cfg = ngo.NGramOverlapConfig(label_fields=())
    index = ngo.build_index([record], cfg)
    split = [
        {"doc_id": "a", "text": "x " + " ".join(words[:10])},
        {"doc_id": "b", "text": " ".join(words[10:])},
    ]
    assert ngo.match(split, index, cfg) == []
    joined = [{"doc_id": "c", "text": "x " + " ".join(words)}]
    found = ngo.match(joined, index, cfg)
    assert len(found) == 20 - 13 + 1 and {m["doc_offset"] for m in found} == set(range(1, 9))


def test_repeated_ngram_is_one_row_with_its_count():
    record = _rec("r", "alpha beta gamma delta", "epsilon")
    cfg = ngo.NGramOverlapConfig(n=3, min_words=1)
    index = ngo.build_index([record], cfg)
    rows = ngo.match([{"doc_id": "d", "text": "alpha beta gamma. Alpha, beta gamma!"}], index, cfg)
    assert [(m["region"], m["occurrences"], m["doc_offset"]) for m in rows] == [("input", 2, 0)]


def test_lone_surrogate_in_a_document_does_not_fail_the_batch():
    record = _rec("r", "alpha beta gamma delta", "")
    cfg = ngo.NGramOverlapConfig(n=3, min_words=1, label_fields=())
    index = ngo.build_index([record], cfg)
    docs = [{"doc_id": "d", "text": "x\ud800y alpha beta gamma"}]
    assert [m["ngram"] for m in ngo.match(docs, index, cfg)] == ["alpha beta gamma"]


def test_min_matches_and_max_doc_frequency():
    record = _rec("r", "one two three four five six", "")
    docs = [{"doc_id": f"d{i}", "text": "one two three"} for i in range(3)]
    docs.append({"doc_id": "d3", "text": "four five six"})
    base = {"n": 3, "min_words": 1, "label_fields": []}
    _, rows, _ = run([record], docs, **base)
    assert rows["r"]["matched_total"] == 2 and rows["r"]["contaminated"]
    _, rows, _ = run([record], docs, **base, min_matches=3)
    assert not rows["r"]["contaminated"] and rows["r"]["contamination_type"] == "clean"
    # "one two three" is in 3 documents: dropped when more than 2 are allowed (GPT-3's filtering rule)
    _, rows, _ = run([record], docs, **base, max_doc_frequency=2)
    assert rows["r"]["matched_total"] == 1 and rows["r"]["doc_ids"] == ["d3"]


def test_empty_example_is_an_error_row_counted_as_failed():
    records = [_rec("ok", " ".join(f"w{i}" for i in range(15)), "x"), _rec("bad", "...", "")]
    _, rows, cfg = run(records, [{"doc_id": "d", "text": "nothing here"}])
    assert "has no words" in rows["bad"]["error"] and "'bad'" in rows["bad"]["error"]
    verdict = ngo.reduce(list(rows.values()), cfg)
    assert (verdict.n_examples, verdict.n_failed, verdict.rate, verdict.contaminated) == (2, 1, 0.0, False)


def test_bad_config_and_mismatched_index_are_named():
    method = get_method("ngram_overlap")
    with pytest.raises(ValueError, match="unknown parameter"):
        method.make_config({"ngram": 13})
    with pytest.raises(ValueError, match="n=0"):
        method.make_config({"n": 0})
    with pytest.raises(ValueError, match="not a text field"):
        method.make_config({"input_fields": ["question"]})
    cfg13, cfg8 = method.make_config({}), method.make_config({"n": 8})
    index = method.build_index([_rec("r", "a b c d e f g h i j k l m n", "")], cfg13)
    with pytest.raises(ValueError, match="built with n=13"):
        method.match([{"doc_id": "d", "text": "x"}], index, cfg8)
    with pytest.raises(TypeError, match="'d'"):
        method.match([{"doc_id": "d", "text": None}], index, cfg13)
    assert method.family == "open"


# --------------------------------------------------------------------------- GPT-3's frequent n-grams, PaLM


def _docs_with(gram: str, n_docs: int, prefix: str) -> list[dict]:
    return [{"doc_id": f"{prefix}{i}", "text": f"filler {i} words {gram} more filler"} for i in range(n_docs)]


def test_gpt3_ignores_13_grams_in_more_than_10_documents():
    """GPT-3 App. C: "We ignored 13-grams that matched more than 10 training documents"."""
    common = "the quick brown fox jumps over the lazy dog while the cat sleeps soundly"  # 14 words
    rare = "seven green parrots recite poetry beneath an old oak tree every single afternoon"  # 13 words
    record = _rec("r", f"{common} {rare}", "")
    cfg = ngo.NGramOverlapConfig(n=13, label_fields=(), max_doc_frequency=10)
    eleven = _docs_with(common, 11, "c") + [{"doc_id": "rare", "text": rare}]
    _, rows, _ = run([record], eleven, n=13, label_fields=[], max_doc_frequency=10)
    row = rows["r"]
    # the two 13-grams of `common` are in 11 documents: ignored; `rare` (one 13-gram) counts
    assert (row["matched_total"], row["doc_ids"], row["contaminated"]) == (1, ["rare"], True)
    assert row["evidence"] == [rare]
    ten = _docs_with(common, 10, "c")
    _, rows, _ = run([record], ten, n=13, label_fields=[], max_doc_frequency=10)
    assert rows["r"]["matched_total"] == 2 and rows["r"]["n_docs"] == 10  # exactly 10: kept
    # the streamed count: one process emits rows for at most 11 documents of an n-gram, however many
    index = ngo.build_index([record], cfg)
    many = _docs_with(common, 40, "c")
    matches = [m for start in range(0, 40, 8) for m in ngo.match(many[start : start + 8], index, cfg)]
    assert len({m["doc_id"] for m in matches}) == 11
    assert ngo.score([record], matches, cfg)[0]["matched_total"] == 0
    # without the rule (the default), every document counts
    _, rows, _ = run([record], many, n=13, label_fields=[])
    assert rows["r"]["n_docs"] == 40 and rows["r"]["matched_total"] == 2


def test_doc_frequency_count_is_exact_across_workers_and_chunks():
    """Two workers each see 6 of 12 documents: neither is over the limit alone, the rows together are."""
    gram = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu"
    record = _rec("r", gram, "")
    cfg = ngo.NGramOverlapConfig(n=13, label_fields=(), max_doc_frequency=10)
    docs = _docs_with(gram, 12, "d")
    worker_a, worker_b = ngo.build_index([record], cfg), ngo.build_index([record], cfg)  # two processes
    matches = ngo.match(docs[:6], worker_a, cfg) + ngo.match(docs[6:], worker_b, cfg)
    assert len(matches) == 12
    assert ngo.score([record], matches, cfg)[0]["contaminated"] is False


def test_palm_needs_70_percent_of_the_8_grams():
    words = [f"w{i}" for i in range(20)]  # 13 8-grams
    record = _rec("r", " ".join(words), "")
    for covered, dirty in ((17, True), (15, False)):  # 10 of 13 = 77 %; 8 of 13 = 62 %
        docs = [{"doc_id": "d", "text": " ".join(words[:covered])}]
        _, rows, _ = run([record], docs, n=8, label_fields=[], min_fraction=0.7, min_words=1)
        assert rows["r"]["matched_total"] == covered - 7 and rows["r"]["contaminated"] is dirty
    with pytest.raises(ValueError, match="min_fraction"):
        get_method("ngram_overlap").make_config({"min_fraction": 1.5})


def test_batched_example_grams_equal_one_at_a_time(planted, mirror_dir: Path):
    records = list(planted["records"].values()) + [
        _rec("e", "?!", ""),
        _rec("s", "short one", "x"),
        _rec("l", "", "only a label of nine words in it here"),
    ]
    for row in _jsonl(mirror_dir / "truthfulqa/truthful_qa/generation/validation.jsonl")[:200]:
        records.append(_rec(f"t{len(records)}", row["question"], row["best_answer"]))
    for params in ({}, {"n": 8}, {"n": 4, "min_words": 1}, {"short_examples": "skip"}, {"label_fields": ()}):
        cfg = ngo.NGramOverlapConfig(**params)
        for one, many in zip(
            (ngo.example_grams(r, cfg) for r in records), ngo.example_grams_batch(records, cfg)
        ):
            assert (one.n_words, one.gram_len, one.status) == (many.n_words, many.gram_len, many.status)
            assert [h.tolist() for h in one.hashes] == [h.tolist() for h in many.hashes]
