"""``fold`` of the matchers that rank or sample: GPT-4 substrings, METEOR recall and the embedding methods.

Every method here scans one small benchmark (six quiz questions, written out below) against one small
corpus whose answer is known: unrelated news lines; the first question copied with its answer into
three documents (more than the ``max_evidence`` of 2 used below, so the evidence is cut); the second
question alone; a paraphrase of the third (its opening words kept: METEOR recall 0.64, below 0.75;
MiniLM cosine 0.83, above Platypus's 0.8); the fourth copied twice with its answer into one document
(two passages, so two spans); the fifth with one word of the question changed; the sixth nowhere.
``tests/fold_check.py`` then checks ``common.FOLD_CONTRACT``: random batchings and fold bracketings
score exactly like the one-batch scan, and what a fold keeps stops growing when the
corpus copies the benchmark 60 times instead of 5.

The embedding index keeps a running top-k per process (``embedding_scan``), which is why the module says
"build a fresh index for each scan"; ``fold_check`` scans many times with one index, so there each
``match`` call starts from a fresh running top-k (``FreshScans``: every batch as on a worker of its own,
the case that gives ``fold`` the most rows), and ``test_*_one_worker_*`` scans batches one after
another with the running top-k, as one match actor does.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from contamray.methods.base import Method, Output, get_method
from contamray.methods.open import common, gpt4_substring, llm_decontaminator
from contamray.metrics import embedding as emb
from contamray.records import Record
from tests.fold_check import assert_fold_bounded, assert_fold_faithful

QUIZ = {
    "q0": ("Which gas do green plants absorb from the air to make their food?", "carbon dioxide"),
    "q1": ("How many legs does a common garden spider have on its body, counting every one of them?", "eight"),
    "q2": ("What is the boiling point of pure water at sea level in degrees Celsius?", "one hundred"),
    "q3": ("Which planet in our solar system is known as the red planet?", "Mars"),
    "q4": ("Who wrote the famous play Romeo and Juliet in the late sixteenth century?", "William Shakespeare"),
    "q5": ("What is the largest ocean on the planet Earth by surface area?", "the Pacific Ocean"),
}
NEWS = [
    "The local football club signed two new players before the start of the season.",
    "Heavy rain is expected across the northern region throughout the weekend.",
    "The council approved a plan to repair the old bridge over the river next spring.",
    "Bake the bread for forty minutes until the crust turns a deep golden brown.",
    "Shares in the technology company fell sharply after the quarterly results.",
    "Volunteers planted hundreds of trees along the new cycle path on Saturday.",
]
IL, IO = "input_and_label", "input_only"


def _qa(key: str) -> str:
    question, answer = QUIZ[key]
    return f"{question}\n{answer}"


CORPUS = {
    "news-a": "\n".join(NEWS[:3]),
    "news-b": "\n".join(NEWS[3:]),
    "copy-q0-a": "\n".join([NEWS[0], _qa("q0"), NEWS[1]]),
    "copy-q0-b": "\n".join([_qa("q0"), NEWS[2]]),
    "copy-q0-c": "\n".join([NEWS[4], NEWS[5], _qa("q0")]),
    "quiz-q1": "\n".join([NEWS[3], QUIZ["q1"][0]]),
    "para-q2": "What is the boiling point of salty sea water? It is above one hundred degrees.",
    "twice-q3": "\n".join([NEWS[1], _qa("q3"), _qa("q3"), NEWS[4]]),
    "edit-q4": "\n".join([NEWS[2], QUIZ["q4"][0].replace("famous", "celebrated"), QUIZ["q4"][1]]),
}


def _record(key: str) -> Record:
    question, answer = QUIZ[key]
    return Record(
        id=f"quiz/{key}",
        partition="quiz/test",
        input=question,
        label=answer,
        reference=answer,
        task="question_answering",
        verbalized=f"{question} {answer}",
    )


RECORDS = [_record(key) for key in QUIZ]
DOCS = [{"doc_id": doc_id, "text": text} for doc_id, text in CORPUS.items()]


def copy_docs(k: int) -> list[dict[str, Any]]:
    """``k`` documents, each copying every question with its answer between news lines."""
    lines = [line for i, key in enumerate(QUIZ) for line in (NEWS[i], _qa(key))]
    return [{"doc_id": f"copy-{i:03d}", "text": "\n".join(lines)} for i in range(k)]


def by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(r["record_id"]).split("/")[1]: r for r in rows}


def found(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {key: r["contamination_type"] for key, r in by_key(rows).items() if r["contaminated"]}


class FreshScans:
    """``method`` whose every ``match`` starts from a fresh running top-k (a new worker's copy of the index)."""

    def __init__(self, method: Method) -> None:
        self.method = method

    def __getattr__(self, name: str) -> Any:
        return getattr(self.method, name)

    def match(self, docs: list[dict[str, Any]], index: Any, cfg: Any) -> list[dict[str, Any]]:
        index._best = None
        return self.method.match(docs, index, cfg)


@contextmanager
def one_text_per_call() -> Iterator[None]:
    """MiniLM's embeddings one text per call, remembered by text: batch-invariant. Batched, a text's float32
    embedding moves by ~1e-7 with the padding of its batch, so the same passage would score an ulp apart
    in two batchings and ``fold_check``'s exact comparison would test the encoder rather than ``fold``."""
    encode, memo = emb.encode, {}

    def one_at_a_time(texts: list[str], source: str = emb.MINILM, batch_size: int = 64) -> np.ndarray:
        for text in texts:
            if (source, text) not in memo:
                memo[(source, text)] = encode([text], source, 1)[0]
        return np.vstack([memo[(source, t)] for t in texts]) if texts else encode(texts, source)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emb, "encode", one_at_a_time)
        yield


def one_worker_folds(method: Method, cfg: Any, batch: int) -> list[dict[str, Any]]:
    """One worker's scan: batches of ``batch`` documents through one index (its running top-k kept),
    each batch's rows folded and the folds folded together as they come."""
    index = method.build_index(RECORDS, cfg)
    folded: list[dict[str, Any]] = []
    for start in range(0, len(DOCS), batch):
        folded = method.fold(folded + method.fold(method.match(DOCS[start : start + batch], index, cfg), cfg), cfg)
    return folded


# --------------------------------------------------------------------------- GPT-4 substrings


@pytest.mark.parametrize("max_evidence", [0, 2, 5])
def test_gpt4_fold_is_faithful_and_bounded(max_evidence: int):
    method = get_method("gpt4_substring")
    cfg = method.make_config({"max_evidence": max_evidence})
    rows = assert_fold_faithful(method, cfg, RECORDS, DOCS)
    assert_fold_bounded(method, cfg, RECORDS, copy_docs)
    assert found(rows) == {"q0": IL, "q1": IO, "q3": IL, "q4": IL}
    q0 = by_key(rows)["q0"]
    assert q0["n_docs"] == 3 and q0["doc_ids"] == ["copy-q0-a", "copy-q0-b", "copy-q0-c"][:max_evidence]
    assert len(q0["spans"]) == min(3, max_evidence)


def test_gpt4_known_answers_agree_with_a_brute_force_search():
    cfg = gpt4_substring.GPT4SubstringConfig(max_evidence=2)
    rows = by_key(
        gpt4_substring.score(RECORDS, gpt4_substring.match(DOCS, gpt4_substring.build_index(RECORDS, cfg), cfg), cfg)
    )
    processed = {d["doc_id"]: gpt4_substring.normalize(d["text"]) for d in DOCS}
    for record in RECORDS:
        samples = gpt4_substring.example_samples(record, cfg).samples
        hits = [s for s in samples if any(s.text in text for text in processed.values())]
        docs = sorted(d for d, text in processed.items() if any(s.text in text for s in samples))
        row = rows[record.id.split("/")[1]]
        assert row["samples_found"] == [i for i, s in enumerate(samples) if s in hits]
        assert (row["n_docs"], row["doc_ids"]) == (len(docs), docs[:2])
    # the paraphrase keeps no 50 letters in a row; q3's two copies touch: one merged span per document
    assert not rows["q2"]["contaminated"] and not rows["q5"]["contaminated"]
    assert [s["doc_id"] for s in rows["q3"]["spans"]] == ["twice-q3"]


def test_gpt4_fold_keeps_one_summary_per_example_found():
    cfg = gpt4_substring.GPT4SubstringConfig(max_evidence=2)
    raw = gpt4_substring.match(copy_docs(30), gpt4_substring.build_index(RECORDS, cfg), cfg)
    folded = gpt4_substring.fold(raw, cfg)
    assert len(raw) == 30 * sum(len(gpt4_substring.example_samples(r, cfg).samples) for r in RECORDS)
    assert [r["record_id"] for r in folded] == sorted(r.id for r in RECORDS)
    assert all(r["n_docs"] == 30 and r["doc_ids"] == ["copy-000", "copy-001"] for r in folded)


def test_fold_names_a_row_that_is_not_a_match_row():
    cfg = gpt4_substring.GPT4SubstringConfig()
    with pytest.raises(ValueError, match=r"gpt4_substring.fold: row 0 \(record 'quiz/q0'\) lacks sample, region"):
        gpt4_substring.fold([{"record_id": "quiz/q0", "doc_id": "d", "start": 0, "end": 3}], cfg)


# --------------------------------------------------------------------------- METEOR recall


@pytest.mark.parametrize("max_evidence", [0, 2])
def test_meteor_fold_is_faithful_and_bounded(max_evidence: int):
    method = get_method("meteor_recall")
    cfg = method.make_config({"max_evidence": max_evidence})
    rows = assert_fold_faithful(method, cfg, RECORDS, DOCS)
    assert_fold_bounded(method, cfg, RECORDS, copy_docs)
    assert found(rows) == {"q0": IL, "q1": IO, "q3": IL, "q4": IL}
    rows_by_key = by_key(rows)
    assert rows_by_key["q0"]["meteor_recall"] == pytest.approx(1.0, abs=0.01)
    assert rows_by_key["q0"]["n_docs"] == 3 and rows_by_key["q0"]["best_doc_id"] == "copy-q0-a"
    assert len(rows_by_key["q0"]["doc_ids"]) == len(rows_by_key["q0"]["spans"]) == min(3, max_evidence)
    assert 0.75 <= rows_by_key["q4"]["meteor_recall"] < 1.0  # one word changed
    assert 0.5 <= rows_by_key["q2"]["meteor_recall"] < 0.75  # the paraphrase: its best window is the evidence
    assert rows_by_key["q2"]["best_doc_id"] == "para-q2" and rows_by_key["q2"]["n_docs"] == 0
    assert [s["doc_id"] for s in rows_by_key["q2"]["spans"]] == ["para-q2"][:max_evidence]
    assert rows_by_key["q5"]["meteor_recall"] == 0.0 and rows_by_key["q5"]["spans"] == []


def test_meteor_fold_keeps_the_best_window_and_a_summary():
    method = get_method("meteor_recall")
    cfg = method.make_config({"max_evidence": 2})
    folded = method.fold(method.match(DOCS, method.build_index(RECORDS, cfg), cfg), cfg)
    kinds = {(str(r["record_id"]).split("/")[1], r[common.FOLD]) for r in folded}
    assert kinds == {(k, kind) for k in ("q0", "q1", "q3", "q4") for kind in ("evidence", "best")} | {("q2", "best")}
    summary = next(r for r in folded if r["record_id"] == "quiz/q0" and r[common.FOLD] == "evidence")
    assert (summary["n_docs"], summary["doc_ids"], summary["label_found"]) == (3, ["copy-q0-a", "copy-q0-b"], True)


# --------------------------------------------------------------------------- embedding methods


@pytest.fixture(scope="module")
def platypus() -> tuple[Method, Any]:
    method = get_method("platypus_embedding")
    return method, method.make_config({"max_evidence": 2})


def test_platypus_fold_is_faithful(platypus):
    method, cfg = platypus
    with one_text_per_call():
        rows = assert_fold_faithful(FreshScans(method), cfg, RECORDS, DOCS)
    rows_by_key = by_key(rows)
    assert found(rows) == {"q0": IL, "q1": IO, "q2": IL, "q3": IL, "q4": IL}
    assert rows_by_key["q5"]["max_similarity"] < 0.8
    assert rows_by_key["q0"]["max_similarity"] == pytest.approx(1.0, abs=1e-4)
    assert rows_by_key["q0"]["n_docs"] == 3 and rows_by_key["q0"]["doc_ids"] == ["copy-q0-a", "copy-q0-b"]
    assert rows_by_key["q2"]["nearest_doc_id"] == "para-q2" and 0.8 <= rows_by_key["q2"]["max_similarity"] < 0.9
    assert [(s["start"], s["end"]) for s in rows_by_key["q3"]["spans"]] == [(11, 23), (24, 36)]  # after 11 words


def test_platypus_one_worker_with_its_running_top_1_scores_like_one_batch(platypus):
    method, cfg = platypus
    with one_text_per_call():
        expected = method.score(RECORDS, method.match(DOCS, method.build_index(RECORDS, cfg), cfg), cfg)
        folded = one_worker_folds(method, cfg, batch=2)
    assert method.score(RECORDS, folded, cfg) == expected
    assert len(folded) <= 2 * len(RECORDS)  # a summary and the nearest passage per example at most


@pytest.fixture(scope="module")
def decontaminator() -> tuple[Method, Any, dict[str, Output]]:
    """The method with ``top_k=2``, and the judge's answers to its prompts: True where the candidate
    passage is the example's own planted question (q0's and q4's), False elsewhere."""
    method = get_method("llm_decontaminator")
    cfg = method.make_config({"top_k": 2, "max_evidence": 2})
    planted = {"quiz/q0": QUIZ["q0"][0], "quiz/q4": QUIZ["q4"][0].replace("famous", "celebrated")}
    with one_text_per_call():
        raw = method.match(DOCS, method.build_index(RECORDS, cfg), cfg)
    answers = {}
    for request in method.judge_requests(RECORDS, raw, cfg):
        candidate = request.text.split("part2: \\{\n")[1].split("\n")[0]
        same = planted.get(request.record_ids[0]) == candidate
        answers[request.key] = Output(key=request.key, text="True" if same else "False")
    return method, cfg, answers


def test_llm_decontaminator_fold_is_faithful(decontaminator):
    method, cfg, answers = decontaminator
    with one_text_per_call():
        rows = assert_fold_faithful(FreshScans(method), cfg, RECORDS, DOCS, score_kwargs={"outputs": answers})
    assert found(rows) == {"q0": IL, "q4": IL}
    rows_by_key = by_key(rows)
    assert rows_by_key["q0"]["candidate_doc_ids"] == ["copy-q0-a", "copy-q0-b"]  # ties at 1.0: by document
    assert rows_by_key["q0"]["judged_true"] == 2 and rows_by_key["q0"]["n_docs"] == 2
    assert all(r["n_candidates"] == 2 and not r["error"] for r in rows)


def test_llm_decontaminator_judges_the_same_prompts_from_folded_rows(decontaminator):
    method, cfg, answers = decontaminator
    with one_text_per_call():
        raw = method.match(DOCS, method.build_index(RECORDS, cfg), cfg)
        folded = one_worker_folds(method, cfg, batch=3)
    prompts = method.judge_requests(RECORDS, raw, cfg)
    assert [p.key for p in prompts] == [f"{r.id}|judge|{rank}" for r in RECORDS for rank in range(2)]
    assert method.judge_requests(RECORDS, method.fold(raw, cfg), cfg) == prompts
    assert method.judge_requests(RECORDS, folded, cfg) == prompts
    assert method.score(RECORDS, folded, cfg, outputs=answers) == method.score(RECORDS, raw, cfg, outputs=answers)
    assert len(folded) == cfg.top_k * len(RECORDS) < len(raw)
    chosen = llm_decontaminator.candidates(RECORDS, folded, cfg)
    assert [c["doc_id"] for c in chosen["quiz/q1"]][0] == "quiz-q1"
    pickle.loads(pickle.dumps(folded))


@pytest.mark.parametrize("name", ["platypus_embedding", "llm_decontaminator"])
def test_embedding_folds_stop_growing_with_copies(name: str):
    """Batched encoding, as in a scan: 12 copies of the benchmark fold to no more than 3 do."""
    method = get_method(name)
    cfg = method.make_config({"max_evidence": 2, **({"top_k": 2} if name == "llm_decontaminator" else {})})
    assert_fold_bounded(FreshScans(method), cfg, RECORDS, copy_docs, few=3, many=12)


# --------------------------------------------------------------------------- many documents, no model


def _random_rows(name: str, rng: random.Random, doc: str) -> list[dict[str, Any]]:
    """One document's match rows as ``name``'s ``match`` shapes them: overlapping spans, tied scores."""
    rows = []
    for key in rng.sample(sorted(QUIZ), rng.randint(1, 3)):
        base = {"record_id": f"quiz/{key}", "partition": "quiz/test", "doc_id": doc}
        starts = sorted(rng.sample(range(0, 60, 3), rng.randint(1, 3)))
        if name == "gpt4_substring":
            for sample, start in enumerate(starts):
                region = rng.choice(["input", "label", "overlap"])
                span = {"start": start, "end": start + 10, "occurrences": 1, "substring": "x" * 10}
                rows.append({**base, "sample": sample, "region": region, **span})
        elif name == "meteor_recall":
            score = rng.choice([0.6, 0.75, 0.8, 1.0, rng.random()])
            window = {"start": starts[0], "end": starts[0] + 8, "prefilter_ngrams": 2, "text": "t"}
            rows.append({**base, "score": score, "label_score": rng.random(), "input_score": 0.5, **window})
        else:
            for start in starts:
                similarity = rng.choice([0.5, 0.8, 0.9, 1.0, rng.uniform(-1, 1)])
                passage = {"start": start, "end": start + rng.randint(2, 6), "passage": f"{doc}:{start}"}
                rows.append({**base, "similarity": similarity, "label_found": rng.random() < 0.3, **passage})
    return rows


@pytest.mark.parametrize("name", ["gpt4_substring", "meteor_recall", "platypus_embedding", "llm_decontaminator"])
@pytest.mark.parametrize("max_evidence", [0, 1, 3])
def test_folds_of_many_documents_combine_exactly(name: str, max_evidence: int):
    """Rows of 80 documents (many more than ``max_evidence``), folded in random groups and bracketings."""
    method = get_method(name)
    cfg = method.make_config({"max_evidence": max_evidence, **({"top_k": 3} if name == "llm_decontaminator" else {})})
    rng = random.Random(max_evidence)
    per_doc = [_random_rows(name, rng, f"doc-{i:02d}") for i in range(80)]
    raw = [row for rows in per_doc for row in rows]
    extra: dict[str, Any] = {}
    if name == "llm_decontaminator":  # the judge's answers, at random
        requests = method.judge_requests(RECORDS, raw, cfg)
        extra["outputs"] = {r.key: Output(key=r.key, text=rng.choice(["True", "False"])) for r in requests}
    expected = method.score(RECORDS, raw, cfg, **extra)
    whole = method.fold(raw, cfg)
    for _ in range(5):
        rng.shuffle(per_doc)
        parts = [method.fold([r for rows in per_doc[i : i + 7] for r in rows], cfg) for i in range(0, 80, 7)]
        while len(parts) > 1:
            i, j = sorted(rng.sample(range(len(parts)), 2))
            right, left = parts.pop(j), parts.pop(i)
            parts.append(method.fold(rng.choice([left + right, right + left]), cfg))
        assert parts[0] == whole
        assert method.score(RECORDS, parts[0], cfg, **extra) == expected
    assert len(whole) <= 2 * len(QUIZ) * (3 if name == "llm_decontaminator" else 1)
