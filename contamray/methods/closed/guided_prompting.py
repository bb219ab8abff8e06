"""Guided prompting: Golchin & Surdeanu, "Time Travel in LLMs: Tracing Data Contamination in Large
Language Models" (ICLR 2024, arXiv:2308.08493; code: github.com/shahriargolchin/time-travel-in-llms).

Idea: a model that saw a dataset partition can finish one of its instances when told where the
instance comes from. Each example's reference is cut into a first and a second piece; the model
completes the first piece twice, with a *guided* instruction naming the dataset and split and with a
*general* one that does not (``guided_prompts``). Both completions are scored against the true second
piece with ROUGE-L F1 (and BLEURT when available). Two partition-level decisions:

- Algorithm 1: contaminated if the mean overlap of guided completions is significantly larger than
  that of general ones: one-sided bootstrap test (``contamray.stats.bootstrap``), 10,000 resamples,
  contaminated when p <= 0.05;
- Algorithm 2: a judge LLM (the paper: GPT-4, ``gpt-4-0613``, few-shot prompt of its Figure 2) labels
  each guided completion an exact / near-exact match of the second piece or not; contaminated if at
  least 1 exact or at least 2 near-exact matches.

Paper's setting (the defaults here unless noted): 10 random instances per partition (the pipeline picks the
examples); greedy decoding (temperature 0; the authors allowed 500 new tokens, here ``max_tokens``
defaults to twice the second piece's words); the first piece a random-length initial segment, in the
authors' code 40-70 % of the sentences when the text has several, else of the words
(``min_frac``/``max_frac``, ``split_unit="auto"``); ROUGE-L and BLEURT-20; 10,000 bootstrap resamples,
alpha 0.05; judge thresholds 1 exact / 2 near-exact. The paper found Algorithm 2 with the GPT-4 judge
the best (92-100 % agreement with human experts over 28 partitions), ahead of Algorithm 1.

Where this implementation departs, and why:

- each example is split with its own seed derived from ``seed`` and the record id (the authors
  re-seed with 42 for every row, so every instance is cut at the same relative position), and both
  pieces keep at least ``min_piece_words`` words when the text is long enough (the authors can leave
  one side empty);
- paired tasks: a record with a ``prefix`` is given the prefix and asked for the whole ``reference``
  (NLI: sentence 1 -> sentence 2, as in the paper); NLI without a prefix is an error row;
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
``Verdict.details``.

Requests: stage 0, two greedy ``generate`` requests per example on the target engine, keys
``"<record id>|guided"`` and ``"<record id>|general"``; stage 1 (only with ``judge: true``), one request
``"<record id>|judge"`` on the engine role ``"judge"``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contamray.methods.base import Method, Output, Request, Sampling, Verdict, register
from contamray.methods.closed.cell_rows import output_map, rows_of
from contamray.methods.closed.guided_prompts import (
    JUDGE_STOP,
    build_prompts,
    clean_completion,
    judge_prompt,
    parse_judge,
    shows_label,
)
from contamray.metrics.rouge import rouge_l_f1_many
from contamray.records import Record
from contamray.stats.bootstrap import bootstrap_greater

NAME = "guided_prompting"
DECISIONS = ("auto", "alg1", "alg2", "either")
SPLIT_UNITS = ("auto", "word")

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
    # Algorithm 1
    rouge_stemmer: bool = True
    n_resamples: int = 10_000
    alpha: float = 0.05
    paired: bool = True
    bleurt_checkpoint: str = ""
    # Algorithm 2
    judge: bool = False
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
        if self.min_exact < 1 or self.min_near_exact < 1:
            raise ValueError(f"{where}: min_exact and min_near_exact must be >= 1")
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


def _dataset_and_split(partition: str, cfg: Config) -> tuple[str, str]:
    parts = partition.split("/")
    if len(parts) < 2 or not all(p.strip() for p in parts):
        raise ValueError(
            f"partition {partition!r} is not '<benchmark>/<config>/<split>'; guided prompting needs the "
            "split and dataset name from it (fix the benchmark adapter that built the record)"
        )
    bench, split = parts[0], parts[-1]
    config = parts[1] if len(parts) > 2 else ""
    keys = [partition, f"{bench}/{config}", bench]
    for table in (cfg.dataset_names, DATASET_NAMES):
        for key in keys:
            if key in table:
                return table[key], split
    return bench, split


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def prepare(record: Record, cfg: Config) -> Pieces:
    """The pieces and prompt fields of one record; ValueError (naming the record) if it cannot be used."""
    where = f"record {record.id!r} of {record.partition!r}"
    try:
        dataset, split = _dataset_and_split(record.partition, cfg)
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


# ----------------------------------------------------------------------------- the method


def _failed(row: Mapping[str, Any]) -> bool:
    error = row.get("error")
    return isinstance(error, str) and bool(error.strip())


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


@register
class GuidedPrompting(Method):
    name = NAME
    family = "closed"
    Config = Config
    engine_roles = ("target",)

    def engine_roles_for(self, cfg: Config) -> tuple[str, ...]:
        return ("target", "judge") if cfg.judge else ("target",)

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
                    )
                )
        return out

    def _judge_requests(
        self, records: list[Record], cfg: Config, outputs: dict[str, Output]
    ) -> list[Request]:
        sampling = Sampling(
            max_tokens=cfg.judge_max_tokens, temperature=0.0, top_p=1.0, stop=JUDGE_STOP, seed=cfg.seed
        )
        out = []
        for record in records:
            guided = outputs.get(_key(record.id, "guided"))
            if guided is None or guided.error:
                continue
            try:
                pieces = prepare(record, cfg)
            except ValueError:
                continue
            out.append(
                Request(
                    key=_key(record.id, "judge"),
                    record_ids=(record.id,),
                    kind="generate",
                    text=judge_prompt(pieces.second, clean_completion(guided.text)),
                    sampling=sampling,
                    engine="judge",
                    stage=1,
                )
            )
        return out

    # -- score

    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Config
    ) -> list[dict[str, Any]]:
        """One row per record: pieces, both completions, ROUGE-L F1 (and BLEURT), judge verdict, error."""
        got = output_map(outputs)
        rows = []
        for record in records:
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
                "bleurt_guided": None,
                "bleurt_general": None,
                "judge_answer": None,
                "judge_verdict": None,
                "error": "",
            }
            try:
                pieces = prepare(record, cfg)
            except ValueError as err:
                row["error"] = str(err)
                rows.append(row)
                continue
            row.update(
                dataset=pieces.dataset,
                split=pieces.split,
                first_piece=pieces.first,
                second_piece=pieces.second,
            )
            errors = []
            kinds = ("guided", "general", "judge") if cfg.judge else ("guided", "general")
            texts: dict[str, str] = {}
            for kind in kinds:
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
            if "judge" in texts:
                row["judge_answer"] = texts["judge"].strip()
                row["judge_verdict"] = parse_judge(texts["judge"])
            if "guided" in texts and "general" in texts:
                row["rougeL_guided"], row["rougeL_general"] = rouge_l_f1_many(
                    [pieces.second, pieces.second],
                    [row["guided_completion"], row["general_completion"]],
                    stemmer=cfg.rouge_stemmer,
                )
            row["error"] = "; ".join(errors)
            rows.append(row)
        if not bleurt_status(cfg):
            done = [r for r in rows if r["rougeL_guided"] is not None]
            if done:
                refs = [r["second_piece"] for r in done]
                guided = _bleurt_scores(refs, [r["guided_completion"] for r in done], cfg)
                general = _bleurt_scores(refs, [r["general_completion"] for r in done], cfg)
                for r, g, b in zip(done, guided, general):
                    r["bleurt_guided"], r["bleurt_general"] = g, b
        return rows

    # -- reduce

    def reduce(self, table: Any, cfg: Config) -> Verdict:
        """Algorithm 1 (bootstrap on ROUGE-L), Algorithm 2 (judge counts) and the configured decision."""
        rows = rows_of(table)
        partitions = sorted({str(r.get("partition", "")) for r in rows})
        if len(partitions) > 1:
            raise ValueError(
                f"guided_prompting.reduce: the table mixes partitions {partitions}; reduce one partition "
                "at a time"
            )
        failed = [r for r in rows if _failed(r)]
        valid = [r for r in rows if not _failed(r) and _number(r.get("rougeL_guided")) is not None]
        guided = [float(r["rougeL_guided"]) for r in valid]
        general = [float(r["rougeL_general"]) for r in valid]

        alg1 = self._algorithm1(guided, general, cfg, "rougeL")
        details: dict[str, Any] = {"decision": cfg.resolved_decision, "alg1": alg1}
        bleurt_rows = [r for r in valid if _number(r.get("bleurt_guided")) is not None]
        if bleurt_rows:
            details["alg1_bleurt"] = self._algorithm1(
                [float(r["bleurt_guided"]) for r in bleurt_rows],
                [float(r["bleurt_general"]) for r in bleurt_rows],
                cfg,
                "bleurt",
            )
        else:
            details["alg1_bleurt"] = None
            details["bleurt"] = bleurt_status(cfg) or "not computed: no row has BLEURT scores"
        alg2 = self._algorithm2(valid, cfg) if cfg.judge else None
        details["alg2"] = alg2
        if failed:
            details["errors"] = [f"{r.get('record_id')}: {r['error']}" for r in failed[:5]]

        decision = cfg.resolved_decision
        a1 = bool(alg1["contaminated"])
        a2 = bool(alg2["contaminated"]) if alg2 else False
        contaminated = {"alg1": a1, "alg2": a2, "either": a1 or a2}[decision]
        return Verdict(
            method=NAME,
            partition=partitions[0] if partitions else "",
            statistic=alg1["mean_difference"],
            contaminated=contaminated,
            p_value=alg1["p_value"],
            rate=alg2["rate"] if alg2 else None,
            n_examples=len(rows),
            n_failed=len(failed),
            details=details,
        )

    @staticmethod
    def _algorithm1(guided: Sequence[float], general: Sequence[float], cfg: Config, metric: str) -> dict:
        result: dict[str, Any] = {
            "metric": metric,
            "n": len(guided),
            "mean_guided": float(np.mean(guided)) if guided else math.nan,
            "mean_general": float(np.mean(general)) if general else math.nan,
            "mean_difference": float(np.mean(guided) - np.mean(general)) if guided else math.nan,
            "p_value": None,
            "alpha": cfg.alpha,
            "n_resamples": cfg.n_resamples,
            "paired": cfg.paired,
            "contaminated": False,
        }
        if len(guided) < 2:
            result["reason"] = f"{len(guided)} scored example(s); the bootstrap test needs at least 2"
            return result
        test = bootstrap_greater(
            guided, general, n_resamples=cfg.n_resamples, seed=cfg.seed, paired=cfg.paired
        )
        result.update(
            p_value=test.p_value,
            ci_low=test.ci_low,
            ci_high=test.ci_high,
            contaminated=test.p_value <= cfg.alpha,
        )
        return result

    @staticmethod
    def _algorithm2(valid: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
        verdicts = [r.get("judge_verdict") for r in valid if r.get("judge_verdict")]
        counts = {v: verdicts.count(v) for v in ("exact", "near_exact", "none", "unparsed")}
        return {
            "n_judged": len(verdicts),
            "n_exact": counts["exact"],
            "n_near_exact": counts["near_exact"],
            "n_none": counts["none"],
            "n_unparsed": counts["unparsed"],
            "min_exact": cfg.min_exact,
            "min_near_exact": cfg.min_near_exact,
            "rate": (counts["exact"] + counts["near_exact"]) / len(verdicts) if verdicts else None,
            "contaminated": counts["exact"] >= cfg.min_exact or counts["near_exact"] >= cfg.min_near_exact,
        }
