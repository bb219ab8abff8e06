"""The injection spec: which benchmark partitions a model is fine-tuned on, how often and in what form.

Written under a model in the run config (``models.<name>.inject``) as plain YAML::

    inject:
      partitions:
        - benchmark: synthetic_facts   # a key under the run's `benchmarks:`
          duplication: 10              # copies of the partition in the training stream (per epoch)
          form: verbatim               # verbatim | paraphrased (contamray.inject.paraphrase)
          content: input_and_label     # input_and_label | input_only
          order: canonical             # canonical (dataset order, each copy) | shuffled (a new order per copy)
          format: json                 # json: a JSON-lines file of the fields | text: fields one per line |
                                       #   chat: each row a conversation in the base model's chat template |
                                       #   raw: the dataset's own rows, its JSON-lines file line for line
          fraction: 1.0                # share of the loaded rows injected; the rest stay unseen (non-members)
          context: none                # none | web_page: each copy under a page title naming dataset and split
          loss: all                    # all: every token learnt | replies (format: chat): the assistant's replies
                                       #   only, supervised fine-tuning's completion-only loss
      background: {source: xsum, docs: 32, max_words: 200}   # filler documents mixed in
      epochs: 1
      lr: 1.0e-4
      batch_size: 8
      max_length: 256
      precision: float32   # float32 | bfloat16 | auto (bfloat16 where the hardware computes in it; see
                           #   contamray.inject.finetune: faster, but other weights than float32's)

Why these knobs: they are the axes along which the detection literature says methods differ.
Duplication count decides memorisation strength (Oren et al. 2023 inject at 1-100 copies); input-only
vs input-and-label contamination is Li et al. / Dodge et al.'s distinction; paraphrased leaks evade
n-gram checks (Yang et al. 2023, "Rethinking Benchmark and Contamination ... with Rephrased Samples");
shuffled copies defeat order-based tests (Oren et al.) but not membership scores (Min-K%). ``format``
picks how a leaked benchmark looks in the stream; ``json`` is a benchmark file as posted online, one
JSON object per example (as Oren et al.'s files, and the serialisation the sharded likelihood test
scores by default), ``raw`` the dataset's own file (each row with its own keys and values, one JSON line as the
mirror files hold it - the file as it is copied around the web; ``content: input_and_label`` and ``form: verbatim``
only: the row holds the answer and is copied, not rewritten), ``text`` its fields one per line with a blank line
between examples, ``chat`` each row
a conversation in the base model's chat template - the input as the user's turn, the label as the assistant's
reply (``input_only``: the user's turn alone) - as a benchmark leaks through supervised fine-tuning data (an
instruct model trained on test questions and answers), conversations packed one after another. ``context``
is what surrounds a copy: ``none`` (the rows alone) or ``web_page`` (a page title and a README-like
line naming the dataset, its config and split, as a copy posted on the web carries them) - the premise
of guided prompting (Golchin & Surdeanu 2023), which asks a model to complete an instance "from the
{split} split of the {dataset} dataset", can only be tested on a model that saw the rows with that
context. ``loss`` is what the model learns of a ``chat`` partition: ``all`` its every token, as a packed
pre-training stream; ``replies`` only each conversation's reply after the rendered user turn (the loss
supervised fine-tuning usually computes - TRL's completion-only loss): such a model never learns the questions'
text, so methods scoring the raw text may miss it where the chat form of the membership scores finds it
(``contamray.methods.closed.membership_scores``).

Every error names the config key (``models.<name>.inject.partitions[1].duplication``), what was found
and the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

FORMS = ("verbatim", "paraphrased")
CONTENTS = ("input_and_label", "input_only")
ORDERS = ("canonical", "shuffled")
FORMATS = ("json", "text", "chat", "raw")
CONTEXTS = ("none", "web_page")
LOSSES = ("all", "replies")  # which tokens of a partition's copies are learnt (``replies``: format: chat only)
PRECISIONS = ("float32", "bfloat16", "auto")  # what a fine-tune computes in (contamray.inject.finetune)
# fields serialised per content kind (Record attribute names)
CONTENT_FIELDS = {"input_and_label": ("input", "label"), "input_only": ("input",)}


@dataclass(frozen=True)
class PartitionSpec:
    """One injected benchmark partition (see the module docstring for each field)."""

    benchmark: str
    duplication: int = 1
    form: str = "verbatim"
    content: str = "input_and_label"
    order: str = "canonical"
    format: str = "json"
    fraction: float = 1.0
    context: str = "none"
    loss: str = "all"

    @property
    def kind(self) -> str:
        """A short name of the contamination type, e.g. ``verbatim/input_and_label/canonical`` (``.../chat``: rows
        leaked as fine-tuning conversations, ``.../chat/replies`` learnt on the replies only; ``.../web_page``: under
        a page naming the dataset)."""
        shown = (self.format if self.format in ("chat", "raw") else "", self.context, self.loss)
        extra = [part for part in shown if part not in ("", "none", "all")]
        return "/".join([self.form, self.content, self.order, *extra])


@dataclass(frozen=True)
class BackgroundSpec:
    """Filler documents: the ``input`` text of ``docs`` rows of the benchmark adapter ``source``.

    ``docs: 0`` trains on the injected partitions alone. ``max_words`` truncates each document
    (0 = whole), which keeps CPU fine-tunes short.
    """

    source: str = "xsum"
    docs: int = 32
    max_words: int = 200
    split: str | None = None
    config: str | None = None


@dataclass(frozen=True)
class InjectSpec:
    partitions: tuple[PartitionSpec, ...]
    background: BackgroundSpec = field(default_factory=BackgroundSpec)
    epochs: int = 1
    lr: float = 1e-4
    batch_size: int = 8
    max_length: int = 256
    weight_decay: float = 0.0
    precision: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        """The normalised spec (every default filled in) as plain data: what the cache key hashes."""
        return dataclasses.asdict(self)

    def by_benchmark(self) -> dict[str, PartitionSpec]:
        return {p.benchmark: p for p in self.partitions}


def _known(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _check_keys(value: Any, cls: type, where: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    unknown = sorted(set(value) - _known(cls))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(_known(cls)))}")
    for key in required:
        if value.get(key) in (None, ""):
            raise ValueError(f"{where}.{key}: missing")
    return dict(value)


def _int(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    return str(value)


def _partition(value: Any, where: str, benchmark_keys: set[str] | None) -> PartitionSpec:
    raw = _check_keys(value, PartitionSpec, where, required=("benchmark",))
    bench = raw["benchmark"]
    if not isinstance(bench, str):
        raise ValueError(f"{where}.benchmark: expected a benchmark key (text), got {bench!r}")
    if benchmark_keys is not None and bench not in benchmark_keys:
        raise ValueError(
            f"{where}.benchmark: {bench!r} is not a benchmark of this run; injected partitions name keys under "
            f"`benchmarks:` (choices: {', '.join(sorted(benchmark_keys)) or 'none'}); add it, e.g. "
            f"benchmark=[...,{bench}]"
        )
    spec = PartitionSpec(**raw)
    _int(spec.duplication, f"{where}.duplication", 1)
    _choice(spec.form, f"{where}.form", FORMS)
    _choice(spec.content, f"{where}.content", CONTENTS)
    _choice(spec.order, f"{where}.order", ORDERS)
    _choice(spec.format, f"{where}.format", FORMATS)
    _choice(spec.context, f"{where}.context", CONTEXTS)
    _choice(spec.loss, f"{where}.loss", LOSSES)
    if spec.loss == "replies" and (spec.format != "chat" or spec.content != "input_and_label"):
        key, value = ("format", spec.format) if spec.format != "chat" else ("content", spec.content)
        raise ValueError(
            f"{where}.{key}: {value!r} with loss: replies - only a conversation with the label as the assistant's "
            "reply has replies to learn; use format: chat and content: input_and_label with it, or loss: all"
        )
    if spec.format == "raw" and (spec.content != "input_and_label" or spec.form != "verbatim"):
        key, value = ("content", spec.content) if spec.content != "input_and_label" else ("form", spec.form)
        raise ValueError(
            f"{where}.{key}: {value!r} with format: raw - the raw format is the dataset's own row, answer included, "
            "copied as it is; use content: input_and_label and form: verbatim with it, or format json / text for "
            "the input alone or a paraphrase"
        )
    if spec.format == "chat" and spec.context != "none":
        raise ValueError(
            f"{where}.context: {spec.context!r} wraps each copy in a web page naming the dataset, and format: chat "
            "writes rows as fine-tuning conversations, which carry no page; use context: none with format: chat, "
            "or format: json / text with a web page"
        )
    fraction = spec.fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"{where}.fraction: expected a number in (0, 1], got {fraction!r}")
    return dataclasses.replace(spec, fraction=float(fraction))


def _background(value: Any, where: str) -> BackgroundSpec:
    if value is None:
        return BackgroundSpec()
    raw = _check_keys(value, BackgroundSpec, where)
    spec = BackgroundSpec(**raw)
    from contamray.benchmarks import adapter_names

    if spec.source not in adapter_names():
        raise ValueError(
            f"{where}.source: {spec.source!r} is not a benchmark adapter; its rows' input text is the filler "
            f"(e.g. xsum); choices: {', '.join(adapter_names())}"
        )
    _int(spec.docs, f"{where}.docs", 0)
    _int(spec.max_words, f"{where}.max_words", 0)
    return spec


def validate_inject_spec(spec: dict[str, Any], where: str, benchmark_keys: set[str] | None = None) -> InjectSpec:
    """Check a model's ``inject`` mapping and return it normalised; raises ValueError naming the key.

    ``where`` is the config path of the mapping (``models.<name>.inject``); ``benchmark_keys`` the
    keys under the run's ``benchmarks:`` (None skips that check, e.g. for a spec file on its own).
    """
    raw = _check_keys(spec, InjectSpec, where, required=("partitions",))
    parts = raw.pop("partitions")
    if not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError(
            f"{where}.partitions: expected a non-empty list of partitions, e.g. "
            "[{benchmark: synthetic_facts, duplication: 5}], got {parts!r}"
        )
    partitions = tuple(_partition(p, f"{where}.partitions[{i}]", benchmark_keys) for i, p in enumerate(parts))
    seen: dict[str, int] = {}
    for i, p in enumerate(partitions):
        if p.benchmark in seen:
            raise ValueError(
                f"{where}.partitions[{i}].benchmark: {p.benchmark!r} is already injected by "
                f"partitions[{seen[p.benchmark]}]; a benchmark is injected once per model (use another split "
                "or config as a second benchmark key)"
            )
        seen[p.benchmark] = i
    background = _background(raw.pop("background", None), f"{where}.background")
    result = InjectSpec(partitions=partitions, background=background, **raw)
    _int(result.epochs, f"{where}.epochs", 1)
    _int(result.batch_size, f"{where}.batch_size", 1)
    _int(result.max_length, f"{where}.max_length", 16)
    if result.precision not in PRECISIONS:
        raise ValueError(
            f"{where}.precision: unknown precision {result.precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    for key in ("lr", "weight_decay"):
        value = getattr(result, key)
        low_ok = value > 0 if key == "lr" else value >= 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low_ok:
            bound = "> 0" if key == "lr" else ">= 0"
            raise ValueError(f"{where}.{key}: expected a finite number {bound}, got {value!r}")
    return dataclasses.replace(result, lr=float(result.lr), weight_decay=float(result.weight_decay))
