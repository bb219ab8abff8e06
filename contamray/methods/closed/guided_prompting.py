"""Guided prompting: Golchin & Surdeanu, "Time Travel in LLMs: Tracing Data Contamination in Large
Language Models" (ICLR 2024, arXiv:2308.08493; code: github.com/shahriargolchin/time-travel-in-llms).

Idea: a model that saw a dataset partition can finish one of its instances when told where the
instance comes from. Each example's reference is cut into a first and a second piece; the model
completes the first piece twice, with a *guided* instruction naming the dataset and split and with a
*general* one that does not (``guided_prompts``). Both completions are scored against the true second
piece with ROUGE-L F1 (and BLEURT when available). Two partition-level decisions:

- Algorithm 1: contaminated if the overlap of guided completions is significantly larger than that of
  general ones. The paper uses a one-sided bootstrap test (10,000 resamples, alpha 0.05); here the
  default is a paired sign-flip permutation test on d = ROUGE-L(guided) - ROUGE-L(general) (below);
- Algorithm 2: a judge LLM (the paper: GPT-4, ``gpt-4-0613``, few-shot prompt of its Figure 2) labels
  each guided completion of the 10 sampled instances an exact / near-exact match of the second piece
  or not; contaminated if at least 1 exact or at least 2 near-exact matches.

Paper's setting (the defaults here unless noted): 10 random instances per partition (here Algorithm 1
uses every row the pipeline picks, ``run.limit``, and Algorithm 2 a seeded sample of ``judge_instances``
= 10 of them); chat models prompted through their chat template (``chat``); greedy decoding
(temperature 0; the authors allowed 500 new tokens, here ``max_tokens`` defaults to twice the second
piece's words); the first piece a random-length initial segment, in the authors' code 40-70 % of the
sentences when the text has several, else of the words (``min_frac``/``max_frac``,
``split_unit="auto"``); ROUGE-L and BLEURT-20; 10,000 bootstrap resamples (here ``n_resamples``: random
sign flips, used only beyond 30 non-zero differences, or the bootstrap variant's resamples), alpha 0.05;
judge thresholds 1 exact / 2 near-exact. The paper found Algorithm 2 with the GPT-4 judge the best
(92-100 % agreement with human experts over 28 partitions), ahead of Algorithm 1.

Where this implementation departs, and why:

- each example is split with its own seed derived from ``seed`` and the record id (the authors
  re-seed with 42 for every row, so every instance is cut at the same relative position), and both
  pieces keep at least ``min_piece_words`` words when the text is long enough (the authors can leave
  one side empty);
- paired tasks: a record with a ``prefix`` is given the prefix and asked for the whole ``reference``
  (NLI: sentence 1 -> sentence 2, as in the paper); NLI without a prefix is an error row;
- Algorithm 1's p-value (``algorithm1_test: sign_flip``, default) comes from a test computed under
  its null: a one-sided paired sign-flip permutation test (``contamray.stats.tests.sign_flip_greater``)
  of the per-example differences d = ROUGE-L(guided) - ROUGE-L(general), exact over the 2^m sign
  assignments of the m non-zero differences (m <= 30), else ``n_resamples`` seeded random sign vectors
  with the +1 correction. Null: for an instance the model never saw, the guided and the general prompt
  are exchangeable, so d is symmetric about 0. (A guided wording that changes completions of unseen
  instances too breaks that null; ``contamray calibrate`` measures the flag rate on public slices.) The
  paper's percentile bootstrap is kept (``algorithm1_test: bootstrap``) but its p is not computed under
  the null: in simulation under a symmetric null it flags 7.0-8.8 % of samples at nominal 5 % with
  n = 10 and 6.2-6.9 % with n = 20 (the sign-flip: 4.6-5.6 %; ``tests/test_stats_tests.py``);
- Algorithm 1 is ``inconclusive`` when the test cannot reach alpha: fewer than
  ``ceil(log2(1 / alpha))`` non-zero differences (5 at alpha 0.05: the exact sign-flip's smallest p is
  2^-m), the same rule for the bootstrap variant (whose smaller p-values there are not valid);
- Algorithm 2 judges the paper's 10 instances (``judge_instances``), not every example: the
  ``judge_instances`` examples with usable guided completions and the smallest hash of
  (``seed``, record id), a seeded random sample that does not depend on the order of the rows. The
  thresholds (1 exact / 2 near-exact) are the paper's for 10 instances: applied to all 20 rows of our
  default run, a 5 % false-"Yes" judge would flag a clean partition by 2 near-exact answers with
  probability 0.264 instead of 0.086. When fewer instances than ``judge_instances`` get a usable answer
  (a short partition, judge failures, answers with no yes/no): contaminated if the thresholds are still
  reached (more instances could only add matches), else ``inconclusive``; thresholds are not scaled.
  An answer with no yes/no (``unparsed``) is not a usable judgement (it would otherwise count as "No"
  and make a judge that never answers look like a clean verdict). A judge failure is recorded in the
  row's ``judge_error`` and leaves Algorithm 1's scores of that row in place;
- the judge must be another model than the target (the plan refuses otherwise) unless
  ``self_judge: true``; such verdicts say so (``details["self_judged"]``, and the summary);
- generation requests (guided, general, judge) go through the model's chat template when it has one
  (``chat: true``; the paper prompted chat models); ``chat: false`` sends the raw instruction;
- the bootstrap resamples (guided, general) *pairs* (``paired=True``): that reproduces the p-values
  published with the paper's results from the per-example scores beside them, while the authors'
  released code resamples the two score lists independently (``paired=False``), which ignores that
  both scores of an example share one reference and does not reproduce them. Scores are not rounded
  to 2 decimals as theirs were;
- ROUGE-L uses stemming (``rouge_stemmer``), as LLMSanitize does; the authors' code used HF
  ``evaluate``'s default (no stemming) - set ``rouge_stemmer: false`` to match it;
- BLEURT is computed only when the ``bleurt`` package is importable and ``bleurt_checkpoint`` points
  to a checkpoint (the paper: BLEURT-20). It is not a dependency of this project and cannot be fetched
  here, so by default the BLEURT columns are None and the verdict's details say why. BLEURT compares
  the second piece with the completion, like ROUGE-L (the authors scored the whole instance with
  BLEURT for single-instance tasks);
- QA / multiple-choice instructions are ours (``guided_prompts``); their ANSWER line is dropped when
  the gold answer text appears in the second piece (it would hand the model the target);
- LLMSanitize (ntunlp, ``model_methods/guided_prompting.py``) keeps only instances of more than two
  sentences (dropping one-sentence AG News items and every XSum summary), joins the sentences of a
  piece without spaces, passes hub ids as dataset names and has no Algorithm 2. Here one-sentence
  texts are split at words, pieces keep the text's own spacing, display names are the datasets' own
  ("AG News", "XSum"; ``dataset_names`` overrides) and Algorithm 2 is implemented.

Decision (``decision``): ``"auto"`` (default) uses Algorithm 2 when the judge runs, since the paper
found it the more accurate, and Algorithm 1 otherwise; ``"alg1"``, ``"alg2"`` or ``"either"`` force a
choice (``alg2``/``either`` need ``judge: true``). Both algorithms' results are always in
``Verdict.details`` (``alg1``, ``alg2``). The verdict says what decided: ``details["decided_by"]``
(``algorithm_1``, ``algorithm_2``, or ``algorithm_1+algorithm_2`` when ``either`` found both clean) and
``details["summary"]`` (one line). ``p_value`` is Algorithm 1's p only when Algorithm 1 decided (or
``either`` found both clean); when Algorithm 2 decided it is None and ``rate`` is the share of the
judged instances rated exact or near-exact, so the report shows the decision that was made (Algorithm
1's p stays in ``details["alg1"]``). ``statistic`` is always Algorithm 1's mean difference.

Per example: ``rougeL_diff`` = ROUGE-L(guided) - ROUGE-L(general), the score the report plots and the
membership score of instance-level AUC (``outputs``).

Requests: stage 0, two greedy ``generate`` requests per example on the target engine, keys
``"<record id>|guided"`` and ``"<record id>|general"``; stage 1 (only with ``judge: true``), one request
``"<record id>|judge"`` on the engine role ``"judge"`` for each of the ``judge_instances`` sampled
examples.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contamray.methods.base import (
    Applies,
    BenchmarkFacts,
    Method,
    Output,
    Outputs,
    Request,
    Sampling,
    Verdict,
    decision_at,
    register,
)
from contamray.methods.closed.cell_rows import output_map, row_failed, rows_of
from contamray.methods.closed.guided_prompts import (
    JUDGE_STOP,
    build_prompts,
    clean_completion,
    judge_prompt,
    parse_judge,
    shows_label,
)
from contamray.metrics.rouge import rouge_l_f1_many
from contamray.records import Record, partition_parts
from contamray.stats.bootstrap import bootstrap_greater
from contamray.stats.tests import sign_flip_greater, sign_flip_min_nonzero, sign_flip_nonzero

NAME = "guided_prompting"
DECISIONS = ("auto", "alg1", "alg2", "either")
SPLIT_UNITS = ("auto", "word")
ALGORITHM1_TESTS = ("sign_flip", "bootstrap")
JUDGED = ("exact", "near_exact", "none")  # usable judge answers ("unparsed" is not one)

# Display names the paper (and the datasets' own papers) use; keys are benchmark names or
# "<benchmark>/<config>" of the partition "<benchmark>/<config>/<split>".
DATASET_NAMES = {
    "ag_news": "AG News",
    "imdb": "IMDB",
    "yelp": "Yelp Review Full",
    "rte": "RTE",
    "wnli": "WNLI",
    "glue/rte": "RTE",
    "glue/wnli": "WNLI",
    "xsum": "XSum",
    "samsum": "SAMSum",
    "gsm8k": "GSM8K",
    "truthfulqa": "TruthfulQA",
    "truthfulqa_gen": "TruthfulQA",
    "truthfulqa_mc": "TruthfulQA",
    "truthful_qa": "TruthfulQA",
    "hellaswag": "HellaSwag",
    "arc": "ARC",
    "arc_challenge": "ARC-Challenge",
    "arc_easy": "ARC-Easy",
    "ai2_arc": "ARC",
    "mmlu": "MMLU",
    "winogrande": "WinoGrande",
}


@dataclass
class Config:
    """Parameters of guided prompting; defaults follow the paper (see the module docstring)."""

    seed: int = 0
    # split of single-instance references: the first piece covers min_frac..max_frac of the units
    min_frac: float = 0.4
    max_frac: float = 0.7
    split_unit: str = "auto"  # "auto": sentences when the text has several, else words; "word"
    min_piece_words: int = 3  # floor for both pieces (shrinks to half the words of short texts)
    # generation: 0 = twice the second piece's word count, clipped to [16, 512] tokens
    max_tokens: int = 0
    stop: tuple[str, ...] = ()
    chat: bool = True  # guided, general and judge prompts through the model's chat template (when it has one)
    # Algorithm 1
    rouge_stemmer: bool = True
    algorithm1_test: str = "sign_flip"  # "sign_flip" (valid under the null) or "bootstrap" (the paper's)
    n_resamples: int = 10_000  # Monte Carlo sign flips beyond 30 non-zero differences; bootstrap resamples
    alpha: float = 0.05
    paired: bool = True  # bootstrap only: resample (guided, general) pairs
    bleurt_checkpoint: str = ""
    # Algorithm 2
    judge: bool = False
    self_judge: bool = False  # allow the target to judge its own completions (labelled in the verdict)
    judge_instances: int = 10  # instances the judge sees (the paper's 10): a seeded sample of the partition
    judge_max_tokens: int = 10
    min_exact: int = 1
    min_near_exact: int = 2
    decision: str = "auto"
    dataset_names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stop = tuple(self.stop or ())
        self.dataset_names = dict(self.dataset_names or {})
        where = f"methods.{NAME}"
        if not 0.0 < self.min_frac <= self.max_frac < 1.0:
            raise ValueError(
                f"{where}: need 0 < min_frac <= max_frac < 1, got min_frac={self.min_frac}, "
                f"max_frac={self.max_frac} (the paper's code uses 0.4 and 0.7)"
            )
        if self.split_unit not in SPLIT_UNITS:
            raise ValueError(f"{where}.split_unit: {self.split_unit!r}; use one of {', '.join(SPLIT_UNITS)}")
        if self.min_piece_words < 1:
            raise ValueError(f"{where}.min_piece_words must be >= 1, got {self.min_piece_words}")
        if self.max_tokens < 0 or self.judge_max_tokens < 1:
            raise ValueError(f"{where}: max_tokens must be >= 0 (0 = derived) and judge_max_tokens >= 1")
        if self.n_resamples < 1 or not 0.0 < self.alpha < 1.0:
            raise ValueError(f"{where}: need n_resamples >= 1 and 0 < alpha < 1")
        if self.algorithm1_test not in ALGORITHM1_TESTS:
            raise ValueError(
                f"{where}.algorithm1_test: {self.algorithm1_test!r}; use one of {', '.join(ALGORITHM1_TESTS)}"
            )
        if self.judge_instances < 1:
            raise ValueError(f"{where}.judge_instances must be >= 1 (the paper: 10), got {self.judge_instances}")
        if not 1 <= self.min_exact <= self.judge_instances or not 1 <= self.min_near_exact <= self.judge_instances:
            raise ValueError(
                f"{where}: min_exact and min_near_exact must be in [1, judge_instances={self.judge_instances}], "
                f"got {self.min_exact} and {self.min_near_exact}"
            )
        if self.decision not in DECISIONS:
            raise ValueError(f"{where}.decision: {self.decision!r}; use one of {', '.join(DECISIONS)}")
        if self.decision in ("alg2", "either") and not self.judge:
            raise ValueError(
                f"{where}.decision={self.decision!r} needs the judge (Algorithm 2): set "
                f"{where}.judge=true and give a judge engine, or use decision 'alg1'"
            )

    @property
    def resolved_decision(self) -> str:
        if self.decision == "auto":
            return "alg2" if self.judge else "alg1"
        return self.decision


# ----------------------------------------------------------------------------- splitting

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


def _record_rng(seed: int, record_id: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1f{record_id}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def split_reference(text: str, record_id: str, cfg: Config) -> tuple[str, str]:
    """Cut ``text`` at a random word boundary into (first piece, second piece), both non-empty.

    The first piece covers a uniform random fraction in [min_frac, max_frac] of the text's sentences
    (``split_unit="auto"`` and several sentences, as the authors' code) or of its words, rounded, then
    moved if needed so both pieces keep ``min(min_piece_words, words // 2)`` words. The cut is drawn from
    a generator seeded by (cfg.seed, record_id), so it is the same in every process and run. Raises
    ValueError for texts of fewer than two words. Sentence ends are words ending in . ! ? (before an
    optional closing quote or bracket), not NLTK punkt (its data cannot be downloaded here), so an
    abbreviation such as "Ky." may count as one; the cut is still at a word boundary.
    """
    spans = [m.span() for m in _WORD.finditer(text)]
    n = len(spans)
    if n < 2:
        raise ValueError(f"has {n} word(s); a reference needs at least 2 words to be split into two pieces")
    floor = min(cfg.min_piece_words, n // 2)
    rng = _record_rng(cfg.seed, record_id)
    cut = None
    if cfg.split_unit == "auto":
        # word index after which a sentence ends (a word ending in . ! ? possibly before a quote)
        ends = [i + 1 for i, (a, b) in enumerate(spans[:-1]) if _SENTENCE_END.search(text[a:b])]
        if ends:
            units = len(ends) + 1
            k = round(rng.uniform(cfg.min_frac * units, cfg.max_frac * units))
            k = min(max(k, 1), units - 1)
            candidate = ends[k - 1]
            if floor <= candidate <= n - floor:
                cut = candidate
    if cut is None:
        cut = round(rng.uniform(cfg.min_frac * n, cfg.max_frac * n))
        cut = min(max(cut, floor), n - floor)
    return text[spans[0][0] : spans[cut - 1][1]], text[spans[cut][0] : spans[-1][1]]


# ----------------------------------------------------------------------------- per-example inputs


@dataclass(frozen=True)
class Pieces:
    """What the prompts and the scores of one example are built from."""

    first: str
    second: str
    paired: bool
    dataset: str
    split: str
    label: str  # the label shown in the prompts ("" when none)


def dataset_and_split(partition: str, names: Mapping[str, str] | None = None, who: str = NAME) -> tuple[str, str]:
    """The dataset's display name and the split named in the prompts, from ``<benchmark>/<config>/<split>``
    (a ``:<key>`` / ``:rows...`` suffix - one of several partitions read from one split - is not part of the
    split's name); ``names`` (then ``DATASET_NAMES``) maps the partition, ``<benchmark>/<config>`` or
    ``<benchmark>`` to the display name, else the benchmark's own name is used."""
    base = partition.split(":", 1)[0]
    try:
        bench, config, split = partition_parts(partition)
    except ValueError as exc:
        raise ValueError(
            f"{exc}; {who} names the dataset and split in its prompts (fix the benchmark adapter that built the record)"
        ) from None
    for table in (names or {}, DATASET_NAMES):
        for key in (base, f"{bench}/{config}", bench):
            if key in table:
                return table[key], split
    return bench, split


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def prepare(record: Record, cfg: Config) -> Pieces:
    """The pieces and prompt fields of one record; ValueError (naming the record) if it cannot be used."""
    where = f"record {record.id!r} of {record.partition!r}"
    try:
        dataset, split = dataset_and_split(record.partition, cfg.dataset_names)
        reference = record.reference.strip()
        prefix = record.prefix.strip()
        if not reference:
            raise ValueError("field 'reference' is empty; the adapter must set the text to reproduce")
        if prefix:
            first, second, paired = prefix, reference, True
        elif record.task == "nli":
            raise ValueError(
                "task 'nli' needs field 'prefix' (sentence 1) with 'reference' = sentence 2; "
                "fix the benchmark adapter"
            )
        else:
            try:
                first, second = split_reference(reference, record.id, cfg)
            except ValueError as err:
                raise ValueError(f"field 'reference' {err}") from None
            paired = False
        label = record.label.strip() if shows_label(record.task) else ""
        if record.task in ("question_answering", "multiple_choice") and label:
            if _normalise(label) in _normalise(second):
                label = ""
    except ValueError as err:
        raise ValueError(f"guided_prompting: {where}: {err}") from None
    return Pieces(first, second, paired, dataset, split, label)


def _max_tokens(pieces: Pieces, cfg: Config) -> int:
    if cfg.max_tokens:
        return cfg.max_tokens
    return int(min(512, max(16, 2 * len(pieces.second.split()))))


def _key(record_id: str, kind: str) -> str:
    return f"{record_id}|{kind}"


# ----------------------------------------------------------------------------- BLEURT (optional)


def bleurt_status(cfg: Config) -> str:
    """ "" when BLEURT can be computed, else why not."""
    if not cfg.bleurt_checkpoint:
        return (
            f"not computed: set methods.{NAME}.bleurt_checkpoint to a BLEURT checkpoint directory "
            "(the paper used BLEURT-20) and install the 'bleurt' package"
        )
    try:
        import bleurt.score  # noqa: F401
    except ImportError:
        return "not computed: the 'bleurt' package (google-research/bleurt) is not installed"
    return ""


def _bleurt_scores(references: list[str], candidates: list[str], cfg: Config) -> list[float]:
    from bleurt import score as bleurt_score

    scorer = bleurt_score.BleurtScorer(cfg.bleurt_checkpoint)
    return [float(s) for s in scorer.score(references=references, candidates=candidates)]


# ----------------------------------------------------------------------------- Algorithm 2's sample


def judge_rank(seed: int, record_id: str) -> int:
    """Sampling key of Algorithm 2: the judge sees the eligible examples with the smallest keys."""
    digest = hashlib.blake2b(f"{seed}\x1fjudge\x1f{record_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def judge_sample(record_ids: Iterable[str], cfg: Config) -> set[str]:
    """The ``judge_instances`` ids of ``record_ids`` with the smallest ``judge_rank``: a seeded random
    sample that does not depend on the order (or chunking) of the rows."""
    ranked = sorted(set(record_ids), key=lambda rid: (judge_rank(cfg.seed, rid), rid))
    return set(ranked[: cfg.judge_instances])


# ----------------------------------------------------------------------------- the two algorithms


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def algorithm1(guided: Sequence[float], general: Sequence[float], cfg: Config, metric: str) -> dict[str, Any]:
    """Algorithm 1 on paired scores: the configured one-sided test of guided > general, its decision
    (``contaminated`` / ``clean`` / ``inconclusive`` when the test cannot reach alpha) and why."""
    d = np.asarray(guided, dtype=np.float64) - np.asarray(general, dtype=np.float64)
    n, m, need = int(d.size), int(sign_flip_nonzero(d).size), sign_flip_min_nonzero(cfg.alpha)
    result: dict[str, Any] = {
        "metric": metric,
        "test": cfg.algorithm1_test,
        "n": n,
        "n_nonzero": m,
        "mean_guided": float(np.mean(guided)) if n else math.nan,
        "mean_general": float(np.mean(general)) if n else math.nan,
        "mean_difference": float(d.mean()) if n else math.nan,
        "p_value": None,
        "alpha": cfg.alpha,
        "min_nonzero": need,
    }
    if n:
        result.update(_algorithm1_test(d, guided, general, cfg))
    if m < need:
        result["decision"] = "inconclusive"
        result["reason"] = (
            f"Algorithm 1: {m} of {n} scored example(s) have guided and general {metric} scores that differ; a "
            f"test of the paired differences needs >= {need} non-zero ones to reach alpha={cfg.alpha:g} (the exact "
            f"sign-flip test's smallest p is 2^-{m} = {2.0 ** -m:.3g}) - raise run.limit (more rows) or max_tokens "
            "(longer completions differ more often)"
        )
    else:
        result["decision"] = decision_at(float(result["p_value"]), cfg.alpha)
    result["contaminated"] = result["decision"] == "contaminated"
    return result


def _algorithm1_test(
    d: np.ndarray, guided: Sequence[float], general: Sequence[float], cfg: Config
) -> dict[str, Any]:
    if cfg.algorithm1_test == "sign_flip":
        test = sign_flip_greater(d, n_resamples=cfg.n_resamples, seed=cfg.seed)
        return {
            "p_value": test.p_value,
            "exact": test.detail["exact"],
            "n_resamples": test.detail["n_resamples"],
            "min_p": test.detail["min_p"],
        }
    boot = bootstrap_greater(guided, general, n_resamples=cfg.n_resamples, seed=cfg.seed, paired=cfg.paired)
    return {
        "p_value": boot.p_value,
        "n_resamples": cfg.n_resamples,
        "paired": cfg.paired,
        "ci_low": boot.ci_low,
        "ci_high": boot.ci_high,
    }


def algorithm2(valid: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Algorithm 2 on the judged sample: counts, rate, decision and why (see the module docstring)."""
    answered = [r for r in valid if r.get("judge_verdict") in JUDGED]
    sample = judge_sample([str(r["record_id"]) for r in answered], cfg)
    verdicts = [r["judge_verdict"] for r in answered if str(r["record_id"]) in sample]
    n_exact, n_near = verdicts.count("exact"), verdicts.count("near_exact")
    k = cfg.judge_instances
    result: dict[str, Any] = {
        "judge_instances": k,
        "n_judged": len(verdicts),
        "n_exact": n_exact,
        "n_near_exact": n_near,
        "n_none": verdicts.count("none"),
        "n_unparsed": sum(r.get("judge_verdict") == "unparsed" for r in valid),
        "n_judge_failed": sum(row_failed(r, "judge_error") for r in valid),
        "min_exact": cfg.min_exact,
        "min_near_exact": cfg.min_near_exact,
        "rate": (n_exact + n_near) / len(verdicts) if verdicts else None,
        "self_judged": cfg.self_judge,
    }
    if n_exact >= cfg.min_exact or n_near >= cfg.min_near_exact:
        result["decision"] = "contaminated"
    elif len(verdicts) >= k:
        result["decision"] = "clean"
    else:
        result["decision"] = "inconclusive"
        result["reason"] = (
            f"Algorithm 2: the judge gave a usable Yes/No for {len(verdicts)} of the {k} instances its thresholds "
            f"(>= {cfg.min_exact} exact or >= {cfg.min_near_exact} near-exact) are defined on "
            f"({result['n_unparsed']} answer(s) without yes/no, {result['n_judge_failed']} judge failure(s)) and "
            f"too few matches to decide - raise run.limit to >= {k} rows, fix the judge failures, or use a judge "
            "that answers Yes/No"
        )
    result["contaminated"] = result["decision"] == "contaminated"
    return result


def decide(alg1: dict[str, Any], alg2: dict[str, Any] | None, mode: str) -> tuple[str, str, str]:
    """(decision, decided_by, reason) of the configured ``mode`` (``alg1``/``alg2``/``either``)."""
    if mode == "alg1" or alg2 is None:
        return alg1["decision"], "algorithm_1", alg1.get("reason", "")
    if mode == "alg2":
        return alg2["decision"], "algorithm_2", alg2.get("reason", "")
    if alg2["decision"] == "contaminated":
        return "contaminated", "algorithm_2", ""
    if alg1["decision"] == "contaminated":
        return "contaminated", "algorithm_1", ""
    if alg1["decision"] == alg2["decision"] == "clean":
        return "clean", "algorithm_1+algorithm_2", ""
    undecided = [(name, a) for name, a in (("algorithm_1", alg1), ("algorithm_2", alg2)) if a["decision"] != "clean"]
    reason = "decision 'either' needs both algorithms clean to say clean: " + "; ".join(
        a["reason"] for _, a in undecided
    )
    return "inconclusive", "+".join(name for name, _ in undecided), reason


def _p_text(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def summary(alg1: dict[str, Any], alg2: dict[str, Any] | None, decided_by: str) -> str:
    """One line: what decided and on what."""
    test = "sign-flip permutation test" if alg1["test"] == "sign_flip" else "percentile bootstrap (the paper's)"
    if alg1["test"] == "sign_flip" and alg1.get("exact") is not None:
        test += f", exact over 2^{alg1['n_nonzero']}" if alg1["exact"] else f", {alg1['n_resamples']} random flips"
    one = (
        f"Algorithm 1 ({test}) on {alg1['n']} pairs: mean ROUGE-L guided - general = "
        f"{alg1['mean_difference']:.3g}, p = {_p_text(alg1['p_value'])}"
    )
    if alg2 is None:
        return f"decided by {one}"
    judge = " (self-judged: the target judged its own completions)" if alg2["self_judged"] else ""
    two = (
        f"Algorithm 2{judge}: {alg2['n_exact']} exact / {alg2['n_near_exact']} near-exact of {alg2['n_judged']} "
        f"judged (of {alg2['judge_instances']} sampled; thresholds >= {alg2['min_exact']} exact or >= "
        f"{alg2['min_near_exact']} near-exact)"
    )
    if decided_by == "algorithm_2":
        return f"decided by {two}; {one} (not the decision)"
    if decided_by == "algorithm_1":
        return f"decided by {one}; {two} (not the decision)"
    return f"decided by both: {one}; {two}"


# ----------------------------------------------------------------------------- the method


@register
class GuidedPrompting(Method):
    name = NAME
    family = "closed"
    Config = Config
    engine_roles = ("target",)
    outputs = Outputs(score="rougeL_diff", score_label="ROUGE-L guided \u2212 general", membership="rougeL_diff")
    # the sign-flip test needs 5 non-zero differences to reach alpha 0.05 (plan_warnings uses cfg.alpha)
    applies = Applies(min_rows=sign_flip_min_nonzero(0.05))

    def engine_roles_for(self, cfg: Config) -> tuple[str, ...]:
        return ("target", "judge") if cfg.judge else ("target",)

    def plan_warnings(self, cfg: Config, bench: BenchmarkFacts) -> list[str]:
        if bench.limit is None:
            return []
        out = []
        need = sign_flip_min_nonzero(cfg.alpha)
        if bench.limit < need:
            out.append(
                f"{self.name} on {bench.name}: run.limit={bench.limit} rows, but Algorithm 1 needs >= {need} pairs "
                f"whose scores differ to reach alpha={cfg.alpha:g}; the verdict will be inconclusive - raise "
                f"benchmarks.{bench.name}.limit (or run.limit) to >= {need}"
            )
        if cfg.judge and bench.limit < cfg.judge_instances:
            out.append(
                f"{self.name} on {bench.name}: run.limit={bench.limit} rows, but Algorithm 2's thresholds are for "
                f"judge_instances={cfg.judge_instances} judged instances; without enough matches among fewer the "
                f"verdict will be inconclusive - raise benchmarks.{bench.name}.limit (or run.limit) to >= "
                f"{cfg.judge_instances}"
            )
        return out

    # -- requests

    def requests(
        self, records: list[Record], cfg: Config, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        seen: dict[str, str] = {}
        for r in records:
            if r.id in seen:
                raise ValueError(
                    f"guided_prompting: record id {r.id!r} occurs twice (partitions {seen[r.id]!r} and "
                    f"{r.partition!r}); request keys need unique ids - fix the benchmark adapter"
                )
            seen[r.id] = r.partition
        if stage == 0:
            return self._generation_requests(records, cfg)
        if stage == 1 and cfg.judge:
            return self._judge_requests(records, cfg, output_map(outputs or {}))
        return []

    def _generation_requests(self, records: list[Record], cfg: Config) -> list[Request]:
        out = []
        for record in records:
            try:
                pieces = prepare(record, cfg)
            except ValueError:
                continue  # score() reports it as an error row
            guided, general = build_prompts(
                record.task, pieces.dataset, pieces.split, pieces.first, pieces.label
            )
            sampling = Sampling(
                max_tokens=_max_tokens(pieces, cfg), temperature=0.0, top_p=1.0, stop=cfg.stop, seed=cfg.seed
            )
            for kind, text in (("guided", guided), ("general", general)):
                out.append(
                    Request(
                        key=_key(record.id, kind),
                        record_ids=(record.id,),
                        kind="generate",
                        text=text,
                        sampling=sampling,
                        engine="target",
                        stage=0,
                        chat=cfg.chat,
                    )
                )
        return out

    def _judge_requests(
        self, records: list[Record], cfg: Config, outputs: dict[str, Output]
    ) -> list[Request]:
        """One judge prompt for each of the ``judge_instances`` sampled examples with a usable guided completion."""
        eligible: dict[str, tuple[Record, Pieces, Output]] = {}
        for record in records:
            guided = outputs.get(_key(record.id, "guided"))
            if guided is None or guided.error:
                continue
            try:
                eligible[record.id] = (record, prepare(record, cfg), guided)
            except ValueError:
                continue
        sample = judge_sample(eligible, cfg)
        sampling = Sampling(
            max_tokens=cfg.judge_max_tokens, temperature=0.0, top_p=1.0, stop=JUDGE_STOP, seed=cfg.seed
        )
        return [
            Request(
                key=_key(record.id, "judge"),
                record_ids=(record.id,),
                kind="generate",
                text=judge_prompt(pieces.second, clean_completion(guided.text)),
                sampling=sampling,
                engine="judge",
                stage=1,
                chat=cfg.chat,
            )
            for rid, (record, pieces, guided) in eligible.items()
            if rid in sample
        ]

    # -- score

    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Config
    ) -> list[dict[str, Any]]:
        """One row per record: pieces, both completions, ROUGE-L F1 and their difference (and BLEURT), the
        judge's verdict for sampled records, error."""
        got = output_map(outputs)
        rows = [self._score_one(record, got, cfg) for record in records]
        if not bleurt_status(cfg):
            done = [r for r in rows if r["rougeL_guided"] is not None]
            if done:
                refs = [r["second_piece"] for r in done]
                guided = _bleurt_scores(refs, [r["guided_completion"] for r in done], cfg)
                general = _bleurt_scores(refs, [r["general_completion"] for r in done], cfg)
                for r, g, b in zip(done, guided, general):
                    r["bleurt_guided"], r["bleurt_general"] = g, b
        return rows

    @staticmethod
    def _score_one(record: Record, got: dict[str, Output], cfg: Config) -> dict[str, Any]:
        row: dict[str, Any] = {
            "record_id": record.id,
            "partition": record.partition,
            "task": record.task,
            "dataset": "",
            "split": "",
            "first_piece": "",
            "second_piece": "",
            "guided_completion": "",
            "general_completion": "",
            "rougeL_guided": None,
            "rougeL_general": None,
            "rougeL_diff": None,
            "bleurt_guided": None,
            "bleurt_general": None,
            "judge_answer": None,
            "judge_verdict": None,
            "judge_error": "",
            "error": "",
        }
        try:
            pieces = prepare(record, cfg)
        except ValueError as err:
            row["error"] = str(err)
            return row
        row.update(dataset=pieces.dataset, split=pieces.split, first_piece=pieces.first, second_piece=pieces.second)
        errors, texts = [], {}
        for kind in ("guided", "general"):
            key = _key(record.id, kind)
            output = got.get(key)
            if output is None:
                errors.append(f"no output for request {key!r}")
            elif output.error:
                errors.append(f"request {key!r} failed: {output.error}")
            else:
                texts[kind] = output.text
        if "guided" in texts:
            row["guided_completion"] = clean_completion(texts["guided"])
        if "general" in texts:
            row["general_completion"] = clean_completion(texts["general"])
        if len(texts) == 2:
            row["rougeL_guided"], row["rougeL_general"] = rouge_l_f1_many(
                [pieces.second, pieces.second],
                [row["guided_completion"], row["general_completion"]],
                stemmer=cfg.rouge_stemmer,
            )
            row["rougeL_diff"] = row["rougeL_guided"] - row["rougeL_general"]
        judge = got.get(_key(record.id, "judge")) if cfg.judge else None  # None: not in the judged sample
        if judge is not None and judge.error:
            row["judge_error"] = f"request {_key(record.id, 'judge')!r} failed: {judge.error}"
        elif judge is not None:
            row["judge_answer"] = judge.text.strip()
            row["judge_verdict"] = parse_judge(judge.text)
        row["error"] = "; ".join(errors)
        return row

    # -- reduce

    def reduce(self, table: Any, cfg: Config) -> Verdict:
        """Algorithm 1 (paired test on ROUGE-L), Algorithm 2 (judge counts on the sample) and the configured
        decision, saying which one decided (``details["decided_by"]``, ``details["summary"]``)."""
        rows = rows_of(table)
        partitions = sorted({str(r.get("partition", "")) for r in rows})
        if len(partitions) > 1:
            raise ValueError(
                f"guided_prompting.reduce: the table mixes partitions {partitions}; reduce one partition "
                "at a time"
            )
        failed = [r for r in rows if row_failed(r)]
        valid = [
            r for r in rows
            if not row_failed(r) and _number(r.get("rougeL_guided")) is not None
            and _number(r.get("rougeL_general")) is not None
        ]  # fmt: skip
        alg1 = algorithm1(
            [float(r["rougeL_guided"]) for r in valid], [float(r["rougeL_general"]) for r in valid], cfg, "ROUGE-L"
        )
        alg2 = algorithm2(valid, cfg) if cfg.judge else None
        decision, decided_by, reason = decide(alg1, alg2, cfg.resolved_decision)
        details: dict[str, Any] = {
            "decision": cfg.resolved_decision,
            "decided_by": decided_by,
            "summary": summary(alg1, alg2, decided_by),
            "alg1": alg1,
            "alg2": alg2,
            "self_judged": bool(cfg.judge and cfg.self_judge),
            **self._bleurt_details(valid, cfg),
        }
        if failed:
            details["errors"] = [f"{r.get('record_id')}: {r['error']}" for r in failed[:5]]
        judge_errors = [f"{r.get('record_id')}: {r['judge_error']}" for r in valid if row_failed(r, "judge_error")]
        if judge_errors:
            details["judge_errors"] = judge_errors[:5]
        by_alg1 = "algorithm_1" in decided_by
        return Verdict(
            method=NAME,
            partition=partitions[0] if partitions else "",
            statistic=alg1["mean_difference"],
            p_value=alg1["p_value"] if by_alg1 else None,
            min_p=alg1.get("min_p") if by_alg1 else None,  # the bootstrap variant's p has no such floor
            rate=alg2["rate"] if alg2 is not None and "algorithm_2" in decided_by else None,
            n_examples=len(rows),
            n_failed=len(failed),
            details=details,
            decision=decision,
            reason=reason,
        )

    @staticmethod
    def _bleurt_details(valid: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
        bleurt_rows = [
            r for r in valid
            if _number(r.get("bleurt_guided")) is not None and _number(r.get("bleurt_general")) is not None
        ]  # fmt: skip
        if not bleurt_rows:
            return {"alg1_bleurt": None, "bleurt": bleurt_status(cfg) or "not computed: no row has BLEURT scores"}
        guided = [float(r["bleurt_guided"]) for r in bleurt_rows]
        general = [float(r["bleurt_general"]) for r in bleurt_rows]
        return {"alg1_bleurt": algorithm1(guided, general, cfg, "BLEURT")}
