"""Per-example membership scores from token log-probabilities, and their partition-level test.

One module for six closely related reference-free (and one reference-model) detectors, because they
differ only in the number they compute from the same per-token scores. Every score is oriented so
that **higher means more likely seen in training** (the ``score`` column):

- ``min_k`` - Min-K% Prob, Shi et al., "Detecting Pretraining Data from Large Language Models"
  (ICLR 2024, arXiv:2310.16789; code github.com/swj0419/detect-pretrain-code): the mean of the k %
  lowest token log-probabilities. The paper sweeps k in {5, 10, 20, 30, 40, 50, 60} % and recommends
  k = 20 %; every k of ``ks`` is reported, ``k`` decides.
- ``min_k_plus_plus`` - Min-K%++, Zhang et al., "Min-K%++: Improved Baseline for Detecting Pre-Training
  Data from Large Language Models" (ICLR 2025, arXiv:2404.02936; code github.com/zjysteven/mink-plus-plus):
  per token ``(log p(x_t) - mu_t) / sigma_t`` with ``mu_t``, ``sigma_t`` the mean and standard deviation
  of ``log p(z)`` under ``z ~ p(. | x_<t)`` over the whole vocabulary, then the mean of the k % lowest.
  The authors' code sweeps k in {10, ..., 100} %; ``k`` defaults to 20 % (MIMIR's default, the one the
  Min-K% paper recommends). Needs ``vocab_stats`` from the engine: backend ``hf``.
- ``perplexity`` - the loss attack (Yeom et al. 2018; the "PPL" baseline of Carlini et al. 2021 and
  Shi et al.): mean token log-probability, i.e. minus log-perplexity.
- ``zlib_ratio`` - Carlini et al., "Extracting Training Data from Large Language Models" (USENIX
  Security 2021): log-perplexity over zlib entropy; here mean log-probability / zlib-compressed bytes,
  as the Min-K%++ code (Shi et al.'s ``log(ppl) / zlib`` with the sign flipped).
- ``lowercase_ratio`` - Carlini et al. 2021: log-perplexity of the lowercased text over that of the
  text: ``mean_logprob(lower) / mean_logprob(text)``.
- ``reference_ratio`` - Carlini et al. 2021's reference-model ("Small"/"Ref") attack: log-perplexity
  of the target minus that of a reference model (the log of the perplexity ratio), sign flipped:
  ``mean_logprob_target - mean_logprob_reference``. The reference model is the engine role
  ``"reference"`` (a second model; requests carry ``engine="reference"``).

The text of an example is its configured ``fields`` (``likelihood_text``). A text longer than
``context_len`` tokens is scored by the engine in rolling windows over its token ids, like the sharded
test (``likelihood_windows``: one request, ``Output.n_windows``), so no token is cut off.

Prompt forms (``chat``, not in the papers, which score raw text): ``chat: false`` (the papers' form, this Config's
default for a caller of the library) scores the serialised ``fields``; a run's default (``conf/method/*.yaml``) is
``both``, since an audit does not know the format a model was trained in. ``chat: true`` writes the example as a
conversation - its input the user's turn in the model's chat template (with the assistant's generation prompt), its
label the assistant's reply, as supervised fine-tuning data and an injected row of ``format: chat`` are written - and
scores the reply's tokens only (one request for the conversation; the engine says where the reply starts,
``Output.prompt_tokens``, from the tokenizer: the user's turn is not scored on its own; the zlib ratio compresses the
reply). ``chat: both`` scores both forms and decides by one joint test of the two over the same units
(``prompt_forms``; columns of the chat form end in ``_chat``). Why: a chat model tuned with the loss on its replies
only learns the answers given the rendered question, not the raw text. Measured by hand (2026-11-29,
the embedded model, 16 ARC-Challenge and 16 GSM8K rows as conversations, 3 epochs at lr 3e-4, rows 16-31 the
held-out, Mann-Whitney p): loss on the replies only - ARC raw form Min-K% p = 0.17, Min-K%++ 0.87, perplexity 0.037;
chat form 7.7e-7 for all three (the smallest p of 16 against 16); GSM8K (long solutions) raw 4.9e-4 / 3.0e-5 /
9.4e-6, chat 7.7e-7; loss on every token of the conversation - raw ARC Min-K% 1.2e-4, GSM8K 7.7e-7: the raw form
finds it too. Unseen pairs (rows 32-47 against 48-63, both forms): p >= 0.12 after the replies-only tune; after
the all-token tune one of 8 at 0.04 (the chat form's perplexity on ARC), the others >= 0.17. The replies-only case
on ARC alone is a test, the model built by the injection (``inject ... format: chat, loss: replies``, 3 shuffled
copies packed, 1 epoch; ``tests/test_membership_scores.py``: raw form p = 0.17 / 0.92 / 0.068 for Min-K% / Min-K%++ /
perplexity, chat form 1.3e-5 / 2.3e-6 / 1.6e-6, the unseen pair clean), as are the forms' arithmetic and decision.
Under the base model, on the README's calibration slices (5 contiguous slices of 20 rows of ARC, HellaSwag, MMLU and
Winogrande; ``contamray calibrate``, which runs the presets), ``chat: both`` flagged 3 of 50 decided tests of the five
scores with Bonferroni (2026-11-29), 4 of 53 with the joint test of the two forms, and 4 of 88 once the joint test
came to use the forms' sum where their larger statistic cannot reach alpha (2026-11-30, ``prompt_forms``): 3 or 4
sampling units a side on Winogrande and HellaSwag, where the two forms rank different units highest, so the larger
statistic's smallest p is 2 / C(7, 3) = 0.057; the sum's (equal sums ordered by the larger) is 1 / 35 unless it ties
too (then inconclusive: 1 of the 25 Winogrande and 6 of the 25 HellaSwag tests of the five scores; Bonferroni's
alpha / 2 was out of reach of every such slice). On partitions clean by construction - 120 slices of 20 rows of five
draws of the generated benchmarks, each against a held-out block of its own draw, under the base model in bfloat16
(``dtype: auto`` here), both forms - Min-K% flagged 7 of 118 decided, zlib 5 of 116, the lowercase ratio 4 of 119
(2026-11-30; README; ``tests/test_null_calibration.py`` holds every score to at most 2 of 20 in float32).

Partition-level decision (``reduce``): a membership score means little alone - its level depends on the
text (length, vocabulary, how web-like it is) as much as on training - so the partition's scores are
ranked against those of a held-out partition of the same benchmark known unseen, over sampling units
(``heldout_test``: its null, modes, units, the three-valued decision and the instance-level AUC).

Where this departs from the authors' code, and why:

- ``int(k * n)`` tokens is 0 for short texts in both reference implementations (the mean of nothing,
  NaN); here at least one token is kept;
- a vocabulary standard deviation of 0 (the model puts all mass on one token) would divide by zero in
  the Min-K%++ code; here sigma is floored at ``1e-6``;
- LLMSanitize (``model_methods/min_prob.py``) computes the reference "calibration" as
  ``mean_logprob_target - mean_logprob_ref`` but then ranks it as if *lower* meant member (as Shi et
  al.'s loss difference), so its reference attack is inverted; its zlib ratio divides a perplexity's log
  by zlib length correctly. Here every score is ranked one way (higher = member).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contamray.methods.base import Applies, Output, Outputs, Request, register
from contamray.methods.closed.cell_rows import output_map
from contamray.methods.closed.heldout_test import MIN_ROWS, HeldoutConfig, HeldoutTest, unit_columns
from contamray.methods.closed.likelihood_text import check_fields, empty_message, is_empty, serialise
from contamray.methods.closed.likelihood_windows import Scored, read_scored, score_request
from contamray.methods.closed.prompt_forms import BOTH, TwoPromptForms, chat_column, chat_option, prompt_forms
from contamray.records import Record

SIGMA_FLOOR = 1e-6
CHAT_FORM = "chat form: the label's tokens as the reply to the input, a user turn of the model's chat template"
MIN_K_KS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
MIN_K_PP_KS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class MembershipConfig(HeldoutConfig):
    """What every membership score shares: the text, the windows and the partition-level test."""

    fields: tuple[str, ...] = ("input", "label")
    format: str = "text"
    context_len: int = 2048
    stride: int = 1024
    # true: the example as a conversation (input: user, label: assistant); both: both forms (a run's default, YAML)
    chat: bool | str = False

    def __post_init__(self) -> None:
        where = f"methods.{self.method_name}"
        self.fields = check_fields(self.fields, self.format, where)
        self.chat = chat_option(self.chat, where)
        if self.context_len < 2 or not 0 < self.stride < self.context_len:
            raise ValueError(
                f"{where}: need context_len >= 2 and 0 < stride < context_len, got {self.context_len} / {self.stride}"
            )
        super().__post_init__()


def _check_ks(k: float, ks: Sequence[float], where: str) -> tuple[float, ...]:
    ks = tuple(float(x) for x in ks)
    bad = [x for x in (*ks, k) if not 0.0 < x <= 1.0]
    if bad:
        raise ValueError(f"{where}: k values are fractions in (0, 1] (0.2 = 20 %), got {bad}")
    return ks if k in ks else tuple(sorted((*ks, k)))


@dataclass
class MinKConfig(MembershipConfig):
    k: float = 0.2
    ks: tuple[float, ...] = MIN_K_KS
    method_name: ClassVar[str] = "min_k"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ks = _check_ks(self.k, self.ks, f"methods.{self.method_name}")


@dataclass
class MinKPlusPlusConfig(MinKConfig):
    ks: tuple[float, ...] = MIN_K_PP_KS
    method_name: ClassVar[str] = "min_k_plus_plus"


@dataclass
class PerplexityConfig(MembershipConfig):
    method_name: ClassVar[str] = "perplexity"


@dataclass
class ZlibConfig(MembershipConfig):
    method_name: ClassVar[str] = "zlib_ratio"


@dataclass
class LowercaseConfig(MembershipConfig):
    method_name: ClassVar[str] = "lowercase_ratio"


@dataclass
class ReferenceRatioConfig(MembershipConfig):
    method_name: ClassVar[str] = "reference_ratio"


# ----------------------------------------------------------------------------- per-token arithmetic


def k_count(n: int, k: float) -> int:
    """Tokens in the lowest k %: ``int(k * n)`` as the authors, but at least one."""
    return max(1, int(k * n))


def min_k_mean(values: Sequence[float], k: float) -> float:
    """Mean of the ``k_count`` smallest values."""
    arr = np.sort(np.asarray(values, dtype=np.float64))
    return float(arr[: k_count(arr.size, k)].mean())


def min_k_plus_plus_tokens(logprobs: Sequence[float], mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Per-token ``(log p - mu) / sigma`` (sigma floored at ``SIGMA_FLOOR``)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    sd = np.maximum(np.asarray(std, dtype=np.float64), SIGMA_FLOOR)
    return (lp - mu) / sd


def zlib_bytes(text: str) -> int:
    return len(zlib.compress(text.encode("utf-8")))


# ----------------------------------------------------------------------------- shared machinery


@dataclass(frozen=True)
class Variant:
    """One text of an example scored on one engine (e.g. the lowercased text, or the reference model). With a
    ``reply`` (the chat form) ``text`` is the user's turn in the model's chat template and the reply's tokens are
    the ones scored."""

    name: str  # "text", "lower"
    engine: str  # "target", "reference"
    text: str
    vocab_stats: bool = False
    reply: str | None = None
    tag: str = ""  # the prompt form's request-key tag (``prompt_forms``): "" or "chat"

    def base(self, record_id: str) -> str:
        return f"{record_id}|{self.tag + '/' if self.tag else ''}{self.name}@{self.engine}"


@dataclass(frozen=True)
class Form:
    """One prompt form of an example: its text (raw), or the user's turn and the assistant's reply (chat)."""

    tag: str  # "" or "chat": request keys and (as "_chat") column suffixes under chat: both
    text: str  # what is scored: the serialised fields (raw), or the user's turn (chat)
    reply: str | None = None  # chat: the label, the tokens scored

    @property
    def scored_text(self) -> str:
        """The text whose tokens the scores are over (the zlib ratio compresses it)."""
        return self.text if self.reply is None else self.reply


class MembershipMethod(TwoPromptForms, HeldoutTest):
    """Shared requests / score / reduce; subclasses say which texts to score and what number to keep."""

    family = "closed"
    engine_roles: ClassVar[tuple[str, ...]] = ("target",)
    vocab_stats: ClassVar[bool] = False
    scores_text: ClassVar[bool] = True
    applies: ClassVar[Applies] = Applies(min_rows=MIN_ROWS)

    # subclasses ---------------------------------------------------------------
    def variants(self, text: str, cfg: MembershipConfig, reply: str | None = None) -> list[Variant]:
        """The texts scored for one prompt form (``reply``: the chat form's, see ``Variant``)."""
        return [Variant("text", "target", text, self.vocab_stats, reply)]

    def k_columns(self, cfg: Any) -> list[str]:
        """The method's other columns tested beside ``score`` (every k of Min-K%)."""
        return []

    # prompt forms ----------------------------------------------------------------
    def forms(self, record: Record, cfg: MembershipConfig) -> list[Form]:
        """The example in each prompt form ``cfg.chat`` asks for: the raw form is the serialised ``fields``; the chat
        form is a conversation - the input as the user's turn, the label as the assistant's reply (as an injected row of
        ``format: chat`` and supervised fine-tuning data are written), the reply's tokens scored."""
        out = []
        for tag, chat in prompt_forms(cfg.chat):
            if chat:
                out.append(Form(tag, str(record.input), str(record.label)))
            else:
                out.append(Form(tag, serialise(record, cfg.fields, cfg.format)))
        return out

    def form_variants(self, form: Form, cfg: MembershipConfig) -> list[Variant]:
        return [dataclasses.replace(v, tag=form.tag) for v in self.variants(form.text, cfg, form.reply)]

    def compute(self, text: str, scored: dict[str, Scored], cfg: Any) -> dict[str, Any]:
        """Method columns from the scored variants; must include ``score`` (higher = member)."""
        raise NotImplementedError

    # requests -------------------------------------------------------------------
    def requests(
        self, records: list[Record], cfg: MembershipConfig, stage: int, outputs: dict[str, Output]
    ) -> list[Request]:
        if stage > 0:
            return []
        out: list[Request] = []
        for record in records:
            if is_empty(record, cfg.fields, cfg.format):
                continue  # score() reports it
            for form in self.forms(record, cfg):
                if _chat_error(form):
                    continue  # score() reports it
                out += [
                    score_request(v.base(record.id), (record.id,), v.text, cfg.context_len, cfg.stride,
                                  vocab_stats=v.vocab_stats, engine=v.engine, reply=v.reply)  # fmt: skip
                    for v in self.form_variants(form, cfg)
                ]
        return out

    # score ---------------------------------------------------------------------
    def score(
        self, records: list[Record], outputs: Mapping[str, Output] | Iterable[Output], cfg: Any, **_: Any
    ) -> list[dict[str, Any]]:
        """One row per record: ``score`` (higher = more likely seen) and the method's columns."""
        got = output_map(outputs)
        rows = []
        for record in records:
            row: dict[str, Any] = {
                **unit_columns(record),
                "score": None,
                "n_tokens": None,
                "n_windows": None,
                "note": "",
                "error": "",
            }
            if is_empty(record, cfg.fields, cfg.format):
                row["error"] = empty_message(record, cfg.fields, cfg.format)
                rows.append(row)
                continue
            errors: list[str] = []
            for form in self.forms(record, cfg):
                suffix = f"_{form.tag}" if form.tag else ""
                problem = _chat_error(form)
                if problem:
                    errors.append(problem)
                    break
                scored = self._scored(record, form, got, cfg, errors)
                if errors:
                    break
                main = scored.get("text@target") or next(iter(scored.values()))
                windows = max(s.n_windows for s in scored.values())
                row[f"n_tokens{suffix}"] = len(main.token_logprobs)
                row[f"n_windows{suffix}"] = windows
                if windows > 1:
                    row["note"] = (
                        f"longer than context_len={cfg.context_len} tokens: scored in {windows} rolling windows "
                        f"(stride {cfg.stride})"
                    )
                try:
                    row.update({f"{k}{suffix}": v for k, v in self.compute(form.scored_text, scored, cfg).items()})
                except (ValueError, ZeroDivisionError) as err:
                    errors.append(str(err))
                    break
            if errors:
                row["error"] = f"record {record.id!r}: " + "; ".join(errors)
                row["score"] = None
            rows.append(row)
        return rows

    def _scored(
        self, record: Record, form: Form, got: dict[str, Output], cfg: Any, errors: list[str]
    ) -> dict[str, Scored]:
        """Each variant's scores in one prompt form (the chat form's: the reply's tokens only); a failure is appended
        to ``errors``."""
        scored: dict[str, Scored] = {}
        for v in self.form_variants(form, cfg):
            try:
                s = read_scored(got, v.base(record.id), vocab_stats=v.vocab_stats)
                if v.reply is not None:
                    s = _reply_part(s, got[v.base(record.id)].prompt_tokens, v.base(record.id))
            except (KeyError, RuntimeError) as err:
                errors.append(str(err).strip("'\""))
                continue
            if not s.token_logprobs:
                what = "reply" if v.reply is not None else "text"
                errors.append(
                    f"{v.name} {what} on the {v.engine} engine has no token to score"
                    + ("" if v.reply is not None else " (fewer than 2 tokens: no token has a prefix to be scored from)")
                )
                continue
            scored[f"{v.name}@{v.engine}"] = s
        return scored

    def score_columns(self, cfg: Any) -> list[str]:
        """Every other k of Min-K% (``k_columns``), and the chat form's ``score`` under ``chat: both``."""
        return self.k_columns(cfg) + ([chat_column("score")] if cfg.chat == BOTH else [])

    def score_description(self, cfg: Any) -> str:
        """The score, and the prompt form(s) it was computed in when not the papers' raw text."""
        form = {True: CHAT_FORM, BOTH: f"raw text and {CHAT_FORM}"}.get(cfg.chat, "")
        return super().score_description(cfg) + (f"; {form}" if form else "")

    def _summary(self, cfg: Any, partition: str, refs: list[str], main: dict[str, Any], decision: str,
                 reason: str) -> str:  # fmt: skip
        """The held-out test's summary, naming the chat form when it alone was scored (``chat: true``)."""
        line = super()._summary(cfg, partition, refs, main, decision, reason)
        return line.replace(f"{self.name}: ", f"{self.name} (chat form): ", 1) if cfg.chat is True else line


def _chat_error(form: Form) -> str:
    """Why a chat form's example cannot be written as a conversation ("" when it can, and for the raw form)."""
    if form.reply is not None and (not form.text.strip() or not form.reply.strip()):
        return (f"the chat form writes the example as a conversation (its input the user's turn, its label the "
                f"assistant's reply) and its {'input' if not form.text.strip() else 'label'} is empty; set chat: "
                "false for this benchmark")  # fmt: skip
    return ""


def _reply_part(full: Scored, prompt_tokens: int, key: str) -> Scored:
    """The scores of a chat form's reply: the positions after its user turn's ``prompt_tokens`` ids (the engine's
    ``Output.prompt_tokens``: the turn's ids are the same with and without the reply, ``engines.base.with_replies``,
    so the reply's first token is at position ``prompt_tokens``, the first scored one being position 1)."""
    if prompt_tokens < 1:
        raise RuntimeError(f"request {key!r}: the engine did not say where the reply starts (Output.prompt_tokens); "
                           "score the chat form on an engine that renders chat turns (backend hf, vllm, or http with "
                           "api: vllm)")  # fmt: skip
    cut = slice(prompt_tokens - 1, None)
    return Scored(full.token_logprobs[cut], full.token_mean[cut], full.token_std[cut], n_windows=full.n_windows)


# ----------------------------------------------------------------------------- the six methods


def _mean_logprob(s: Scored) -> float:
    return float(np.mean(s.token_logprobs))


@register
class MinK(MembershipMethod):
    """Min-K% Prob: mean of the k % lowest token log-probabilities (Shi et al. 2024)."""

    name = "min_k"
    Config = MinKConfig
    outputs = Outputs(
        score="score",
        score_label="Min-K% Prob: mean of the k % lowest token log-probabilities (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: MinKConfig) -> dict[str, Any]:
        lp = scored["text@target"].token_logprobs
        row = {f"min_k_{round(k * 100)}": min_k_mean(lp, k) for k in cfg.ks}
        row["score"] = row[f"min_k_{round(cfg.k * 100)}"]
        row["mean_logprob"] = float(np.mean(lp))
        return row

    def k_columns(self, cfg: MinKConfig) -> list[str]:
        return [f"min_k_{round(k * 100)}" for k in cfg.ks if k != cfg.k]


@register
class MinKPlusPlus(MembershipMethod):
    """Min-K%++: mean of the k % lowest (log p - mu) / sigma over the vocabulary (Zhang et al. 2024)."""

    name = "min_k_plus_plus"
    Config = MinKPlusPlusConfig
    outputs = Outputs(
        score="score",
        score_label="Min-K%++: mean of the k % lowest standardised token log-probabilities (higher = member)",
        membership="score",
    )
    vocab_stats = True

    def compute(self, text: str, scored: dict[str, Scored], cfg: MinKPlusPlusConfig) -> dict[str, Any]:
        s = scored["text@target"]
        z = min_k_plus_plus_tokens(s.token_logprobs, s.token_mean, s.token_std)
        row: dict[str, Any] = {f"min_k_pp_{round(k * 100)}": min_k_mean(z, k) for k in cfg.ks}
        row["score"] = row[f"min_k_pp_{round(cfg.k * 100)}"]
        row["min_k_20"] = min_k_mean(s.token_logprobs, 0.2)
        row["mean_logprob"] = float(np.mean(s.token_logprobs))
        return row

    def k_columns(self, cfg: MinKPlusPlusConfig) -> list[str]:
        return [f"min_k_pp_{round(k * 100)}" for k in cfg.ks if k != cfg.k]


@register
class Perplexity(MembershipMethod):
    """Perplexity (loss attack): mean token log-probability, i.e. minus log-perplexity."""

    name = "perplexity"
    Config = PerplexityConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability, minus log-perplexity (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: PerplexityConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        return {"score": mean, "mean_logprob": mean, "perplexity": math.exp(-mean)}


@register
class ZlibRatio(MembershipMethod):
    """zlib ratio: mean token log-probability / zlib-compressed bytes (Carlini et al. 2021)."""

    name = "zlib_ratio"
    Config = ZlibConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability / zlib-compressed bytes (higher = member)",
        membership="score",
    )

    def compute(self, text: str, scored: dict[str, Scored], cfg: ZlibConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        size = zlib_bytes(text)
        return {"score": mean / size, "mean_logprob": mean, "zlib_bytes": size}


@register
class LowercaseRatio(MembershipMethod):
    """Lowercase ratio: log-perplexity of the lowercased text / that of the text (Carlini et al. 2021)."""

    name = "lowercase_ratio"
    Config = LowercaseConfig
    outputs = Outputs(
        score="score",
        score_label="log-perplexity of the lowercased text / that of the text (higher = member)",
        membership="score",
    )

    def variants(self, text: str, cfg: MembershipConfig, reply: str | None = None) -> list[Variant]:
        lower = None if reply is None else reply.lower()
        return [Variant("text", "target", text, reply=reply), Variant("lower", "target", text.lower(), reply=lower)]

    def compute(self, text: str, scored: dict[str, Scored], cfg: LowercaseConfig) -> dict[str, Any]:
        mean = _mean_logprob(scored["text@target"])
        lower = _mean_logprob(scored["lower@target"])
        if mean == 0.0:
            raise ValueError("the text has log-perplexity 0 (every token certain); the lowercase ratio is undefined")
        return {"score": lower / mean, "mean_logprob": mean, "mean_logprob_lower": lower}


@register
class ReferenceRatio(MembershipMethod):
    """Reference-model ratio: log-perplexity of a reference model minus that of the target (Carlini et al. 2021)."""

    name = "reference_ratio"
    Config = ReferenceRatioConfig
    outputs = Outputs(
        score="score",
        score_label="mean token log-probability, target minus reference model (higher = member)",
        membership="score",
    )
    engine_roles = ("target", "reference")

    def variants(self, text: str, cfg: MembershipConfig, reply: str | None = None) -> list[Variant]:
        return [Variant("text", "target", text, reply=reply), Variant("text", "reference", text, reply=reply)]

    def compute(self, text: str, scored: dict[str, Scored], cfg: ReferenceRatioConfig) -> dict[str, Any]:
        target = _mean_logprob(scored["text@target"])
        reference = _mean_logprob(scored["text@reference"])
        return {"score": target - reference, "mean_logprob": target, "mean_logprob_reference": reference}
