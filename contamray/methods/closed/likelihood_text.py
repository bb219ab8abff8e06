"""The text a likelihood method scores for one benchmark example: only the configured Record fields.

Sharded likelihood (Oren et al. 2023) scores the benchmark *as a file*: their released benchmarks
are JSON-lines files, one example per line, and a shard is a run of consecutive lines. Membership
scores (Min-K%, Min-K%++, perplexity ratios) score one example's text. Both choose which fields of
an example make up that text (``fields``, e.g. ``["input", "label"]``: question and gold answer) and
how they are written (``fmt``):

- ``"json"``: one JSON object of the chosen fields in the given order, ``ensure_ascii=False``, no
  newline inside (``{"input": "...", "label": "..."}``) - a line of a JSON-lines file, as in
  Oren et al.'s files;
- ``"text"``: the non-empty field values joined by a newline (choices one per line);
- ``"raw"``: the dataset's own row (``Record.source_row``: its keys and values as one JSON line, byte for byte a
  line of the mirror files) - the benchmark file as it leaks, whatever ``fields`` say (they are
  ignored). A record built by hand, not loaded from a dataset, has none and is left out as empty. Rows that number
  their positions (an ``ind``, an ``id`` ending in the row number) are renumbered in every shuffled order by the
  sharded test (``position_fields``), so the numbers alone cannot tell the canonical file from a shuffle.

``EXAMPLE_END[fmt]`` is what follows each example when examples are concatenated (a newline after a
JSON line, as ``readlines`` keeps it in the authors' code; a blank line between plain-text examples).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contamray.records import Record

TEXT_FIELDS = ("input", "label", "reference", "prefix", "verbalized", "answer", "choices")
FORMATS = ("json", "text", "raw")
EXAMPLE_END = {"json": "\n", "text": "\n\n", "raw": "\n"}


def check_fields(fields: Sequence[str], fmt: str, where: str) -> tuple[str, ...]:
    """Validate ``fields`` / ``fmt`` of a method config; the error names the config key and choices."""
    if isinstance(fields, str):
        fields = [fields]
    fields = tuple(fields)
    if not fields:
        raise ValueError(f"{where}.fields is empty; choose one or more of {', '.join(TEXT_FIELDS)}")
    unknown = [f for f in fields if f not in TEXT_FIELDS]
    if unknown:
        raise ValueError(
            f"{where}.fields: unknown field(s) {', '.join(map(repr, unknown))}; choose from {', '.join(TEXT_FIELDS)}"
        )
    if len(set(fields)) != len(fields):
        raise ValueError(f"{where}.fields lists a field twice: {list(fields)}")
    if fmt not in FORMATS:
        raise ValueError(f"{where}.format: {fmt!r}; choose one of {', '.join(FORMATS)}")
    return fields


def _value(record: Record, name: str) -> Any:
    value = getattr(record, name)
    if name == "choices":
        return [str(c) for c in value]
    return str(value)


def is_empty(record: Record, fields: Sequence[str], fmt: str = "") -> bool:
    """True when every configured field of ``record`` is blank (nothing of the example to score); under
    ``fmt="raw"``, when the record has no source row."""
    if fmt == "raw":
        return not record.source_row.strip()
    for name in fields:
        value = _value(record, name)
        if (isinstance(value, list) and any(v.strip() for v in value)) or (isinstance(value, str) and value.strip()):
            return False
    return True


def serialise(record: Record, fields: Sequence[str], fmt: str) -> str:
    """The example's text: its ``fields`` written as ``fmt`` (see the module docstring)."""
    if fmt == "raw":
        return record.source_row
    if fmt == "json":
        return json.dumps({name: _value(record, name) for name in fields}, ensure_ascii=False)
    parts: list[str] = []
    for name in fields:
        value = _value(record, name)
        if isinstance(value, list):
            parts.extend(v for v in value if v.strip())
        elif value.strip():
            parts.append(value)
    return "\n".join(parts)


def empty_message(record: Record, fields: Sequence[str], fmt: str = "") -> str:
    if fmt == "raw":
        return (
            f"record {record.id!r} of {record.partition!r} has no source row (it was not loaded from a dataset), so "
            "format: raw has no text to score; use format json or text with fields"
        )
    return (
        f"record {record.id!r} of {record.partition!r}: the configured fields {list(fields)} are all empty, so "
        "there is no text to score; choose other fields (methods.<label>.fields) or fix the benchmark adapter"
    )
