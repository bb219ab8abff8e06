"""Fields of a dataset's own rows that carry the row's position, and how a shuffled file renumbers them.

The sharded likelihood test's ``raw`` form scores the benchmark file as it leaks: each example is the dataset's
row byte for byte (``Record.source_row``), keys and all. Many files number their rows - HellaSwag's ``"ind": 0, 1,
2, ...``, GLUE's ``idx``, the generated benchmarks' ``"id": ".../test#N"`` - and some rows point at others by that
number (``synthetic_structured``'s ``twin``) or count runs of rows (its ``run``). Shuffling such rows as they are
makes the numbers jump about while the canonical file counts upward, and any language model prefers a count to a
jumble *without ever having seen the file*: the test's null (the canonical order is exchangeable with the shuffles)
fails. Measured on the base model, which never saw the generated benchmark (20-row slices of ``synthetic_facts``,
5 shards x 5 shuffles): the raw form flagged 3 of 4 clean slices (p = 0.0027, 0.0057, 0.0012) where the JSON form
of input and label flagged none.

A shuffle of a numbered file is therefore written as the same file would be written in that order: the rows move,
the numbering stays with the positions. Per partition (its rows in canonical order, each a JSON object):

- **index** fields: a number (an integer or float value, or the last run of digits in a string) on every row,
  strictly increasing (or strictly decreasing) along the canonical order. In every order the row at position k
  takes position k's number (a string keeps its own text around the digits, zero-padding kept).
- **reference** fields: strings that, but for their last number, read like an index field's value (``twin``:
  ``".../test#1"`` beside ``"id": ".../test#0"``), empty elsewhere. A reference to a row of the same shard follows
  that row to its new position and takes its new number; a reference outside the shard is left as it is.
- **counter** fields: a number on every row, never decreasing (or never increasing) with ties - one value per run
  of rows (``run``). The sharded test keeps each run inside one permuted unit (``counter_runs``: it joins units a
  run straddles), so the rows of a run stay together in every order, and the runs are renumbered in the order they
  appear: the k-th run met takes the k-th value.

The canonical order is rewritten to itself, byte for byte. Under the null every scored order is then the file a
writer would make of those rows in that order, and the canonical one is exchangeable with the others again; the
renumbering depends on the texts only, never on the model's scores. A model that read the file still sees its rows
in the learnt order (and its numbers beside the rows it learnt them with only in the canonical order), so the test
keeps its power.

Any other field whose numbers follow the row order (Kendall's tau with the position, |tau| >= ``ORDER_TAU`` and
two-sided p <= ``ORDER_ALPHA``, over at least ``MIN_NUMBERED`` rows) - numbers that mostly rise but not always,
or on some rows only - carries the position in a way no renumbering here reproduces: the
sharded test reports it (``unheld``) and answers ``inconclusive`` in the raw form.

The assumption, stated: an index field carries the position and nothing of the row's content (an id, a row
number). A strictly increasing field that also says something about the row (a timestamp of a file sorted by
date) is held in place too, which separates it from the content it belongs to; no check here can tell the two
apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import kendalltau

ORDER_TAU = 0.5  # a field whose numbers follow the position at least this closely carries it
ORDER_ALPHA = 0.01
MIN_NUMBERED = 5  # rows with a number a field needs before its tau says anything
_LAST_NUMBER = re.compile(r"(\d+)(\D*)$")


def _number(value: Any) -> float | None:
    """The value's number: itself (int or float, not bool), or a string's last run of digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _LAST_NUMBER.search(value)
        return float(m.group(1)) if m else None
    return None


def _template(value: Any) -> str | None:
    """A string with its last number taken out (``".../test#"``), or None."""
    if not isinstance(value, str):
        return None
    m = _LAST_NUMBER.search(value)
    return value[: m.start()] + "\x00" + m.group(2) if m else None


def _with_number(value: Any, number: Any) -> Any:
    """``value`` with its number replaced by ``number``'s (an int or float value: ``number`` itself; a string: its
    last digits, keeping its zero-padding)."""
    if not isinstance(value, str):
        return number
    m = _LAST_NUMBER.search(value)
    if m is None:
        return value
    n = int(_number(number))  # type: ignore[arg-type]
    digits = m.group(1)
    new = f"{n:0{len(digits)}d}" if digits.startswith("0") and len(digits) > 1 else str(n)
    return value[: m.start(1)] + new + value[m.end(1) :]


def _monotone(numbers: Sequence[float], strict: bool) -> bool:
    steps = [b - a for a, b in zip(numbers, numbers[1:])]
    if strict:
        return all(s > 0 for s in steps) or all(s < 0 for s in steps)
    return (all(s >= 0 for s in steps) or all(s <= 0 for s in steps)) and len(set(numbers)) > 1


def _follows_order(numbers: Sequence[tuple[int, float]]) -> float | None:
    """Kendall's tau of (position, number) when it says the field follows the order, else None."""
    if len(numbers) < MIN_NUMBERED or len({n for _, n in numbers}) < 2:
        return None
    tau, p = kendalltau([i for i, _ in numbers], [n for _, n in numbers])
    return float(tau) if abs(tau) >= ORDER_TAU and p <= ORDER_ALPHA else None


@dataclass(frozen=True)
class PositionFields:
    """The position-carrying fields of one partition's raw rows (see the module docstring)."""

    index: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()
    unheld: dict[str, float] = field(default_factory=dict)  # field -> Kendall tau with the position

    @property
    def renumbered(self) -> tuple[str, ...]:
        return self.index + self.references + self.counters

    def summary(self) -> str:
        kinds = (("index", self.index), ("reference", self.references), ("counter", self.counters))
        parts = [f"{kind} {', '.join(names)}" for kind, names in kinds if names]
        text = f"raw rows renumbered in every order ({'; '.join(parts)})" if parts else ""
        if self.unheld:
            unheld = ", ".join(f"{k} (tau={v:.2f})" for k, v in self.unheld.items())
            text += ("; " if text else "") + f"fields following the row order not renumbered: {unheld}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"index": list(self.index), "references": list(self.references), "counters": list(self.counters),
                "unheld": dict(self.unheld), "summary": self.summary()}  # fmt: skip


def parse_rows(lines: Sequence[str]) -> list[dict[str, Any]] | None:
    """The rows as JSON objects, or None when any line is not one (nothing to renumber)."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            return None
        if not isinstance(row, dict):
            return None
        rows.append(row)
    return rows


def find(lines: Sequence[str]) -> PositionFields:
    """The position-carrying fields of a partition's raw rows (``lines``, canonical order, no line ends)."""
    rows = parse_rows(lines)
    if not rows or len(rows) < 3:
        return PositionFields()
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    index, counters, rest = [], [], []
    for key in keys:
        numbers = [_number(r[key]) for r in rows]
        if all(n is not None for n in numbers) and _monotone(numbers, strict=True):  # type: ignore[arg-type]
            index.append(key)
        elif all(n is not None for n in numbers) and _monotone(numbers, strict=False):  # type: ignore[arg-type]
            counters.append(key)
        else:
            rest.append(key)
    templates = {_template(r[k]) for k in index for r in rows} - {None}
    references = [k for k in rest if _refers(rows, k, templates)]
    unheld = {}
    for key in rest:
        tau = _follows_order([(i, n) for i, r in enumerate(rows) if (n := _number(r[key])) is not None])
        if key not in references and tau is not None:
            unheld[key] = tau
    return PositionFields(tuple(index), tuple(references), tuple(counters), unheld)


def counter_runs(lines: Sequence[str], fields: PositionFields) -> list[bool]:
    """For each pair of adjacent rows, whether a counter field holds one value over both (one run): the units a
    shuffle moves must keep such rows together, or its runs could not be renumbered."""
    rows = parse_rows(lines) or []
    return [any(_number(a[k]) == _number(b[k]) for k in fields.counters) for a, b in zip(rows, rows[1:])]


def _refers(rows: Sequence[dict[str, Any]], key: str, templates: set[str | None]) -> bool:
    """Every value of ``key`` is empty or reads like an index value but for its number (and one at least does)."""
    values = [r[key] for r in rows if r[key] not in ("", None)]
    return bool(values) and bool(templates) and all(_template(v) in templates for v in values)


class Renumber:
    """The texts of one shard's rows in any order, renumbered (see the module docstring).

    ``lines``: the shard's rows in canonical order (no line ends); ``end``: what follows each example.
    """

    def __init__(self, fields: PositionFields, lines: Sequence[str], end: str) -> None:
        self.fields, self.lines, self.end = fields, list(lines), end
        self.rows = parse_rows(lines) or []
        self.index_of = [{int(_number(r[k])): i for i, r in enumerate(self.rows)} for k in fields.index]  # type: ignore[arg-type]

    def texts(self, order: Sequence[int]) -> list[str]:
        if not self.rows or list(order) == list(range(len(self.lines))):
            return [self.lines[i] + self.end for i in order]
        slot = {row: k for k, row in enumerate(order)}  # the new position of each canonical row
        out = []
        runs: dict[str, dict[float, Any]] = {k: {} for k in self.fields.counters}
        for k, i in enumerate(order):
            row = dict(self.rows[i])
            for name in self.fields.index:
                row[name] = _with_number(row[name], self.rows[k][name])
            for name in self.fields.references:
                row[name] = self._reference(row[name], slot)
            for name in self.fields.counters:
                values = runs[name]
                value = _number(row[name])
                if value not in values:  # the next run met takes the next value of the canonical order
                    values[value] = self._run_values(name)[len(values)]
                row[name] = _with_number(row[name], values[value])
            out.append((self.lines[i] if row == self.rows[i] else json.dumps(row, ensure_ascii=False)) + self.end)
        return out

    def _reference(self, value: Any, slot: dict[int, int]) -> Any:
        number = _number(value)
        if number is None:
            return value
        for name, where in zip(self.fields.index, self.index_of, strict=True):
            target = where.get(int(number))
            if target is not None and _template(value) == _template(self.rows[target][name]):
                return _with_number(value, self.rows[slot[target]][name])
        return value  # a row outside the shard: it keeps its place and its number

    def _run_values(self, name: str) -> list[Any]:
        """The counter's values in canonical order, one per run."""
        out: list[Any] = []
        for r in self.rows:
            if not out or _number(out[-1]) != _number(r[name]):
                out.append(r[name])
        return out
