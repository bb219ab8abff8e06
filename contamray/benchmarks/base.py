"""What a benchmark adapter is, and the checked view of one raw row that adapters convert from.

An ``Adapter`` is data (hub id, configs, splits, task type, label names) plus one function that turns
a ``RowContext`` into a ``Record``. The function reads every field it needs through the context's
``text``/``texts``/``index``/``value`` (optional extras such as MMLU's subject may be read from ``row``),
which check presence, type and emptiness and
raise ``BenchmarkRowError`` naming the source file (or hub id), the row index and id, the field and
the fix. That keeps every adapter short and every bad-input message the same shape, and lets the loader
turn errors into ``RowFailure`` rows when ``strict=False``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from contamray.records import TASK_TYPES, Record

_MISSING = object()


@dataclass(frozen=True)
class RowFailure:
    """One row that could not become a Record: where it is, which field, and how to fix it."""

    partition: str
    source: str
    row_index: int
    row_id: str
    field: str
    message: str

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


class BenchmarkRowError(ValueError):
    """A raw benchmark row is missing a field, has an empty text, or holds a value out of range."""

    def __init__(self, failure: RowFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class LoadResult:
    """The Records of one partition (in canonical row order) and the rows that failed."""

    records: list[Record]
    failures: list[RowFailure]
    partition: str = ""
    source: str = ""
    total_rows: int = 0


@dataclass
class RowContext:
    """A raw row with its coordinates; the checked accessors raise ``BenchmarkRowError``."""

    adapter: Adapter
    row: Mapping[str, Any]
    row_index: int
    partition: str
    source: str
    split: str
    config: str
    extra_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def row_id(self) -> str:
        """The dataset's own id when it has one (string ids as they are, integer index fields as
        ``<partition>#<value>``), else ``<partition>#<row index>``."""
        if self.adapter.id_field:
            value = self.row.get(self.adapter.id_field)
            if isinstance(value, bool):
                value = None
            if isinstance(value, int):
                return f"{self.partition}#{value}"
            if isinstance(value, str) and value.strip():
                return value.strip()
        return f"{self.partition}#{self.row_index}"

    @property
    def labeled(self) -> bool:
        """False for splits the hub publishes without gold labels (e.g. GLUE test, label -1)."""
        return self.split not in self.adapter.unlabeled_splits

    def fail(self, field_name: str, problem: str, fix: str | None = None) -> NoReturn:
        fix = fix or (
            f"restore '{field_name}' as it is in the hub dataset {self.adapter.hub_id} "
            f"(config {self.config}, split {self.split}), drop the row, or load with strict=False "
            "to skip the row and get a RowFailure"
        )
        message = (
            f"{self.source}: row {self.row_index} (id {self.row_id!r}) of {self.partition}: "
            f"field '{field_name}' {problem}. Fix: {fix}"
        )
        raise BenchmarkRowError(
            RowFailure(self.partition, self.source, self.row_index, self.row_id, field_name, message)
        )

    def value(self, path: str) -> Any:
        """The value at ``path`` (dotted for nested dicts, e.g. ``choices.text``); never None."""
        node: Any = self.row
        for part in path.split("."):
            node = node.get(part, _MISSING) if isinstance(node, Mapping) else _MISSING
            if node is _MISSING or node is None:
                self.fail(path, "is missing")
        return node

    def text(self, path: str) -> str:
        """A non-blank string field, returned unchanged."""
        value = self.value(path)
        if not isinstance(value, str):
            self.fail(path, f"is not text (got {type(value).__name__} {value!r})")
        if not value.strip():
            self.fail(path, "is empty")
        return value

    def texts(self, path: str, min_count: int = 1) -> tuple[str, ...]:
        """A list of non-blank strings (answer options, endings) with at least ``min_count`` items."""
        value = self.value(path)
        if not isinstance(value, Sequence) or isinstance(value, str):
            self.fail(path, f"is not a list of texts (got {type(value).__name__})")
        if len(value) < min_count:
            self.fail(path, f"has {len(value)} items; expected at least {min_count}")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{path}[{i}]", f"is not text (got {type(item).__name__} {item!r})")
            if not item.strip():
                self.fail(f"{path}[{i}]", "is empty")
        return tuple(value)

    def index(self, path: str, size: int, base: int = 0) -> int | None:
        """An integer key (int or digit string) pointing into ``size`` options, 0-based on return.

        Returns None for a split published without labels (``-1`` or ``""``); in a labelled split
        that is an error.
        """
        value = self.row.get(path) if "." not in path else self.value(path)
        if value is None or (isinstance(value, str) and not value.strip()) or value == -1:
            if not self.labeled:
                return None
            self.fail(path, "is missing" if value is None else f"is {value!r} (no gold label)")
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            self.fail(path, f"is not an integer key (got {type(value).__name__} {value!r})")
        try:
            key = int(value)
        except ValueError:
            self.fail(path, f"is not an integer key (got {value!r})")
        if not base <= key < base + size:
            self.fail(path, f"is {value!r}; expected an integer in [{base}, {base + size - 1}]")
        return key - base

    def record(self, **fields: Any) -> Record:
        """The Record with id, partition, task and order filled from the context."""
        meta = {**self.extra_meta, **fields.pop("meta", {})}
        return Record(
            id=self.row_id,
            partition=self.partition,
            task=self.adapter.task,
            order=self.row_index,
            source_row=json.dumps(dict(self.row), ensure_ascii=False, default=str),
            meta=meta,
            **fields,
        )


Converter = Callable[[RowContext], Record]
# Whole-split hook: the named columns of the split -> extra meta per row (same length as the split).
GroupHook = Callable[[Mapping[str, list[Any]], str], list[dict[str, Any]]]
# Generated-dataset hook: (config, split) -> the split's raw rows, made in-process (no hub, no mirror).
GenerateHook = Callable[[str, str], list[dict[str, Any]]]


@dataclass(frozen=True)
class Adapter:
    """One benchmark partition family: where its rows live and how a row becomes a Record."""

    name: str
    hub_id: str
    config: str
    splits: tuple[str, ...]
    default_split: str
    task: str
    convert: Converter
    label_names: tuple[str, ...] = ()
    configs: tuple[str, ...] = ()
    id_field: str | None = None
    unlabeled_splits: tuple[str, ...] = ()
    group_columns: tuple[str, ...] = ()
    groups: GroupHook | None = None
    # rows a declared group takes, for plan-time checks (Winogrande's twin pairs, HellaSwag's activity runs: 2)
    group_rows: int = 1
    note: str = ""
    generate: GenerateHook | None = None  # set for generated benchmarks (synthetic_facts)
    # rows are independent draws whatever their order (a generator drawing each row alone), so a contiguous
    # block is a random sample; False for every hub dataset, whose order may follow content
    independent_rows: bool = False

    def __post_init__(self) -> None:
        if self.task not in TASK_TYPES:
            raise ValueError(f"adapter {self.name!r}: task {self.task!r} not in {TASK_TYPES}")
        if self.default_split not in self.splits:
            raise ValueError(f"adapter {self.name!r}: default split {self.default_split!r} not in splits")

    @property
    def all_configs(self) -> tuple[str, ...]:
        return self.configs or (self.config,)

    def resolve_split(self, split: str | None) -> str:
        split = split or self.default_split
        if split not in self.splits:
            raise ValueError(
                f"benchmark {self.name!r} ({self.hub_id}) has no split {split!r}; "
                f"use one of: {', '.join(self.splits)}"
            )
        return split

    def resolve_config(self, config: str | None) -> str:
        config = config or self.config
        if config not in self.all_configs:
            raise ValueError(
                f"benchmark {self.name!r} ({self.hub_id}) has no config {config!r}; "
                f"use one of: {', '.join(self.all_configs)}"
            )
        return config

    def partition(self, config: str, split: str) -> str:
        return f"{self.name}/{config}/{split}"

    def describe(self) -> str:
        """One line for a CLI listing: name, task, hub id and config, splits (default starred)."""
        splits = ", ".join(s + ("*" if s == self.default_split else "") for s in self.splits)
        line = f"{self.name:<15} {self.task:<21} {self.hub_id} [{self.config}]  splits: {splits}"
        if self.label_names:
            line += f"  labels: {' | '.join(self.label_names)}"
        if len(self.all_configs) > 1:
            line += f"  ({len(self.all_configs)} configs)"
        return line


def append(*parts: str) -> str:
    """Li et al.'s verbalisation for question + answer: the parts joined by one space."""
    return " ".join(p.strip() for p in parts if p and p.strip())
