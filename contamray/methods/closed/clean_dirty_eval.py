"""Clean vs dirty evaluation: a model's accuracy on the clean and contaminated parts of a benchmark.

Paper: Li, Guerin, Lin 2023, "An Open-Source Data Contamination Report for Large Language Models",
Sec. 4-5 and its main table: each multiple-choice benchmark is split by an open-data contamination
check into *clean*, *input-only contaminated* and *input-and-label contaminated* examples, and the
model's accuracy is compared across the subsets (e.g. Llama-2 70B on HellaSwag: clean .7726, all dirty
.8348, input-and-label dirty .8455). A model that learned a benchmark from its training data does
better on the dirty part than on the clean part.

Evaluation, as in the report (which used lm-evaluation-harness's multiple-choice scoring): each option
is scored as a continuation of the question prompt (``template``, default ``"Question: {input}\\nAnswer:"``,
the harness's ARC format, the option after a space); the prediction is the option with the lowest
perplexity, ``exp(-mean log p(option tokens | prompt))``. Each option's token log-probabilities are
the scored tokens of ``prompt + " " + option`` beyond those of the prompt alone (one extra ``score``
request per example for the prompt), which is exact when the option starts a new token after the
space, as with the BPE / SentencePiece tokenizers of the models studied. In the chat form (``chat``) each
option is the assistant's reply to the prompt as a user turn, and its tokens are the reply's (the engine says
where the reply starts: no request for the prompt alone).

The split comes from an open-data method of the same run: ``contamination_from`` names it (its label
under ``methods:``) and the runner merges its per-example ``contaminated`` and ``contamination_type``
into this method's table on ``record_id`` (``contamray.methods.base``). Examples of the other types an
open-data method may give - ``label_only`` (the answer found without the question), ``frequent_only``
(only n-grams too common to count, GPT-3's filter) and ``template_only`` (only n-grams other benchmark
items share, ``ngram_overlap``'s ``template_min_items``) - belong to none of the report's three subsets: they are
left out of both sides and counted in ``details`` (``n_unsplit``, ``n_unsplit_<type>``). ``reduce`` reports accuracy per
subset and tests the difference (below): ``p_value`` is one-sided (H1: dirty accuracy > clean accuracy, the
direction contamination inflates), per subset in ``details``. The partition is called contaminated (evaluation
inflated) when ``p_value <= alpha``; inconclusive when a subset is empty, when no topic has both dirty and clean
rows, or when even the most lopsided tables the margins allow could not reach ``alpha`` (too few rows). The report
gives the accuracies without a test; the test is ours. A row the open-data scan failed on (its ``error``, merged as
``contamination_error``; the scan itself reports such a row as not contaminated) is a failed row here, in neither
subset (``n_scan_failed``), so that the failure share ``settle`` applies counts it.

The test, and its null. What is on the web is not a random draw of a benchmark: flags and accuracy both cluster by
topic (MMLU's subjects, HellaSwag's activities) - an easy, popular subject is found more often *and* answered better,
with no contamination at all. Fisher's exact test on the pooled table (correct / incorrect by dirty / clean) reads
that as contamination: in a simulation of 10 topics x 10 rows, topic accuracies spread by 0.15 (sd) and the easier
half of the topics found on the web 5 x as often (rows flagged 0.5 v 0.1), correctness independent of the flag
within each topic, it flagged 21 % at alpha = 0.05 (2,000 draws, 2026-11-29; 8 % with whole topics found at 0.3).
So by default (``strata: topic``) the test compares dirty with clean rows *within* each declared topic
(``stats.clusters.TOPIC_KEYS``): the exact conditional test of independence in the 2 x 2 x K tables
(``stats.tests.stratified_exact_greater``, the exact Cochran-Mantel-Haenszel test), whose null - within a topic, a
row's being found on the web is unrelated to its being answered correctly - holds in that simulation: 3.2 %
flagged (exact and discrete, so at most alpha), and 77 % flagged with dirty rows 0.3 more often correct. A topic
whose rows are all dirty or all clean carries no within-topic evidence: its rows are counted
(``n_rows_one_sided_topics``) and, when no topic has both, the verdict is inconclusive with the reason. A benchmark
without declared topics (ARC, Winogrande) is one stratum: Fisher's one-sided exact test, as ``strata: none`` gives
everywhere (the pooled reading, for comparison with the report's tables). What no stratification removes:
within a topic, the items found on the web may still be easier ones (shorter, more common); a "contaminated" says
the dirty rows score higher than clean rows of their own topics, not that training on them caused it - a control
model's gap would be needed for that.

It applies to multiple-choice benchmarks only (``applies.needs_choices``): the plan skips it elsewhere, with the
reason.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contamray.methods.base import Applies, Method, Output, Outputs, Request, Verdict, register
from contamray.methods.closed.cell_rows import missing, row_failed, truthy
from contamray.records import Record
from contamray.stats.clusters import topic_key
from contamray.stats.tests import Stratum, stratified_exact_greater

NAME = "clean_dirty_eval"
SUBSETS = ("clean", "input_only", "input_and_label")
STRATA = ("topic", "none")


@dataclass(frozen=True)
class CleanDirtyConfig:
    """Parameters of ``clean_dirty_eval``.

    Worked example: 100 examples without declared topics, 80 clean with 40 correct (0.50), 20 input-and-label
    dirty with 16 correct (0.80): the difference 0.30 has one-sided Fisher p = 0.013 < 0.05: contaminated.

    - ``contamination_from``: label of the run's open-data method that splits the partition (required).
    - ``template``: the prompt; ``{input}`` is the question (each option follows after a space).
    - ``chat``: the prompt is a user turn in the model's chat template and each option the assistant's reply (an
      instruct model's format; every engine but an ``api: openai`` / ``openai_chat`` one).
    - ``strata``: ``topic`` (default) compares dirty and clean rows within each declared topic (MMLU's subject,
      HellaSwag's activity; one stratum where none is declared); ``none`` pools every row (Fisher's test on one
      table: confounded by topic, module docstring).
    - ``alpha``: significance level of the one-sided test.
    """

    contamination_from: str = ""
    template: str = "Question: {input}\nAnswer:"
    chat: bool = False
    strata: str = "topic"
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if not isinstance(self.contamination_from, str) or not self.contamination_from.strip():
            raise ValueError(
                f"{NAME}: contamination_from is empty; set it to the label of an open-data method of the run "
                "(e.g. methods.clean_dirty_eval.contamination_from=meteor_recall)"
            )
        if "{input}" not in self.template:
            raise ValueError(
                f"{NAME}: template={self.template!r} has no {{input}} placeholder for the question"
            )
        if self.strata not in STRATA:
            raise ValueError(f"{NAME}: strata={self.strata!r} is not one of {', '.join(STRATA)} "
                             f"(methods.{NAME}.strata=topic compares within declared topics)")  # fmt: skip
        if not 0.0 < float(self.alpha) < 1.0:
            raise ValueError(f"{NAME}: alpha={self.alpha!r} is invalid; expected a number in (0, 1)")


def prompt(record: Record, cfg: CleanDirtyConfig) -> str:
    return cfg.template.replace("{input}", record.input)


def option_requests(
    record: Record, text: str, continuations: Sequence[str] | None = None, chat: bool = False, tag: str = ""
) -> list[Request]:
    """The score requests of one multiple-choice example: its prompt ``text`` alone, and followed by each option's
    continuation (default: the option after a space, or with ``chat`` the option alone; ``choice_perplexities``
    reads them); none for an example without options. With ``chat`` the prompt is a user turn in the model's chat
    template and each continuation the assistant's reply (``Request.reply``), as lm-evaluation-harness scores
    multiple choice with ``--apply_chat_template``; no request for the prompt alone then, as each answer says where
    its reply starts (``Output.prompt_tokens``). ``tag`` prefixes the keys (a second prompt form of one example,
    ``prompt_forms``)."""
    if len(record.choices) < 2:
        return []
    after = continuations if continuations is not None else [
        choice if chat else f" {choice}" for choice in record.choices
    ]

    def scored(part: str, reply: str) -> Request:  # without chat: one text, the prompt and its continuation joined
        key = _key(record.id, f"{tag}/{part}" if tag else part)
        if chat:
            return Request(key, (record.id,), "score", text, chat=True, reply=reply)
        return Request(key, (record.id,), "score", text + reply)

    alone = [] if chat else [scored("prompt", "")]
    return alone + [scored(str(k), continuation) for k, continuation in enumerate(after)]


def gold_index(record: Record) -> int | None:
    """The correct option's position: the label's text if it is one option, else the stored key."""
    if record.choices.count(record.label) == 1:
        return record.choices.index(record.label)
    labels = list(record.meta.get("choice_labels") or [])
    if record.answer in labels:
        return labels.index(record.answer)
    if record.answer.strip().isdigit() and int(record.answer) < len(record.choices):
        return int(record.answer)
    return None


def _key(record_id: str, part: str) -> str:
    return f"{record_id}|{part}"


def _outputs(outputs: Mapping[str, Output] | Iterable[Any]) -> dict[str, Output]:
    items = outputs.values() if isinstance(outputs, Mapping) else outputs
    out = {}
    for item in items:
        o = item if isinstance(item, Output) else Output.from_row(dict(item))
        out[o.key] = o
    return out


def choice_perplexities(record: Record, outputs: dict[str, Output], tag: str = "", chat: bool = False) -> list[float]:
    """Perplexity of every option given the prompt (the requests of ``option_requests`` with ``tag`` and ``chat``);
    raises with the reason when it cannot. An option's tokens are those its answer scored beyond the prompt's: the
    prompt's own request's count, or in the chat form the position its answer gives (``prompt_tokens``: the user
    turn's tokens; the reply's log-probabilities start one before, as the first token has none)."""
    part = f"{tag}/" if tag else ""
    n = 0
    if not chat:
        ctx = outputs.get(_key(record.id, f"{part}prompt"))
        if ctx is None or ctx.error:
            raise ValueError(f"prompt score missing or failed ({ctx.error if ctx else 'no output'})")
        n = len(ctx.token_logprobs)
    values = []
    for k in range(len(record.choices)):
        full = outputs.get(_key(record.id, f"{part}{k}"))
        if full is None or full.error:
            raise ValueError(f"option {k} score missing or failed ({full.error if full else 'no output'})")
        if chat and full.prompt_tokens < 1:
            raise ValueError(f"option {k}'s chat answer does not say where its reply starts (no prompt_tokens "
                             "from the engine); score it with an engine that renders chat templates")  # fmt: skip
        continuation = full.token_logprobs[full.prompt_tokens - 1 if chat else n :]
        if not continuation:
            raise ValueError(f"option {k} added no tokens to the prompt (empty option?)")
        nll = -sum(continuation) / len(continuation)
        if not math.isfinite(nll) or nll > 700:  # NaN / infinite log-probabilities; exp() would overflow past 709
            raise ValueError(f"option {k}'s mean token log-probability is {-nll:.4g} (NaN, infinite or below -700: "
                             "not a usable score - an overflow in the engine's dtype?); score in float32 "
                             "(models.<name>.dtype=float32)")  # fmt: skip
        values.append(math.exp(nll))
    return values


def answered(
    record: Record, outputs: dict[str, Output], what: str, tag: str = "", chat: bool = False
) -> dict[str, Any]:
    """One multiple-choice example as the harness scores it: the options' perplexities, the prediction (the lowest;
    ties to the first), the gold option and ``correct`` - or ``error``, naming why it cannot be scored (``what``: the
    method, for the message; ``tag`` and ``chat``: the requests' prompt form)."""
    gold = gold_index(record)
    if len(record.choices) < 2:
        return {"error": f"example {record.id!r} of {record.partition!r} has no options; {what} scores "
                         "multiple-choice benchmarks (arc_challenge, hellaswag, mmlu, truthfulqa_mc, ...)"}  # fmt: skip
    if gold is None:
        return {"error": f"example {record.id!r}: the label {record.label!r} is not one of its options"}
    try:
        ppl = choice_perplexities(record, outputs, tag, chat)
    except ValueError as err:
        return {"error": f"example {record.id!r}: {err}"}
    prediction = min(range(len(ppl)), key=lambda k: (ppl[k], k))
    return {"perplexities": ppl, "prediction": prediction, "gold": gold, "correct": prediction == gold}


def strata_tables(dirty: list[tuple[str, bool]], clean: list[tuple[str, bool]]) -> list[Stratum]:
    """One 2 x 2 table per stratum from (stratum, correct) pairs of each side, strata in sorted order."""
    keys = sorted({k for k, _ in dirty} | {k for k, _ in clean})
    return [
        Stratum(sum(c for k, c in dirty if k == key), sum(k == key for k, _ in dirty),
                sum(c for k, c in clean if k == key), sum(k == key for k, _ in clean))
        for key in keys
    ]  # fmt: skip


def _undecidable(
    dirty: list[tuple[str, bool]], clean: list[tuple[str, bool]], tables: list[Stratum], floor: float,
    cfg: CleanDirtyConfig,
) -> str:
    """Why the accuracy comparison cannot decide, or "": a subset is empty, no stratum of ``tables`` holds both
    subsets, or even the most extreme tables with these margins (every stratum's correct answers in its dirty rows)
    would not reach ``alpha`` (``floor``: the p they would give)."""
    if not dirty or not clean:
        missing = "dirty" if not dirty else "clean"
        return (
            f"no {missing} example to compare with (methods.{cfg.contamination_from} found "
            f"{len(dirty)} dirty and {len(clean)} clean): an accuracy gap needs both; see that method's verdict"
        )
    if not any(t.compared for t in tables):
        return (
            f"no topic has both dirty and clean rows ({len(tables)} topics, each all dirty or all clean): within "
            f"topics there is nothing to compare, and across them a gap is the topics' difficulty; score more rows of "
            f"each topic (run.limit) or pool the topics (methods.{NAME}.strata=none, confounded by topic)"
        )
    if floor > cfg.alpha:
        within = " within topics" if len(tables) > 1 else ""
        return (
            f"{len(dirty)} dirty and {len(clean)} clean examples ({sum(c for _, c in dirty + clean)} correct): even "
            f"all correct answers in the dirty rows{within} would give p={floor:.3g} > alpha={cfg.alpha}; score more "
            f"rows (run.limit)"
        )
    return ""


@register
class CleanDirtyEval(Method):
    """Registered as ``clean_dirty_eval`` (family ``closed``; needs ``contamination_from``)."""

    name = NAME
    outputs = Outputs(score="correct", score_label="answered correctly (1) or not (0)", membership=None)
    applies = Applies(needs_choices=True)
    family = "closed"
    Config = CleanDirtyConfig
    engine_roles = ("target",)
    scores_text = True

    def requests(
        self, records: list[Record], cfg: CleanDirtyConfig, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        """Stage 0: score the prompt and prompt + each option (multiple-choice records only)."""
        if stage > 0:
            return []
        return [r for record in records for r in option_requests(record, prompt(record, cfg), chat=cfg.chat)]

    def score(self, records: list[Record], outputs: Any, cfg: CleanDirtyConfig, **extra: Any) -> list[dict]:
        """One row per example: option perplexities, prediction, gold, correct (or the error)."""
        by_key = _outputs(outputs or {})
        rows = []
        for record in records:
            row: dict[str, Any] = {"record_id": record.id, "partition": record.partition, "error": "",
                                   "stratum": topic_key(record.meta) if cfg.strata == "topic" else ""}  # fmt: skip
            row.update(answered(record, by_key, "clean-vs-dirty evaluation", chat=cfg.chat))
            rows.append(row)
        return rows

    def reduce(self, table: Any, cfg: CleanDirtyConfig) -> Verdict:
        """Accuracy on clean / input-only / input-and-label / all-dirty subsets; exact tests within topics."""
        frame = table if hasattr(table, "columns") else None
        rows = frame.to_dict("records") if frame is not None else [dict(r) for r in table]
        if not rows:
            raise ValueError(f"{NAME}.reduce: the table is empty; score at least one example")
        if not any("contamination_type" in r for r in rows):
            raise ValueError(
                f"{NAME}.reduce: the table has no contamination_type column: the runner must merge the "
                f"per-example results of methods.{cfg.contamination_from} (contamination_from) on record_id"
            )
        own = [r for r in rows if not truthy(r.get("is_reference"))]
        partitions = sorted({str(r.get("partition")) for r in own})
        # a row the open-data scan failed on has no contamination label (the scan reports such rows as not
        # contaminated): it is a failed row here, in neither subset
        unscanned = [r for r in own if not row_failed(r) and _scan_error(r)]
        ok = [r for r in own if not row_failed(r) and not _scan_error(r) and not missing(r.get("correct"))]
        unsplit = [r for r in ok if r.get("contamination_type") not in SUBSETS]
        unsplit_types = Counter(str(r.get("contamination_type")) for r in unsplit)
        ok = [r for r in ok if r.get("contamination_type") in SUBSETS]
        stratum = _stratum if cfg.strata == "topic" else (lambda _row: "")
        groups = {s: [(stratum(r), bool(r["correct"])) for r in ok if r["contamination_type"] == s] for s in SUBSETS}
        groups["dirty"] = groups["input_only"] + groups["input_and_label"]
        acc = {s: (sum(c for _, c in v) / len(v) if v else float("nan")) for s, v in groups.items()}
        clean = groups["clean"]
        details: dict[str, Any] = {
            "contamination_from": cfg.contamination_from,
            "alpha": cfg.alpha,
            "strata": cfg.strata,
            "null": (
                "within each declared topic, a row's dirty flag is unrelated to its being answered correctly (exact "
                "conditional test over the topics' 2 x 2 tables; one topic: Fisher's exact test); items found on the "
                "web may still be easier ones within a topic (module docstring)"
                if cfg.strata == "topic" else
                "accuracy independent of the dirty flag given the pooled table's margins (Fisher's exact test); not "
                "adjusted for topic: a gap may be what is on the web, not what contamination did (module docstring)"
            ),
            "n_unsplit": len(unsplit),  # label_only / frequent_only / template_only (or untyped): in neither subset
            "n_scan_failed": len(unscanned),  # the open-data scan failed on these rows: counted failed
            **{f"n_unsplit_{t}": n for t, n in sorted(unsplit_types.items())},
            **{f"n_{s}": len(v) for s, v in groups.items()},
            **{f"accuracy_{s}": a for s, a in acc.items()},
            "accuracy_all": sum(bool(r["correct"]) for r in ok) / len(ok) if ok else float("nan"),
        }
        p_value, floor = None, 1.0
        tables = {s: strata_tables(groups[s], clean) for s in ("dirty", "input_only", "input_and_label")}
        for s, subset_tables in tables.items():
            if any(t.compared for t in subset_tables):
                test = stratified_exact_greater(subset_tables)
                details[f"p_{s}_vs_clean"] = test.p_value
                details[f"difference_{s}_vs_clean"] = acc[s] - acc["clean"]
                if s == "dirty":
                    p_value, floor = test.p_value, test.detail["min_p"]
                    one_sided = [t for t in subset_tables if not t.compared]
                    details.update({
                        "n_strata": len(subset_tables),
                        "n_strata_compared": len(subset_tables) - len(one_sided),  # topics with dirty and clean rows
                        "n_rows_one_sided_topics": sum(t.n_a + t.n_b for t in one_sided),  # no within-topic evidence
                        "dirty_correct_expected": test.detail["expected"],  # under the null, given the margins
                        "odds_ratio_mh": test.detail["odds_ratio_mh"],
                    })  # fmt: skip
        statistic = acc["dirty"] - acc["clean"] if groups["dirty"] and clean else float("nan")
        n_dirty = len(groups["dirty"])
        verdict = Verdict(
            method=NAME,
            partition=partitions[0] if partitions else "",
            statistic=statistic,
            contaminated=p_value is not None and p_value <= cfg.alpha,  # as every test's decision (decision_at)
            p_value=p_value,
            min_p=floor if p_value is not None else None,
            rate=n_dirty / len(ok) if ok else None,
            n_examples=len(own),
            n_failed=sum(row_failed(r) for r in own) + len(unscanned),
            details=details,
        )
        if unscanned:
            details.setdefault("errors", [f"{r.get('record_id')}: the open-data scan ({cfg.contamination_from}) "
                                          f"failed: {_scan_error(r)}" for r in unscanned[:5]])  # fmt: skip
        reason = _undecidable(groups["dirty"], clean, tables["dirty"], floor, cfg)
        within = (f" within {details['n_strata_compared']} of {details['n_strata']} topics"
                  if details.get("n_strata", 1) > 1 else "")  # fmt: skip
        details["summary"] = reason or (
            f"accuracy dirty {acc['dirty']:.2f} (n={n_dirty}) vs clean {acc['clean']:.2f} (n={len(clean)}), "
            f"one-sided exact p={p_value:.3g}{within}"
        )
        return verdict.make_inconclusive(reason) if reason else verdict


def _stratum(row: Mapping[str, Any]) -> str:
    """The row's stratum (its declared topic, ``score``'s ``stratum``), "" when none."""
    value = row.get("stratum")
    return "" if missing(value) else str(value)


def _scan_error(row: Mapping[str, Any]) -> str:
    """The open-data scan's error on this row (merged by the runner as ``contamination_error``), "" when none."""
    value = row.get("contamination_error")
    return "" if missing(value) else str(value)
