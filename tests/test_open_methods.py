"""Every open-data method on one corpus with planted benchmark items whose truth is known.

The corpus is XSum articles (BBC text, from the benchmark mirror) with GSM8K and ARC-Challenge items
planted into them, read back through ``contamray.corpus`` from jsonl, a truncated jsonl.gz and
parquet files (a broken line, a line of invalid UTF-8 and a row without text are reported and
skipped; the documents after the point where the .gz breaks are lost, the ones before are read).

How items are planted (``PLANTS``):

- ``verbatim``: question, newline, answer (a page copying the benchmark with its answers);
- ``input_only``: the question alone, ending a document (the answer removed);
- ``edited``: question and answer with two words of the question replaced (a light edit);
- ``interleaved``: question and answer with a filler word after every 4th word (a heavier edit:
  no 8 consecutive words survive, every word is still there, in order);
- ``lost``: verbatim, but in the part of the .gz file after it is truncated: never read.

``EXPECTED`` states, per method, which items it must call contaminated and of which type; every
other item must be clean. Why, per method (see each module's docstring for the definitions):

- n-grams (GPT-2 8-grams, GPT-3 13-grams): any shared n-gram: verbatim, input-only and edited items
  (two replaced words leave most n-grams), not the interleaved ones;
- PaLM (>= 70 % of 8-grams): verbatim items; ARC's input-only item (its short answer leaves 35 of 40
  8-grams in the question) but not GSM8K's (the long solution holds most 8-grams); the edited GSM8K
  item (16 of 65 8-grams lost) but not the edited ARC item (16 of 45 lost);
- exact match (whole normalised input): verbatim and input-only items; edits break it;
- Llama-2 token spans (>= 80 % of tokens in spans of >= 10 with <= 4 mismatches): verbatim and
  edited items (the two mismatches sit inside one span), ARC's input-only item (42 of 47 words) but
  not GSM8K's;
- METEOR recall (>= 0.75, gamma 0.8, of the verbalised example): verbatim, edited and interleaved
  items (recall 1, penalty 0.8 * (1/4)**3); ARC's input-only item, not GSM8K's (recall about 0.5);
- GPT-4 substrings: items with a sampled 50-character substring in what is planted: verbatim,
  input-only and edited items (substrings avoiding the replaced words), not interleaved ones; the
  expectation is checked against a brute-force substring search of the processed corpus.
- Platypus embeddings (cosine >= 0.8 of the question and its most similar passage): verbatim,
  input-only and edited questions, not the interleaved one (question and answer on one line with a
  filler word every 4 words: below 0.8); the edited ones are checked against cosines computed
  directly with the model.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contamray.benchmarks import load_records
from contamray.corpus import iter_documents
from contamray.methods.base import Output, get_method
from contamray.methods.open import gpt4_substring, llm_decontaminator
from contamray.records import Record

XSUM = "EdinburghNLP/xsum/default/test.jsonl"
GSM_ROWS = {"g0": 0, "g1": 1, "g2": 2, "g3": 3, "g4": 4, "g5": 5}
ARC_ROWS = {"a0": 0, "a1": 1, "a2": 2, "a3": 3, "a6": 6, "a7": 7, "a8": 8, "a11": 11}
N_DOCS = 18
LINES_PER_DOC = 5
EDIT_AT = {"g2": (15, 23), "a3": (12, 30)}  # whitespace-word positions of the question replaced

# filler document index -> (record key, how it is planted)
PLANTS = {
    1: ("g0", "verbatim"),
    3: ("g1", "input_only"),
    4: ("a0", "verbatim"),
    6: ("g2", "edited"),
    8: ("a1", "input_only"),
    9: ("a2", "interleaved"),
    11: ("a3", "edited"),
    16: ("g3", "lost"),
}
TRUNCATED = range(12, N_DOCS)  # written to a .jsonl.gz that breaks inside document 14

IL, IO = "input_and_label", "input_only"
NGRAM = {"g0": IL, "g1": IO, "g2": IL, "a0": IL, "a1": IO, "a3": IL}
EXPECTED = {
    "gpt2_8gram": NGRAM,
    "gpt3_13gram": NGRAM,
    "palm": {"g0": IL, "g2": IL, "a0": IL, "a1": IO},
    "exact_match": {"g0": IL, "g1": IO, "a0": IL, "a1": IO},
    "llama2_tokens": {"g0": IL, "g2": IL, "a0": IL, "a1": IO, "a3": IL},
    "meteor_recall": {"g0": IL, "g2": IL, "a0": IL, "a1": IO, "a2": IL, "a3": IL},
}
PARAMS = {
    "gpt2_8gram": ("ngram_overlap", {"n": 8, "normalization": "gpt2"}),
    "gpt3_13gram": ("ngram_overlap", {"n": 13, "max_doc_frequency": 10}),
    "palm": ("ngram_overlap", {"n": 8, "min_fraction": 0.7}),
    "exact_match": ("exact_match", {}),
    "llama2_tokens": ("llama2_tokens", {}),
    "meteor_recall": ("meteor_recall", {}),
    "gpt4_substring": ("gpt4_substring", {}),
}


def _edit(text: str, positions: tuple[int, ...]) -> str:
    words = text.split()
    for p in positions:
        assert words[p].isalpha(), (p, words[p])
        words[p] = "zzqx"
    return " ".join(words)


def _interleave(text: str) -> str:
    words = text.split()
    return " ".join(w + (" zzqx" if i % 4 == 3 else "") for i, w in enumerate(words))


def _planted(record: Record, how: str, key: str) -> str:
    if how == "input_only":
        return record.input
    if how == "edited":
        return _edit(record.input, EDIT_AT[key]) + "\n" + record.label
    if how == "interleaved":
        return _interleave(f"{record.input} {record.label}")
    return f"{record.input}\n{record.label}"


@pytest.fixture(scope="module")
def records(mirror_dir: Path) -> dict[str, Record]:
    gsm = load_records("gsm8k", mirror_dir=mirror_dir, n=None).records
    arc = load_records("arc_challenge", mirror_dir=mirror_dir, n=None).records
    out = {k: gsm[i] for k, i in GSM_ROWS.items()}
    out.update({k: arc[i] for k, i in ARC_ROWS.items()})
    return out


@pytest.fixture(scope="module")
def corpus(mirror_dir: Path, records: dict[str, Record], tmp_path_factory: pytest.TempPathFactory) -> dict:
    with open(mirror_dir / XSUM, encoding="utf-8") as f:
        articles = [json.loads(line)["document"] for _, line in zip(range(300 + N_DOCS), f)][300:]
    texts = {}
    for i, article in enumerate(articles):
        lines = [x for x in article.split("\n") if x.strip()][:LINES_PER_DOC]
        if i in PLANTS:
            key, how = PLANTS[i]
            planted = _planted(records[key], how, key)
            lines = lines + [planted] if how == "input_only" else lines[:1] + [planted] + lines[1:]
        texts[i] = "\n".join(lines)
    root = tmp_path_factory.mktemp("planted")
    with open(root / "part-0.jsonl", "wb") as f:
        for i in range(0, 8):
            f.write(json.dumps({"id": f"doc-{i}", "text": texts[i]}).encode() + b"\n")
            if i == 2:
                f.write(b'{"id": "broken", "text": "no closing brace\n')
            if i == 5:
                f.write(b'{"id": "latin1", "text": "caf\xe9 ' + b"x" * 20 + b'"}\n')
            if i == 6:
                f.write(json.dumps({"id": "no-text", "body": records["g4"].input}).encode() + b"\n")
    pq.write_table(
        pa.table({"id": [f"doc-{i}" for i in range(8, 12)], "text": [texts[i] for i in range(8, 12)]}),
        root / "part-1.parquet",
    )
    lines = [json.dumps({"id": f"doc-{i}", "text": texts[i]}).encode() + b"\n" for i in TRUNCATED]
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    head = gz.compress(b"".join(lines[:2])) + gz.flush(zlib.Z_FULL_FLUSH)  # documents 12 and 13, whole
    middle = gz.compress(lines[2]) + gz.flush(zlib.Z_FULL_FLUSH)  # document 14
    (root / "part-2.jsonl.gz").write_bytes(head + middle[: len(middle) // 2])  # breaks inside document 14
    return {"root": root, "texts": texts}


@pytest.fixture(scope="module")
def docs(corpus: dict, caplog_module: list[str]) -> list[dict]:
    return list(iter_documents(corpus["root"], id_field="id"))


@pytest.fixture(scope="module")
def caplog_module() -> list[str]:
    """Warnings logged by the corpus reader while the module's corpus is read."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    logger = logging.getLogger("contamray.corpus.readers")
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def run(method_name: str, params: dict, records: dict[str, Record], docs: list[dict], **extra) -> dict:
    """build_index -> match in batches of 4 documents -> score; rows by record key."""
    method = get_method(method_name)
    cfg = method.make_config(params)
    recs = list(records.values())
    index = method.build_index(recs, cfg)
    matches = []
    for start in range(0, len(docs), 4):
        matches.extend(method.match(docs[start : start + 4], index, cfg))
    rows = method.score(recs, matches, cfg, **extra)
    key_of = {r.id: k for k, r in records.items()}
    return {"rows": {key_of[row["record_id"]]: row for row in rows}, "matches": matches, "cfg": cfg}


def found(rows: dict[str, dict]) -> dict[str, str]:
    return {k: r["contamination_type"] for k, r in rows.items() if r["contaminated"]}


def doc_of(key: str) -> str:
    return next(f"doc-{i}" for i, (k, _) in PLANTS.items() if k == key)


# --------------------------------------------------------------------------- the corpus


def test_bad_corpus_rows_are_reported_and_skipped(docs: list[dict], corpus: dict, caplog_module: list[str]):
    root = corpus["root"]
    ids = [d["doc_id"] for d in docs]
    assert ids == [f"doc-{i}" for i in range(14)]  # 14..17 lie after the break of part-2.jsonl.gz
    assert [d["text"] for d in docs] == [corpus["texts"][i] for i in range(14)]
    log = "\n".join(caplog_module)
    assert f"{root}/part-0.jsonl:4: not a JSON line" in log
    assert f"{root}/part-0.jsonl:8: not valid UTF-8" in log
    assert f"{root}/part-0.jsonl:10: no field 'text' (fields: body, id)" in log
    assert f"{root}/part-2.jsonl.gz:3: the file is truncated or corrupt after line 2" in log


# --------------------------------------------------------------------------- string-matching methods


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_each_method_finds_what_its_definition_says(label: str, records, docs):
    name, params = PARAMS[label]
    result = run(name, params, records, docs)
    rows = result["rows"]
    assert found(rows) == EXPECTED[label]
    assert all(not r["error"] for r in rows.values())
    for key in EXPECTED[label]:  # evidence: the planted document, with a span inside it
        assert rows[key]["doc_ids"] == [doc_of(key)], key
        span = rows[key]["spans"][0]
        assert span["doc_id"] == doc_of(key) and 0 <= span["start"] < span["end"]
    verdict = get_method(name).reduce([r for k, r in rows.items() if k.startswith("g")], result["cfg"])
    n_gsm = sum(k.startswith("g") for k in EXPECTED[label])
    assert verdict.rate == pytest.approx(n_gsm / len(GSM_ROWS)) and verdict.n_examples == len(GSM_ROWS)
    assert verdict.details["n_input_only"] + verdict.details["n_input_and_label"] == n_gsm
    assert verdict.contaminated


def test_ngram_spans_point_at_the_planted_words(records, docs):
    rows = run("ngram_overlap", {"n": 13}, records, docs)["rows"]
    span = rows["g0"]["spans"][0]
    from contamray.metrics.ngrams import words

    doc_words = words(next(d["text"] for d in docs if d["doc_id"] == "doc-1"))
    planted = words(f"{records['g0'].input} {records['g0'].label}")
    assert doc_words[span["start"] : span["end"]] == planted


def test_palm_fraction_is_the_share_of_8_grams(records, docs):
    rows = run("ngram_overlap", {"n": 8, "min_fraction": 0.7}, records, docs)["rows"]
    share = {k: (rows[k]["matched_total"], rows[k]["n_ngrams"]) for k in ("a1", "g1", "g2", "a3")}
    # question only: its 8-grams of all; edited: each replaced word costs the 8 8-grams around it
    assert share == {"a1": (35, 40), "g1": (15, 34), "g2": (49, 65), "a3": (29, 45)}
    assert [rows[k]["contaminated"] for k in share] == [True, False, True, False]  # 70 % or more
    assert rows["g1"]["matched_input"] == rows["g1"]["n_input_ngrams"]


def test_llama2_buckets_and_token_shares(records, docs):
    result = run("llama2_tokens", {}, records, docs)
    rows = result["rows"]
    assert rows["g0"]["contaminated_share"] == 1.0 and rows["g2"]["contaminated_share"] == 1.0
    g1 = rows["g1"]  # the question alone: its tokens only
    assert g1["n_contaminated_tokens"] == g1["n_input_tokens"]
    assert (g1["is_clean"], g1["is_not_clean"], g1["is_not_dirty"], g1["is_dirty"]) == (
        False,
        True,
        True,
        False,
    )
    clean = rows["g4"]
    assert (clean["is_clean"], clean["is_not_dirty"], clean["contaminated_share"]) == (True, True, 0.0)
    g2_spans = [m for m in result["matches"] if m["record_id"] == records["g2"].id]
    assert [(m["start"], m["mismatches"]) for m in g2_spans][0] == (0, 2)  # one span across both edits
    without_budget = run("llama2_tokens", {"skip_budget": 0}, records, docs)["rows"]
    assert without_budget["g2"]["contaminated_share"] < 1.0
    verdict = get_method("llama2_tokens").reduce(
        [r for k, r in rows.items() if k.startswith("a")], result["cfg"]
    )
    assert verdict.details["dirty_rate"] == pytest.approx(3 / len(ARC_ROWS))
    assert verdict.details["not_clean_rate"] == pytest.approx(3 / len(ARC_ROWS))


def test_llama2_with_a_real_tokenizer(records, docs):
    rows = run("llama2_tokens", {"tokenizer": "smollm2-135m"}, records, docs)["rows"]
    # The same items are Dirty. ARC's answers (5-7 words) follow their question after a newline in the
    # corpus but after a space in the example, so their BPE tokens differ at the boundary, and no span
    # of >= 10 equal tokens reaches into them: input-only by the definition. GSM8K's long solutions
    # hold spans of their own.
    assert found(rows) == {"g0": IL, "g2": IL, "a0": IO, "a1": IO, "a3": IO}
    assert rows["g0"]["n_tokens"] > len(records["g0"].verbalized.split())  # BPE tokens, not words


def test_meteor_scores_and_input_only(records, docs):
    rows = run("meteor_recall", {}, records, docs)["rows"]
    assert rows["g0"]["meteor_recall"] == pytest.approx(1.0, abs=1e-3)
    assert 0.75 <= rows["a2"]["meteor_recall"] < 1.0  # interleaved: every word, in chunks of 4
    assert rows["a1"]["label_recall"] < 0.75 <= rows["a1"]["meteor_recall"]
    assert rows["g1"]["meteor_recall"] < 0.75
    strict = run("meteor_recall", {"threshold": 0.995}, records, docs)["rows"]
    assert found(strict) == {"g0": IL, "a0": IL}


def test_gpt4_substrings_agree_with_a_brute_force_search(records, docs):
    result = run("gpt4_substring", {}, records, docs)
    rows, cfg = result["rows"], result["cfg"]
    corpus = [gpt4_substring.normalize(d["text"]) for d in docs]
    for key, record in records.items():
        samples = gpt4_substring.example_samples(record, cfg).samples
        assert len(samples) == 3 and all(len(s.text) == 50 for s in samples)
        hits = [s for s in samples if any(s.text in c for c in corpus)]
        expected = "clean" if not hits else (IL if any(s.region != "input" for s in hits) else IO)
        assert rows[key]["contamination_type"] == expected, key
    # with seed 0: every verbatim and input-only item, and the edited ones (some of their substrings
    # avoid the two replaced words; a3's found substrings all lie in the question); not interleaved
    assert found(rows) == {"g0": IL, "g1": IO, "a0": IL, "a1": IO, "g2": IL, "a3": IO}
    # the same draw on every call: a seed per record
    again = gpt4_substring.example_samples(records["g0"], cfg).samples
    assert [s.start for s in again] == [
        s.start for s in gpt4_substring.example_samples(records["g0"], cfg).samples
    ]


# --------------------------------------------------------------------------- embedding methods


@pytest.fixture(scope="module")
def platypus(records, docs) -> dict:
    return run("platypus_embedding", {}, records, docs)


def test_platypus_top1_cosine(platypus, records, docs):
    from contamray.metrics import embedding as emb

    rows = platypus["rows"]
    assert found(rows) == {"g0": IL, "g1": IO, "g2": IL, "a0": IL, "a1": IO, "a3": IL}
    for key in ("g0", "g1", "a0", "a1"):
        assert rows[key]["max_similarity"] == pytest.approx(1.0, abs=1e-4)
        assert rows[key]["nearest_doc_id"] == doc_of(key)
    # edited questions: the decision is the model's own cosine of the question and the planted line
    planted_lines = {
        "g2": _edit(records["g2"].input, EDIT_AT["g2"]),
        "a3": _edit(records["a3"].input, EDIT_AT["a3"]),
        "a2": _interleave(f"{records['a2'].input} {records['a2'].label}"),
    }
    for key, line in planted_lines.items():
        q, p = emb.encode([records[key].input, line])
        assert rows[key]["max_similarity"] == pytest.approx(float(q @ p), abs=1e-4), key
        assert rows[key]["contaminated"] == (float(q @ p) >= 0.8), key
    for key in ("g3", "g4", "g5", "a6", "a7", "a8", "a11"):  # never planted (g3 was lost)
        assert rows[key]["max_similarity"] < 0.8 and not rows[key]["contaminated"]
    # per worker the running top-1 keeps the rows few: at most one per example per batch, plus matches
    assert len(platypus["matches"]) <= len(records) * (len(docs) // 4 + 1)


def test_platypus_through_an_hnsw_graph_finds_the_same_items(platypus, records, docs):
    """Two candidates per passage, from a per-worker HNSW graph: every planted question is still its
    passage's nearest example, so the decisions and their top-1 evidence are the exact scan's."""
    graph = run("platypus_embedding", {"index": "hnsw", "ann_candidates": 2}, records, docs)["rows"]
    exact = platypus["rows"]
    assert found(graph) == found(exact)
    for key in found(exact):
        assert graph[key]["max_similarity"] == pytest.approx(exact[key]["max_similarity"], abs=1e-5)
        assert graph[key]["nearest_doc_id"] == exact[key]["nearest_doc_id"]
    for key in exact:  # elsewhere a top-1 can only be missed, never overstated
        if graph[key]["max_similarity"] is not None:
            assert graph[key]["max_similarity"] <= exact[key]["max_similarity"] + 1e-5


def test_llm_decontaminator_retrieves_and_reads_the_judge(records, docs):
    method = get_method("llm_decontaminator")
    result = run("llm_decontaminator", {}, records, docs)
    cfg = result["cfg"]
    chosen = llm_decontaminator.candidates(list(records.values()), result["matches"], cfg)
    for key in ("g0", "g1", "a0", "a1"):
        assert [c["doc_id"] for c in chosen[records[key].id]] == [doc_of(key)]
    requests = method.judge_requests(list(records.values()), result["matches"], cfg)
    assert len(requests) == len(records) and {r.engine for r in requests} == {"judge"}
    by_record = {r.record_ids[0]: r for r in requests}
    prompt = by_record[records["g1"].id].text
    assert prompt.startswith(llm_decontaminator.INSTRUCTIONS["knowledge"])
    assert "part1: \\{\n" + records["g1"].input + "\n\\}\npart2: \\{\n" in prompt
    # answers known: the judge says True for g1 and a0, False elsewhere, one answer is garbled
    text = {records["g1"].id: "True", records["a0"].id: " true.", records["g4"].id: "Maybe"}
    outputs = {r.key: Output(key=r.key, text=text.get(r.record_ids[0], "False")) for r in requests}
    rows = {k: r for k, r in run("llm_decontaminator", {}, records, docs, outputs=outputs)["rows"].items()}
    assert found(rows) == {"g1": IO, "a0": IL}
    assert rows["g4"]["judge_invalid"] == 1 and not rows["g4"]["contaminated"]
    # a garbled answer is no "False": the example is undecided - an error row naming the answer, never clean
    assert "neither True nor False for 1 of 1 candidate(s) (first: 'Maybe')" in rows["g4"]["error"]
    assert not any(r["error"] for k, r in rows.items() if k != "g4")
    # without the judge's answers the examples with candidates are error rows
    missing = method.score(list(records.values()), result["matches"], cfg)
    assert all("no judge output" in r["error"] and "outputs=" in r["error"] for r in missing)
    verdict = method.reduce([r for k, r in rows.items() if k.startswith("g")], cfg)
    assert verdict.details["n_judged"] == len(GSM_ROWS) and verdict.details["n_judge_invalid"] == 1
    assert verdict.n_failed == 1 and verdict.rate == pytest.approx(1 / (len(GSM_ROWS) - 1))
    assert verdict.details["n_input_only"] == 1
    # a judge that garbles most answers (a small model judging) leaves the partition inconclusive, not clean
    garbled = {r.key: Output(key=r.key, text="I think so") for r in requests}
    rows = run("llm_decontaminator", {}, records, docs, outputs=garbled)["rows"]
    settled = method.settle(method.reduce([r for k, r in rows.items() if k.startswith("g")], cfg), cfg)
    assert settled.decision == "inconclusive" and settled.reason.startswith(
        f"the judge answered neither True nor False for {len(GSM_ROWS)} of {len(GSM_ROWS)} examples (first: 'I think "
        "so'): it does not follow the paper's instruction"
    ), settled.reason


def test_embedding_index_is_the_benchmark_side(records):
    from contamray.methods.open.embedding_scan import EmbeddingIndex

    index = EmbeddingIndex(list(records.values()), ("input",), ("label",), "all-MiniLM-L6-v2", 128, 64)
    assert index.vectors.shape == (len(records), 384) and index.vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
