"""CDD, contamination detection via output distribution (Dong et al., ACL Findings 2024, arXiv:2402.15938).
Dong, Jiang, Liu, Jin and Li, "Generalization or Memorization: Data Contamination and Trustworthy Evaluation
for Large Language Models" (Findings of ACL 2024; code github.com/YihongDong/CDD-TED4LLMs).

Idea: training on an example makes the model's output distribution on its prompt *peaked*: samples drawn
at a temperature stay close to the greedy output. Per example, the model answers the example's prompt once
greedily (``s_0``) and ``n_samples`` times at ``temperature`` (``s_1 .. s_n``); each sample's token-level edit
distance to the greedy output, over the first ``max_tokens`` generated tokens, gives the distribution
``rho*(d) = (1/n) #{i : ED(s_i, s_0) = d}``; the peakedness is its mass near zero,
``Peak = sum_{d <= alpha * l} rho*(d)``, the share of samples within ``alpha * l`` edits of the greedy output,
with ``l`` the longest of the outputs (in tokens, after the cut); the example is leaked when ``Peak > xi``.
The paper's parameters are the defaults: ``n_samples`` = 50 samples at ``temperature`` = 0.8 (``top_p`` 1,
no top-k), greedy decoding for ``s_0``, the first ``max_tokens`` = 100 tokens, ``peak_alpha`` = 0.05 (the
paper's alpha) and ``xi`` = 0.01 (with 50 samples: leaked as soon as one sample is within the threshold). The
prompt is the example's question or input alone (``fields``: ``input``; ``chat: false`` sends it as raw text,
as to the base models the paper fine-tuned; ``chat: true`` wraps it in the model's chat template; ``chat: both``
asks in both forms and tests both, see ``reduce``).

Requests: two ``generate`` requests per example on the target engine, key ``"<record id>|samples"`` with
``Sampling(n=n_samples, temperature, seed)`` - one request, so an engine that shares a prompt between samples
reads it once (vLLM) and the samples are fixed by ``seed`` whatever batch they land in - and
``"<record id>|greedy"`` at temperature 0 (under ``chat: both`` the same two again in the chat form, keys
``"<record id>|chat/samples"`` and ``"<record id>|chat/greedy"``). All use the generated token ids
(``Output.token_ids``), so the distance is counted in the model's own tokens.

Per example (``score``): ``peakedness`` (the score the report plots and the membership score of
instance-level ROC AUC; higher = more likely seen), ``leaked`` (``peakedness > xi``), ``mean_edit_distance``,
``max_len`` (l), ``threshold`` (the largest distance counted, ``floor(peak_alpha * l)``), ``greedy_tokens`` and
the greedy completion (``greedy``, evidence).

Partition decision (``reduce``): the paper reports the leaked share of a benchmark (``rate`` here), which has
no null to test against: a model that is merely confident on a prompt it never saw (a short factual answer,
a formulaic continuation) is peaked too, so a leaked share says as much about the benchmark's prompts as
about training. The decision therefore compares the partition's per-example peakedness with that of a
held-out partition of the same benchmark known unseen (``reference``, ``mode: heldout``), by the one-sided
Mann-Whitney test over sampling units of the membership scores (``heldout_test.HeldoutTest``: its null,
units, plan checks and instance AUC ``auc_member`` when membership labels exist). Inconclusive without a
reference, with fewer than 10 scored rows a side, or when no ranking of the units could reach ``alpha``.
``statistic`` is the AUC of partition vs reference; ``details`` has the leaked share of both sides.

Both prompt forms (``chat: both``, not in the paper; ``prompt_forms``): a model is peaked on the prompts in the
form it was trained on - measured on the embedded model, rows leaked as conversations were found with the chat
form only (the raw form peaked on both sides), and the tool cannot know how a model was contaminated. Each example
is asked in both forms (the raw form's requests and columns are those of ``chat: false``; the chat form's keys
``<id>|chat/...`` and columns ``peakedness_chat``, ``leaked_chat``, ...), and the partition is decided by the
joint test of the two forms over the same units (``prompt_forms.combine_forms``: valid whatever their dependence;
Bonferroni when a row failed in one form only; inconclusive when no outcome could reach alpha).

Where this departs from the paper or well-known implementations, and why:

- the distances are over the token ids the model generated; the authors' code (``CDD.py``) decodes the
  outputs and re-tokenises them (and, for their code benchmarks, first cuts each output at a blank-line run
  or a code fence); the paper defines the distance on tokens;
- ``l`` is the longest output among the greedy one and the samples after the cut, as in the authors' code
  (the paper: the maximum length of the outputs); a distance counts when ``d <= peak_alpha * l``;
- the partition decision is the held-out test above, not the leaked share (see ``reduce``); the authors'
  "real-world" setting (``alpha`` 0, ``xi`` 0.2 for precision) is a choice of ``peak_alpha`` / ``xi`` here;
- LLMSanitize (``closed_data_methods/cdd.py``) measures the edit distance on the decoded *characters*,
  takes ``l`` as the *shortest* sample (in characters, capped at 100), counts the samples within
  ``ceil(alpha * l)`` without dividing by their number - so its ``peak > xi`` means "at least one sample
  within the threshold" whatever ``xi`` below 1 - draws 20 samples and 128 tokens by default, and decides
  by the leaked share alone. Here the paper's definitions hold: token-level distances, the longest output,
  the share of samples, 50 samples of 100 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contamray.methods.base import Applies, Output, Outputs, Request, Sampling, Verdict, register
from contamray.methods.closed.cell_rows import finite, row_failed, rows_of, truthy
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, HeldoutTest, unit_columns
from contamray.methods.closed.likelihood_text import check_fields, empty_message, is_empty, serialise
from contamray.methods.closed.prompt_forms import BOTH, TwoPromptForms, chat_column, chat_option, prompt_forms
from contamray.records import Record

NAME = "cdd"
WHERE = f"methods.{NAME}"
CHAT_COLUMN = chat_column("peakedness")  # the chat form's score under chat: both


@dataclass
class Config(HeldoutConfig):
    """Parameters of CDD; defaults are the paper's (see the module docstring). The partition test's keys
    (``reference``, ``mode``, ``alpha``, ``units``, ``block_rows``) come from ``HeldoutConfig``."""

    fields: tuple[str, ...] = ("input",)  # the prompt: the example's question / input
    format: str = "text"
    chat: bool | str = False  # true: the prompt as a user turn of the chat template (when it has one); "both"
    n_samples: int = 50  # the paper's 50 samples ...
    temperature: float = 0.8  # ... at temperature 0.8
    top_p: float = 1.0
    max_tokens: int = 100  # the first 100 generated tokens: the generation limit and the compared window
    seed: int = 0  # fixes the samples of every prompt
    peak_alpha: float = 0.05  # the paper's alpha: samples within floor(peak_alpha * l) edits count
    xi: float = 0.01  # leaked when peakedness > xi
    method_name: ClassVar[str] = NAME

    def __post_init__(self) -> None:
        super().__post_init__()
        self.fields = check_fields(self.fields, self.format, WHERE)
        if self.format == "raw":
            raise ValueError(f"{WHERE}.format: raw is the whole dataset row, answer included - not a prompt to sample "
                             "from; use text or json with fields (the input)")  # fmt: skip
        self.chat = chat_option(self.chat, WHERE)
        if self.n_samples < 1:
            raise ValueError(f"{WHERE}.n_samples must be >= 1 (the paper: 50), got {self.n_samples}")
        if not self.temperature > 0:
            raise ValueError(
                f"{WHERE}.temperature must be > 0 (the paper: 0.8): the samples are compared with the greedy "
                f"output, got {self.temperature}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"{WHERE}.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"{WHERE}.max_tokens must be >= 1 (the paper: 100), got {self.max_tokens}")
        if not 0.0 <= self.peak_alpha <= 1.0:
            raise ValueError(f"{WHERE}.peak_alpha must be in [0, 1] (the paper: 0.05), got {self.peak_alpha}")
        if not 0.0 <= self.xi < 1.0:
            raise ValueError(f"{WHERE}.xi must be in [0, 1) (the paper: 0.01), got {self.xi}")


# ----------------------------------------------------------------------------- the arithmetic


def edit_distances(greedy: Sequence[int], samples: Sequence[Sequence[int]]) -> list[int]:
    """Levenshtein distance (insertion, deletion, substitution: 1 each) of each sample to ``greedy``, in tokens.

    One dynamic-programming row per greedy token, all samples at once (padded; a cell depends only on cells
    at or left of it, so padding never reaches a sample's own last cell); insertions along a row are the
    running minimum of ``row[k] - k``, plus ``j``.
    """
    if not samples:
        return []
    lengths = np.asarray([len(s) for s in samples], dtype=np.int64)
    width = int(lengths.max())
    tokens = np.full((len(samples), width), -1, dtype=np.int64)  # token ids are >= 0: padding matches nothing
    for i, sample in enumerate(samples):
        tokens[i, : len(sample)] = sample
    cols = np.arange(width + 1, dtype=np.int64)
    row = np.tile(cols, (len(samples), 1))  # empty greedy prefix: j insertions
    for i, token in enumerate(greedy, start=1):
        new = np.empty_like(row)
        new[:, 0] = i
        new[:, 1:] = np.minimum(row[:, :-1] + (tokens != int(token)), row[:, 1:] + 1)
        row = np.minimum.accumulate(new - cols, axis=1) + cols
    return row[np.arange(len(samples)), lengths].astype(int).tolist()


def peak_threshold(max_len: int, peak_alpha: float) -> int:
    """The largest edit distance counted as "close": ``floor(peak_alpha * l)`` (``d <= alpha * l``)."""
    return int(math.floor(peak_alpha * max_len + 1e-9))


def peakedness(distances: Sequence[int], max_len: int, peak_alpha: float) -> float:
    """``sum_{d <= alpha * l} rho*(d)``: the share of samples within ``peak_alpha * max_len`` edits."""
    if not distances:
        raise ValueError("peakedness of no samples is undefined")
    limit = peak_threshold(max_len, peak_alpha)
    return sum(d <= limit for d in distances) / len(distances)


def measure(greedy: Sequence[int], samples: Sequence[Sequence[int]], cfg: Config) -> dict[str, Any]:
    """The per-example columns from the greedy ids and the samples' ids (each cut to ``max_tokens``)."""
    g = list(greedy)[: cfg.max_tokens]
    s = [list(x)[: cfg.max_tokens] for x in samples]
    distances = edit_distances(g, s)
    max_len = max([len(g), *(len(x) for x in s)])
    peak = peakedness(distances, max_len, cfg.peak_alpha)
    return {
        "peakedness": peak,
        "leaked": bool(peak > cfg.xi),
        "mean_edit_distance": float(np.mean(distances)),
        "exact_share": sum(d == 0 for d in distances) / len(distances),
        "max_len": max_len,
        "threshold": peak_threshold(max_len, cfg.peak_alpha),
        "n_samples": len(s),
        "greedy_tokens": len(g),
    }


# ----------------------------------------------------------------------------- the method


def _key(record_id: str, kind: str) -> str:
    return f"{record_id}|{kind}"


def _token_ids(got: Mapping[str, Output], key: str, expected: int) -> list[list[int]]:
    """The generated ids of ``key``'s ``expected`` samples; ValueError saying what the engine returned."""
    out = got.get(key)
    if out is None:
        raise ValueError(f"no engine answer for {key!r}")
    if out.error:
        raise ValueError(f"{key}: the engine failed: {out.error}")
    if not out.token_ids:
        raise ValueError(
            f"{key}: the engine returned no generated token ids; CDD counts edit distances in tokens, so it needs "
            "an engine that returns them (transformers or vLLM)"
        )
    if len(out.token_ids) != expected:
        raise ValueError(f"{key}: {expected} sample(s) asked for, the engine returned {len(out.token_ids)}")
    return [list(ids) for ids in out.token_ids]


@register
class CDD(TwoPromptForms, HeldoutTest):
    """CDD peakedness: share of 50 samples (T 0.8) within 0.05 l token edits of the greedy output (Dong et al. 2024)."""

    name = NAME
    Config = Config
    outputs = Outputs(
        score="peakedness",
        score_label="CDD peakedness: share of samples within peak_alpha * l token edits of the greedy output "
        "(higher = member)",
        membership="peakedness",
    )
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)
    tie_hint = "no sample close to the greedy output"

    def requests(self, records: list[Record], cfg: Config, stage: int, outputs: dict[str, Output]) -> list[Request]:
        if stage > 0:
            return []
        sampled = Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                           n=cfg.n_samples)  # fmt: skip
        greedy = Sampling(max_tokens=cfg.max_tokens, temperature=0.0, seed=cfg.seed)
        out: list[Request] = []
        for record in records:
            if is_empty(record, cfg.fields, cfg.format):
                continue  # score() reports it
            prompt = serialise(record, cfg.fields, cfg.format)
            for tag, chat in prompt_forms(cfg.chat):
                for kind, sampling in (("samples", sampled), ("greedy", greedy)):
                    out.append(Request(key=_key(record.id, f"{tag}/{kind}" if tag else kind), record_ids=(record.id,),
                                       kind="generate", text=prompt, sampling=sampling, chat=chat))  # fmt: skip
        return out

    def _score_one(self, record: Record, got: dict[str, Output], cfg: Config) -> dict[str, Any]:
        """One row per record (``HeldoutTest.score``): the module docstring's per-example columns."""
        row: dict[str, Any] = {
            **unit_columns(record),
            "peakedness": None,
            "leaked": None,
            "mean_edit_distance": None,
            "greedy": "",
            "error": "",
        }
        if is_empty(record, cfg.fields, cfg.format):
            row["error"] = empty_message(record, cfg.fields, cfg.format)
            return row
        for tag, _ in prompt_forms(cfg.chat):
            kind = f"{tag}/" if tag else ""
            try:
                greedy = _token_ids(got, _key(record.id, f"{kind}greedy"), 1)[0]
                samples = _token_ids(got, _key(record.id, f"{kind}samples"), cfg.n_samples)
            except ValueError as err:
                row["error"] = f"record {record.id!r}: {err}"
                return row
            suffix = f"_{tag}" if tag else ""
            row.update({f"{name}{suffix}": value for name, value in measure(greedy, samples, cfg).items()})
            row[f"greedy{suffix}"] = got[_key(record.id, f"{kind}greedy")].text
        return row

    def score_columns(self, cfg: Config) -> list[str]:
        """The chat form's peakedness is tested beside the raw form's under ``chat: both``."""
        return [CHAT_COLUMN] if cfg.chat == BOTH else []

    def reduce(self, table: Any, cfg: Config) -> Verdict:
        """The held-out test on ``peakedness`` (``HeldoutTest.reduce``); ``rate`` is the paper's leaked share."""
        verdict = super().reduce(table, cfg)
        rows = rows_of(table)
        own = leaked_share([r for r in rows if not truthy(r.get("is_reference"))])
        ref = leaked_share([r for r in rows if truthy(r.get("is_reference"))])
        verdict.rate = own
        verdict.details.update(peak_alpha=cfg.peak_alpha, xi=cfg.xi, n_samples=cfg.n_samples,
                               leaked_share=own, leaked_share_reference=ref)  # fmt: skip
        shares = f"{_percent(own)} of the partition"
        if ref is not None:
            shares += f", {_percent(ref)} of the reference"
        if cfg.chat == BOTH:
            own_chat = leaked_share([r for r in rows if not truthy(r.get("is_reference"))], "_chat")
            ref_chat = leaked_share([r for r in rows if truthy(r.get("is_reference"))], "_chat")
            verdict.details.update(leaked_share_chat=own_chat, leaked_share_reference_chat=ref_chat)
            shares += f" (chat form: {_percent(own_chat)}" + (f", {_percent(ref_chat)})" if ref is not None else ")")
        verdict.details["summary"] = (
            f"{verdict.details.get('summary', '')}; the paper's leaked share (peakedness > xi {cfg.xi}): {shares}"
        )
        return verdict


def leaked_share(rows: list[dict[str, Any]], suffix: str = "") -> float | None:
    """Share of scored rows (no error, a peakedness) flagged leaked; None when no row was scored. ``suffix``:
    ``"_chat"`` for the chat form's columns under ``chat: both``."""
    column = f"peakedness{suffix}"
    scored = [r for r in rows if not row_failed(r) and finite(r.get(column)) is not None]
    if not scored:
        return None
    return sum(truthy(r.get(f"leaked{suffix}")) for r in scored) / len(scored)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"
