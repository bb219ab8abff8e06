"""The training stream of an injected model, and the manifest of exactly what it holds.

The stream is a list of *units*, in a seeded random order:

- one unit per background document;
- per injected partition, ``duplication`` units, each a copy of the partition's injected rows written
  as one file: every row serialised (``spec.format``: a JSON line of the chosen fields, or the fields
  one per line), rows joined in canonical order (``order: canonical``: the same order in every copy,
  as a benchmark file copied ``duplication`` times) or in a fresh seeded permutation per copy
  (``order: shuffled``). ``form: paraphrased`` rewords each row once (``contamray.inject.paraphrase``);
  all copies carry the same paraphrase.

The serialisation is the one the likelihood methods score (``json``: ``json.dumps`` of the fields in
order, ``ensure_ascii=False``, examples ending in a newline; ``text``: the fields one per line,
examples separated by a blank line; ``raw``: the dataset's own row, ``Record.source_row``, a line of its
JSON-lines file), so a row leaked as a JSON line is probed in the same form.
``chat`` renders each row as a conversation with the base model's own chat template (``ChatRenderer``,
built from its tokenizer by ``inject.prepare``): the input as the user's turn, the label as the assistant's
reply, conversations one per line - supervised fine-tuning data (probed in its own form by the methods with
``chat: both``: the membership scores, CDD and the held-out accuracy gap; trained on every token, it shows in the
raw form's membership scores too). ``loss: replies`` learns such a partition as supervised fine-tuning does: each
conversation's start - up to and including the assistant's generation prompt, exactly the template's rendering of
the user's turn alone with ``add_generation_prompt`` - is kept out of the loss (``Unit.masked``, character spans;
``Stream.masked`` in the packed text; ``finetune_causal_lm``'s ``masked``), so the model learns each reply (and its
end-of-turn) given the question, never the question's text. The other units are learnt whole.

The stream is trained as one packed text (units joined by a blank line) cut into fixed-length token
blocks - the way pre-training corpora are packed - so no compute is spent on padding, and a block may
hold the end of one unit and the start of the next. Which rows were injected is chosen per partition
by a seeded sample of ``fraction`` of the loaded rows; the others are the partition's non-members.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from contamray.inject.background import BackgroundDoc
from contamray.inject.paraphrase import changed_fraction, paraphrase
from contamray.inject.spec import CONTENT_FIELDS, InjectSpec, PartitionSpec
from contamray.records import Record, partition_parts

UNIT_SEPARATOR = "\n\n"
EXAMPLE_END = {"json": "\n", "text": "\n\n", "chat": "\n", "raw": "\n"}
Span = tuple[int, int]  # [start, end) character offsets


class ChatRenderer(Protocol):
    """messages ([{"role": "user", "content": ...}, ...]) -> one conversation in the base model's chat template;
    ``add_generation_prompt`` ends it with the assistant's turn opened (what precedes a reply)."""

    def __call__(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str: ...


@dataclass
class Unit:
    """One document of the stream: a background document or one copy of an injected partition."""

    id: str
    kind: str  # "background" | "injected"
    text: str
    benchmark: str = ""
    partition: str = ""
    copy: int = 0
    record_ids: list[str] = field(default_factory=list)
    masked: list[Span] = field(default_factory=list)  # spans of ``text`` kept out of the loss (``loss: replies``)


@dataclass
class Stream:
    units: list[Unit]
    rows: dict[str, dict[str, Any]]  # record id -> what happened to it (members and non-members)
    partitions: dict[str, dict[str, Any]]  # benchmark key -> the partition's injection summary

    @property
    def text(self) -> str:
        return UNIT_SEPARATOR.join(u.text for u in self.units)

    @property
    def masked(self) -> list[Span]:
        """The units' masked spans as offsets in ``text`` (the packed stream), in order."""
        spans: list[Span] = []
        offset = 0
        for unit in self.units:
            spans.extend((offset + a, offset + b) for a, b in unit.masked)
            offset += len(unit.text) + len(UNIT_SEPARATOR)
        return spans


def serialise(record: Record, fields: tuple[str, ...], fmt: str, chat: ChatRenderer | None = None) -> str:
    """A row as the likelihood methods write it, or as a chat conversation (see the module docstring)."""
    if fmt == "raw":
        return record.source_row
    return _written({name: str(getattr(record, name)) for name in fields}, fmt, chat)


def _written(values: dict[str, str], fmt: str, chat: ChatRenderer | None) -> str:
    if fmt == "json":
        return json.dumps(values, ensure_ascii=False)
    if fmt == "chat":
        if chat is None:
            raise ValueError("format: chat needs the base model's chat template (a ChatRenderer)")
        turns = [("user", values.get("input", "")), ("assistant", values.get("label", ""))]
        return chat([{"role": role, "content": text} for role, text in turns if text.strip()]).rstrip("\n")
    return "\n".join(v for v in values.values() if v.strip())


def injected_text(record: Record, spec: PartitionSpec, chat: ChatRenderer | None = None) -> str:
    """The text of one injected row: its content fields, paraphrased when asked, serialised."""
    return _injected(record, spec, chat)[0]


def _injected(record: Record, spec: PartitionSpec, chat: ChatRenderer | None) -> tuple[str, int]:
    """The row's injected text and how many of its first characters stay out of the loss (``loss: replies``: the
    conversation up to its reply; else 0)."""
    fields = CONTENT_FIELDS[spec.content]
    if spec.form == "paraphrased":
        values = {name: paraphrase(str(getattr(record, name)), f"{record.id}|{name}") for name in fields}
        text = _written(values, spec.format, chat)
    else:
        values = {name: str(getattr(record, name)) for name in fields}
        text = serialise(record, fields, spec.format, chat)
    if spec.loss != "replies":
        return text, 0
    assert chat is not None  # loss: replies is validated with format: chat, which needs the renderer
    prompt = chat([{"role": "user", "content": values["input"]}], add_generation_prompt=True)
    why = ""
    if not values["input"].strip() or not values["label"].strip():
        why = "its input or label is empty"
    elif not text.startswith(prompt):
        why = "the chat template renders the user's turn alone differently from its start in the conversation"
    if why:
        raise ValueError(f"loss: replies cannot split row {record.id!r} into question and reply: {why}; use loss: all")
    return text, len(prompt)


def page_header(partition: str, spec: PartitionSpec) -> str:
    """What precedes a copy: nothing, or (``context: web_page``) a page title and a README-like line
    naming the dataset, config and split of ``partition`` (``<benchmark>/<config>/<split>``)."""
    if spec.context == "none":
        return ""
    bench, config, split = partition_parts(partition)
    return (
        f"{' / '.join(p for p in (bench, config, split) if p)}.{'jsonl' if spec.format in ('json', 'raw') else 'txt'}\n"
        f"The {split} split of the {bench} dataset{f' ({config} config)' if config else ''}, one example per "
        f"{'line' if spec.format in ('json', 'raw') else 'paragraph'}.\n"
    )


def _members(records: list[Record], spec: PartitionSpec, seed: int) -> list[Record]:
    rows = sorted(records, key=lambda r: r.order)
    if spec.fraction >= 1.0:
        return rows
    k = max(1, round(len(rows) * spec.fraction))
    chosen = set(random.Random(f"inject-members|{seed}|{spec.benchmark}").sample(range(len(rows)), k))
    return [r for i, r in enumerate(rows) if i in chosen]


def build_stream(
    spec: InjectSpec,
    records: dict[str, list[Record]],
    background: list[BackgroundDoc],
    seed: int,
    where: str = "inject",
    chat: ChatRenderer | None = None,
) -> Stream:
    """The ordered units, the per-row truth and the per-partition summary (see the module docstring); ``chat``
    renders the rows of ``format: chat`` partitions (the base model's template)."""
    rng = random.Random(f"inject-stream|{seed}")
    units = [Unit(id=f"background:{d.id}", kind="background", text=d.text) for d in background]
    rows: dict[str, dict[str, Any]] = {}
    partitions: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(spec.partitions):
        loaded = records.get(p.benchmark)
        if not loaded:
            raise ValueError(
                f"{where}.partitions[{i}].benchmark: benchmark {p.benchmark!r} has no loaded rows to inject "
                f"(given: {', '.join(sorted(k for k, v in records.items() if v)) or 'none'}); check its limit and data"
            )
        names = sorted({r.partition for r in loaded})
        members = _members(loaded, p, seed)
        if p.format == "chat" and chat is None:
            raise ValueError(f"{where}.partitions[{i}].format: chat needs the base model's chat template to write "
                             "its rows; none was given (inject.prepare reads it from the base's tokenizer)")
        written = {}
        for r in members:
            try:
                written[r.id] = _injected(r, p, chat)
            except ValueError as exc:
                raise ValueError(f"{where}.partitions[{i}].loss: {exc}") from None
        texts = {rid: text for rid, (text, _) in written.items()}
        end = EXAMPLE_END[p.format]
        for copy in range(p.duplication):
            ordered = list(members)
            if p.order == "shuffled":
                random.Random(f"inject-order|{seed}|{p.benchmark}|{copy}").shuffle(ordered)
            parts, masked = [page_header(names[0], p)], []
            offset = len(parts[0])
            for r in ordered:
                row_text, prompt_chars = written[r.id]
                if prompt_chars:
                    masked.append((offset, offset + prompt_chars))
                parts.append(row_text + end)
                offset += len(parts[-1])
            units.append(
                Unit(
                    id=f"injected:{p.benchmark}:copy{copy}",
                    kind="injected",
                    text="".join(parts).rstrip("\n"),
                    benchmark=p.benchmark,
                    partition=names[0],
                    copy=copy,
                    record_ids=[r.id for r in ordered],
                    masked=masked,
                )
            )
        member_ids = {r.id for r in members}
        for r in sorted(loaded, key=lambda r: r.order):
            row: dict[str, Any] = {"benchmark": p.benchmark, "partition": r.partition, "member": r.id in member_ids}
            if r.id in member_ids:
                row.update(form=p.form, content=p.content, order=p.order, format=p.format, loss=p.loss,
                           copies=p.duplication, times_seen=p.duplication * spec.epochs, text=texts[r.id])
                if p.form == "paraphrased":
                    original = " ".join(str(getattr(r, f)) for f in CONTENT_FIELDS[p.content])
                    row["ngram8_broken"] = round(changed_fraction(original, texts[r.id]), 4)
            rows[r.id] = row
        partitions[p.benchmark] = {
            "partitions": names,
            **{k: getattr(p, k)
               for k in ("duplication", "form", "content", "order", "format", "fraction", "context", "loss")},
            "kind": p.kind,
            "n_rows": len(loaded),
            "n_injected": len(members),
            "times_seen": p.duplication * spec.epochs,
        }
    rng.shuffle(units)
    return Stream(units=units, rows=rows, partitions=partitions)
