"""What the open-data methods share: record text, match rows, evidence spans and the partition verdict.

Every open-data method reports, per example, ``contaminated``, ``contamination_type`` (one of
``CONTAMINATION_TYPES``: the input alone was found, or the input together with its label, as in Li et
al. 2023's "input-only" / "input-and-label" contamination), ``doc_ids`` and ``spans`` (where in which
corpus document the evidence is: ``{"doc_id", "start", "end", "unit", "text"}``), so a user can open
the document and look. The partition verdict is the same measurement for all of them (``open_verdict``):
the fraction of contaminated examples, split by type.

The steps are shaped alike too, so their shared parts live here, once: a Config checks its keys with
``check_config`` (Record fields, then the method's own checks, then ``partition_threshold`` and
``max_evidence``, which every method has); ``match`` refuses an index built for another config
(``check_index``) and reads document text through ``doc_texts``; ``score`` groups its match rows with
``grouped_matches`` and writes each example's row with ``example_row``; the registered class is an
``OpenMethod`` whose steps are the module's functions (``Steps``).

``HashTable`` is the benchmark-side lookup structure of the exact matchers: sorted distinct 64-bit keys
pointing to any number of entries, picklable NumPy arrays, looked up for a whole batch of corpus
positions with one ``searchsorted``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar, NamedTuple

import numpy as np

from contamray.corpus.pieces import Window
from contamray.methods.base import Method, Verdict
from contamray.metrics.hash_lookup import SortedHashes
from contamray.records import Record

# "label_only", "frequent_only" and "template_only": ngram_overlap's (issue #16); the others never give them
CONTAMINATION_TYPES = ("clean", "input_only", "input_and_label", "label_only", "frequent_only", "template_only")
# types neither contaminated nor clean: found only through evidence that does not count, and why
SET_APART = {
    "frequent_only": "matched only n-grams too frequent to count",
    "template_only": "matched only template n-grams shared with other benchmark items",
}
TEXT_FIELDS = tuple(
    f.name for f in dataclasses.fields(Record) if f.type in ("str", str) and f.name not in ("id", "partition")
)


def check_fields(method: str, key: str, fields: Any, allow_empty: bool = True) -> tuple[str, ...]:
    """``fields`` as a tuple of Record text field names; the error names the config key and choices."""
    value = (fields,) if isinstance(fields, str) else tuple(fields or ())
    for name in value:
        if name not in TEXT_FIELDS:
            raise ValueError(
                f"{method}: {key} names {name!r}, which is not a text field of Record; "
                f"choose from {', '.join(TEXT_FIELDS)}"
            )
    if not value and not allow_empty:
        raise ValueError(f"{method}: {key} is empty; name at least one of {', '.join(TEXT_FIELDS)}")
    return value


def check(method: str, checks: Iterable[tuple[str, bool, str]], cfg: Any) -> None:
    """Raise for the first failed ``(key, ok, expected)``, naming the key, its value and what is expected."""
    for key, ok, expected in checks:
        if not ok:
            raise ValueError(f"{method}: {key}={getattr(cfg, key)!r} is invalid; expected {expected}")


def integer(cfg: Any, key: str, low: int, note: str = "") -> tuple[str, bool, str]:
    """The check that ``cfg.<key>`` is an integer >= ``low``; ``note`` (e.g. the paper's value) ends the hint."""
    value = getattr(cfg, key)
    return key, isinstance(value, int) and value >= low, f"an integer >= {low}" + (f" {note}" if note else "")


def set_fields(method: str, cfg: Any, required: Sequence[str] = (), optional: Sequence[str] = ()) -> None:
    """Turn a frozen Config's field keys into tuples of Record text fields (``check_fields``); each
    ``required`` key must name at least one."""
    for key in (*required, *optional):
        value = check_fields(method, key, getattr(cfg, key), allow_empty=key not in required)
        object.__setattr__(cfg, key, value)


def check_config(
    method: str,
    cfg: Any,
    checks: Iterable[tuple[str, bool, str]],
    required_fields: Sequence[str] = (),
    optional_fields: Sequence[str] = (),
) -> None:
    """Validate a frozen open-data Config in its ``__post_init__``, in this order.

    The field keys become tuples of Record text fields (``set_fields``), then ``checks`` (see
    ``check``) and last the two keys every open-data method has: ``partition_threshold`` (a fraction)
    and ``max_evidence`` (an integer >= 0).
    """
    set_fields(method, cfg, required_fields, optional_fields)
    shared = [
        ("partition_threshold", 0.0 <= float(cfg.partition_threshold) <= 1.0, "a fraction in [0, 1]"),
        integer(cfg, "max_evidence", 0),
    ]
    check(method, [*checks, *shared], cfg)


def check_index(method: str, index: Any, cfg: Any, keys: Sequence[str]) -> None:
    """Refuse to ``match`` with an index built from another config (its ``keys`` must agree)."""
    built = {key: getattr(index, key) for key in keys}
    says = {key: getattr(cfg, key) for key in keys}
    if built != says:
        raise ValueError(
            f"{method}.match: the index was built with {', '.join(f'{k}={v!r}' for k, v in built.items())}, "
            f"the config says {', '.join(f'{k}={v!r}' for k, v in says.items())}; rebuild the index"
        )


def doc_texts(docs: Sequence[dict[str, Any]], method: str) -> list[str]:
    """The ``text`` of every document of a batch; a document without str text is an error naming it."""
    texts = [doc.get("text") for doc in docs]
    if all(type(text) is str for text in texts):  # the common case, one C-level pass
        return texts  # type: ignore[return-value]
    for i, (doc, text) in enumerate(zip(docs, texts, strict=True)):
        if not isinstance(text, str):
            raise TypeError(
                f"{method}.match: document {doc.get('doc_id', f'#{i}')!r} has text of type "
                f"{type(text).__name__}, not str; read the corpus with contamray.corpus.read_corpus "
                "(it skips and reports rows without text) or fix the corpus' text_field"
            )
    return texts  # type: ignore[return-value]


def join_fields(record: Record, fields: Sequence[str]) -> str:
    return " ".join(str(getattr(record, name) or "") for name in fields).strip()


def query_text(record: Record, fields: Sequence[str]) -> str:
    """The text of ``fields``; ``verbalized`` falls back to input + label when an adapter left it empty."""
    if tuple(fields) == ("verbalized",) and not record.verbalized:
        return join_fields(record, ("input", "label"))
    return join_fields(record, fields)


def table_rows(table: Any) -> list[dict[str, Any]]:
    """Rows of a pandas DataFrame, an Arrow table, a dict of columns or a list of dicts."""
    if table is None:
        return []
    if hasattr(table, "to_pylist"):  # pyarrow.Table
        return table.to_pylist()
    if hasattr(table, "to_dict") and hasattr(table, "columns"):  # pandas.DataFrame
        return table.to_dict("records")
    if isinstance(table, dict):
        keys = list(table)
        n = len(table[keys[0]]) if keys else 0
        return [{k: table[k][i] for k in keys} for i in range(n)]
    return [dict(r) for r in table]


def match_rows(matches: Any, needed: Sequence[str], method: str) -> list[dict[str, Any]]:
    """Match rows from any table form, checked for the columns ``score`` needs."""
    rows = table_rows(matches)
    for i, row in enumerate(rows):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(
                f"{method}.score: match row {i} (record {row.get('record_id')!r}) lacks "
                f"{', '.join(missing)}; pass the rows returned by {method}.match"
            )
    return rows


def by_record(rows: Iterable[dict[str, Any]], wanted: set[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        rid = str(row["record_id"])
        if rid in wanted:
            out.setdefault(rid, []).append(row)
    return out


def grouped_matches(
    records: Sequence[Record], matches: Any, needed: Sequence[str], method: str
) -> dict[str, list[dict[str, Any]]]:
    """``score``'s match rows (checked for the ``needed`` columns) by record id, for ``records`` only."""
    return by_record(match_rows(matches, needed, method), {r.id for r in records})


def contamination_type(contaminated: bool, label_found: bool) -> str:
    if not contaminated:
        return "clean"
    return "input_and_label" if label_found else "input_only"


def example_row(
    record: Record,
    columns: dict[str, Any],
    *,
    contaminated: bool,
    label_found: bool,
    docs: Iterable[str],
    spans: Iterable[tuple[str, int, int]],
    unit: str,
    max_evidence: int,
    error: str,
    evidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One example's ``score`` row: ``record_id``, ``partition``, the method's ``columns``, then the
    columns every open-data method has (the decision, its type, the documents, ``evidence`` columns,
    the merged ``spans`` in ``unit``s, and ``error``)."""
    doc_ids = sorted({str(d) for d in docs})
    return {
        "record_id": record.id,
        "partition": record.partition,
        **columns,
        "contaminated": bool(contaminated),
        "contamination_type": contamination_type(contaminated, label_found),
        "n_docs": len(doc_ids),
        "doc_ids": doc_ids[:max_evidence],
        **(evidence or {}),
        "spans": merge_spans(spans, unit, max_evidence),
        "error": error,
    }


def merge_spans(spans: Iterable[tuple[str, int, int]], unit: str, limit: int) -> list[dict[str, Any]]:
    """Overlapping or touching ``(doc_id, start, end)`` intervals merged per document, sorted."""
    per_doc: dict[str, list[tuple[int, int]]] = {}
    for doc_id, start, end in spans:
        per_doc.setdefault(str(doc_id), []).append((int(start), int(end)))
    merged: list[dict[str, Any]] = []
    for doc_id in sorted(per_doc):
        current: list[int] | None = None
        for start, end in sorted(per_doc[doc_id]):
            if current is not None and start <= current[1]:
                current[1] = max(current[1], end)
                continue
            if current is not None:
                merged.append({"doc_id": doc_id, "start": current[0], "end": current[1], "unit": unit})
            current = [start, end]
        if current is not None:
            merged.append({"doc_id": doc_id, "start": current[0], "end": current[1], "unit": unit})
    return merged[:limit]


def single_partition(rows: list[dict[str, Any]], method: str) -> str:
    if not rows:
        raise ValueError(f"{method}.reduce: the table is empty; score at least one example")
    partitions = sorted({str(r.get("partition")) for r in rows})
    if len(partitions) != 1:
        raise ValueError(
            f"{method}.reduce: one partition at a time, got {len(partitions)}: {', '.join(partitions[:5])}"
        )
    return partitions[0]


def fraction(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


def open_verdict(
    method: str,
    table: Any,
    partition_threshold: float,
    details: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Verdict:
    """The partition verdict of an open-data method: the fraction of contaminated examples.

    ``rate`` (= ``statistic``) is the fraction of contaminated examples among those that did not
    fail; ``contaminated`` is ``rate > partition_threshold`` (default 0: any contaminated example).
    ``details`` splits it into input-only and input-and-label, then adds the method's ``details``;
    ``params`` (the method's parameters) come first, after ``rate_unit``. ``p_value`` is None: a
    measurement.
    """
    rows = table_rows(table)
    partition = single_partition(rows, method)
    ok = [r for r in rows if not r.get("error")]
    n_dirty = sum(bool(r.get("contaminated")) for r in ok)
    n_input_only = sum(r.get("contamination_type") == "input_only" for r in ok)
    n_both = sum(r.get("contamination_type") == "input_and_label" for r in ok)
    rate = fraction(n_dirty, len(ok))
    found = summary_of_types(ok)
    return Verdict(
        method=method,
        partition=partition,
        statistic=rate,
        contaminated=bool(ok) and rate > partition_threshold,
        p_value=None,
        rate=rate,
        n_examples=len(rows),
        n_failed=len(rows) - len(ok),
        details={
            "rate_unit": "fraction",
            **(params or {}),
            "partition_threshold": partition_threshold,
            "n_contaminated": n_dirty,
            "n_input_only": n_input_only,
            "n_input_and_label": n_both,
            "input_only_rate": fraction(n_input_only, len(ok)),
            "input_and_label_rate": fraction(n_both, len(ok)),
            **(details or {}),
            "summary": found,
        },
    )


def summary_of_types(ok: list[dict[str, Any]]) -> str:
    """The report's line for an open-data verdict: examples found, by where the match fell, and those set
    apart (``SET_APART``: only n-grams too frequent to count, only template n-grams) - never folded into
    "clean"."""
    types = Counter(str(r.get("contamination_type")) for r in ok)
    found = sum(bool(r.get("contaminated")) for r in ok)
    kinds = [t for t in CONTAMINATION_TYPES if t != "clean" and t not in SET_APART and types[t]]
    parts = [f"{types[t]} {t.replace('_', ' ')}" for t in kinds]
    line = f"{found} of {len(ok)} examples found in the corpus" + (f" ({', '.join(parts)})" if parts else "")
    for kind, what in SET_APART.items():
        if types[kind]:
            line += f"; {types[kind]} {what} (not counted clean)"
    return line


FOLD_CONTRACT = """What an open-data method's ``fold(rows, cfg)`` promises (issue #16: aggregate where the data is).

``rows`` are match rows as ``match`` returns them, rows an earlier ``fold`` returned, or a mix, of any
records of one cell. Every corpus document is matched in one batch of one match worker: whole, or, when
longer than ``ray.corpus_batch_bytes``, in pieces (``contamray.corpus.pieces``: each window found by
exactly one piece, at its offset in the whole document) whose match rows are folded together in one call,
so the rows of one document never arrive split across two inputs that are folded together, and ``fold``
keeps per document what it would keep of the whole document (its first occurrence of a gram, one count).

1. Faithful: for any split of the corpus documents into batches ``D1 .. Dk`` and any order and bracketing
   of the folds, ``score(records, fold(fold(match(D1)) + ... + fold(match(Dk))))`` equals
   ``score(records, match(D1 + ... + Dk))`` row for row; and folding is a summary, not a history:
   ``fold(fold(A) + fold(B)) == fold(A + B)``. ``score`` (and ``judge_requests``) fold their input first,
   so they take raw and folded rows alike.
2. Bounded: the rows fold keeps per example do not grow with the number of corpus documents that copy
   it: at most what the example's own size and ``max_evidence`` (the first documents and spans kept as
   evidence, in ``doc_id`` order) allow; counts (documents, n-grams) are carried as numbers.
3. Canonical: the same multiset of rows in gives the same list out (sorted), so a stored partial scan
   is the same bytes whichever match actor produced it.
4. Plain: rows are dicts of str / int / float / bool / lists of them (pickled to the result store).
5. Per example: every row carries its ``record_id`` and rows of different records never meet, so
   ``fold(A + B)`` for rows of disjoint records is ``fold(A) + fold(B)`` in record id order (the scan's
   driver folds a few records at a time, ``pipeline/corpus_scan._Folding``).
"""


class Steps(NamedTuple):
    """An open-data method's module functions, the steps of ``contamray.methods.base`` (``fold``: see
    ``FOLD_CONTRACT``)."""

    build_index: Callable[..., Any]
    match: Callable[..., list[dict[str, Any]]]
    score: Callable[..., list[dict[str, Any]]]
    reduce: Callable[..., Verdict]
    fold: Callable[..., list[dict[str, Any]]]
    window: Callable[..., Window | None] | None = None  # how a long document may be cut; None: never


class OpenMethod(Method):
    """A registered open-data method whose steps are its module's functions (``steps``).

    Subclasses set ``name``, ``Config`` and ``steps``; ``score`` ignores the runner's extra keyword
    arguments unless a subclass (a method with a judge) overrides it.
    """

    family = "open"
    engine_roles = ()
    steps: ClassVar[Steps]
    # its match step encodes text with a neural model: on a cluster with GPUs its match actors hold a share of
    # one (``ray.match_gpu_share``) and encode there (``metrics.embedding.encode``)
    match_on_gpu: ClassVar[bool] = False

    def build_index(self, records: list[Record], cfg: Any) -> Any:
        return self.steps.build_index(records, cfg)

    def match(self, docs: list[dict[str, Any]], index: Any, cfg: Any) -> list[dict[str, Any]]:
        return self.steps.match(docs, index, cfg)

    def fold(self, rows: list[dict[str, Any]], cfg: Any) -> list[dict[str, Any]]:
        return self.steps.fold(rows, cfg)

    def score(self, records: list[Record], evidence: Any, cfg: Any, **extra: Any) -> list[dict[str, Any]]:
        return self.steps.score(records, evidence, cfg)

    def reduce(self, table: Any, cfg: Any) -> Verdict:
        return self.steps.reduce(table, cfg)

    def window(self, cfg: Any, index: Any) -> Window | None:
        """What ``match`` looks at, so the scan may match a long document in pieces that lose nothing
        (``contamray.corpus.pieces``); None (the default): the method matches every document whole."""
        return self.steps.window(cfg, index) if self.steps.window is not None else None


@dataclass
class HashTable:
    """Sorted distinct uint64 ``keys``; the entries of ``keys[i]`` are ``entries[starts[i]:starts[i+1]]``.

    ``entries`` index whatever the caller keeps beside the table (a record, a sample, a position).
    Keys must be well-mixed hashes (the lookup prefilters on their top bits).
    """

    keys: np.ndarray
    starts: np.ndarray
    entries: np.ndarray
    _finder: SortedHashes | None = None  # lookup tables, rebuilt per process from the keys

    def __getstate__(self) -> dict[str, Any]:
        return {"keys": self.keys, "starts": self.starts, "entries": self.entries, "_finder": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @classmethod
    def build(cls, hashes: np.ndarray, entries: np.ndarray) -> HashTable:
        hashes = np.asarray(hashes, dtype=np.uint64)
        entries = np.asarray(entries, dtype=np.int64)
        order = np.lexsort((entries, hashes))
        hashes, entries = hashes[order], entries[order]
        first = np.ones(hashes.shape[0], dtype=bool)
        first[1:] = hashes[1:] != hashes[:-1]
        starts = np.append(np.flatnonzero(first), hashes.shape[0]).astype(np.int64)
        return cls(hashes[first], starts, entries)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def warm(self) -> HashTable:
        """Build this process's lookup tables now rather than on the first corpus batch."""
        if self._finder is None:
            self._finder = SortedHashes(self.keys)
        return self

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For every hit: (position in ``hashes``, entry); a key with k entries gives k pairs."""
        if self.keys.shape[0] == 0 or hashes.shape[0] == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        hit, key = self.warm()._finder.find(hashes)  # type: ignore[union-attr]
        counts = self.starts[key + 1] - self.starts[key]
        owner = np.repeat(np.arange(hit.shape[0]), counts)
        within = np.arange(owner.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
        return hit[owner], self.entries[self.starts[key][owner] + within]


def region_of(start: int, end: int, boundary: int) -> str:
    """Where ``[start, end)`` of input + label (split at ``boundary``) lies: input, label or overlap."""
    if end <= boundary:
        return "input"
    if start >= boundary:
        return "label"
    return "overlap"


def contains(haystack: np.ndarray, needle: np.ndarray, start: int = 0, stop: int | None = None) -> int:
    """First position ``p`` in ``[start, stop]`` with ``haystack[p:p+len(needle)] == needle``, else -1."""
    n = needle.shape[0]
    last = haystack.shape[0] - n
    if stop is not None:
        last = min(last, stop)
    if n == 0 or last < start:
        return -1
    candidates = np.flatnonzero(haystack[start : last + 1] == needle[0]) + start
    for p in candidates:
        if np.array_equal(haystack[p : p + n], needle):
            return int(p)
    return -1


# fold helpers: match rows and folded rows apart (the n-gram, exact and token-span methods)


def split_fold_input(rows: Any, mark: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``fold``'s input (match rows, folded rows or both, in any table form) split into (match rows,
    folded rows); folded rows are those with the column ``mark``, which match rows never have."""
    rows = rows if isinstance(rows, list) else table_rows(rows)
    folded = [row for row in rows if mark in row]
    return ([row for row in rows if mark not in row] if folded else rows), folded


def columns_of(rows: list[dict[str, Any]], needed: Sequence[str], method: str) -> dict[str, list[Any]]:
    """The ``needed`` columns of match rows as lists; a row without one is an error naming it."""
    if not rows:
        return {key: [] for key in needed}
    try:
        return dict(zip(needed, map(list, zip(*map(itemgetter(*needed), rows), strict=True)), strict=True))
    except KeyError:
        match_rows(rows, needed, method)  # raises, naming the first incomplete row
        raise


def value_codes(values: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """(sorted distinct values, each value's position among them): codes that sort like the values."""
    distinct = sorted(set(values))
    rank = {value: i for i, value in enumerate(distinct)}
    return distinct, np.fromiter(map(rank.__getitem__, values), dtype=np.int64, count=len(values))


def rank_in_group(group: np.ndarray) -> np.ndarray:
    """For a sorted ``group`` column: each row's position within its run of equal values (0, 1, ...)."""
    if group.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.ones(group.shape[0], dtype=bool)
    starts[1:] = group[1:] != group[:-1]
    first = np.flatnonzero(starts)
    return np.arange(group.shape[0]) - np.repeat(first, np.diff(np.append(first, group.shape[0])))


def first_doc_hits(hits: Iterable[tuple[Any, ...]], limit: int) -> list[tuple[Any, ...]]:
    """The hits (tuples starting with their ``doc_id``) of the first ``limit`` documents in ``doc_id``
    order, sorted: the evidence a fold keeps of an example (``FOLD_CONTRACT`` 2)."""
    hits = sorted(set(hits))
    first = set(sorted({hit[0] for hit in hits})[:limit])
    return [hit for hit in hits if hit[0] in first]


def merged_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching ``[start, end)`` intervals merged, sorted (as ``merge_spans`` merges)."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


# fold helpers: evidence summaries and best rows (substring, METEOR and embedding methods)

FOLD = "fold"  # what a row returned by ``fold`` is: "evidence" (an example's summary) or "best" (a match row kept)


def folded_kind(row: dict[str, Any]) -> str:
    """``""`` for a match row as ``match`` returned it, else what ``fold`` made of it (the ``FOLD`` column)."""
    return str(row.get(FOLD) or "")


def fold_input(rows: Any, needed: Sequence[str], method: str) -> dict[str, list[dict[str, Any]]]:
    """``fold``'s input by record id, in record id order; every row but an evidence summary is checked for
    the ``needed`` columns of a match row."""
    out: dict[str, list[dict[str, Any]]] = {}
    for i, row in enumerate(table_rows(rows)):
        kind = folded_kind(row)
        missing = [k for k in (("record_id",) if kind == "evidence" else needed) if k not in row]
        if missing:
            raise ValueError(
                f"{method}.fold: row {i} (record {row.get('record_id')!r}) lacks {', '.join(missing)}; "
                f"pass the rows returned by {method}.match or {method}.fold"
            )
        out.setdefault(str(row["record_id"]), []).append(row)
    return dict(sorted(out.items()))


def merged_spans(spans: Iterable[tuple[str, int, int]], limit: int) -> list[tuple[str, int, int]]:
    """The first ``limit`` merged ``(doc_id, start, end)`` intervals, as ``merge_spans`` orders them."""
    return [(s["doc_id"], s["start"], s["end"]) for s in merge_spans(spans, "", limit)]


@dataclass
class Evidence:
    """Where an example was found, as far as its ``score`` row shows it: the number of documents, the first
    ``limit`` of them in ``doc_id`` order, the first ``limit`` merged spans, and whether the label was seen.

    The spans of the first ``limit`` merged spans all lie in the first ``limit`` documents, and a
    document's rows all come from one ``match`` call, so evidence of disjoint document sets combines
    exactly: counts add, kept documents and spans are merged and cut again (``combine``).
    """

    n_docs: int = 0
    doc_ids: list[str] = dataclasses.field(default_factory=list)
    spans: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    label_found: bool = False

    @classmethod
    def of_matches(cls, rows: Sequence[dict[str, Any]], limit: int, label_found: bool) -> Evidence:
        """The evidence of match rows (``doc_id``, ``start``, ``end``)."""
        docs = sorted({str(r["doc_id"]) for r in rows})
        kept = set(docs[:limit])
        spans = [(str(r["doc_id"]), int(r["start"]), int(r["end"])) for r in rows if str(r["doc_id"]) in kept]
        return cls(len(docs), docs[:limit], merged_spans(spans, limit), bool(label_found))

    @classmethod
    def of_row(cls, row: dict[str, Any] | None) -> Evidence:
        """The evidence a summary row (``row``) carries; empty for None."""
        if row is None:
            return cls()
        spans = zip(row["span_doc_ids"], row["span_starts"], row["span_ends"], strict=True)
        return cls(
            int(row["n_docs"]),
            [str(d) for d in row["doc_ids"]],
            [(str(d), int(s), int(e)) for d, s, e in spans],
            bool(row["label_found"]),
        )

    @classmethod
    def combine(cls, parts: Sequence[Evidence], limit: int) -> Evidence:
        """The evidence of the union of the parts' (disjoint) documents."""
        docs = sorted({d for p in parts for d in p.doc_ids})[:limit]
        spans = merged_spans([s for p in parts for s in p.spans], limit)
        return cls(sum(p.n_docs for p in parts), docs, spans, any(p.label_found for p in parts))

    def row(self, record_id: str, partition: Any, **extra: Any) -> dict[str, Any]:
        """This evidence as ``fold``'s summary row of the example (plain columns; ``extra`` last)."""
        return {
            "record_id": record_id,
            "partition": partition,
            FOLD: "evidence",
            "n_docs": self.n_docs,
            "doc_ids": list(self.doc_ids),
            "span_doc_ids": [d for d, _, _ in self.spans],
            "span_starts": [s for _, s, _ in self.spans],
            "span_ends": [e for _, _, e in self.spans],
            "label_found": self.label_found,
            **extra,
        }


def fold_evidence(
    rows: Sequence[dict[str, Any]],
    limit: int,
    counts: Callable[[dict[str, Any]], bool],
    label: Callable[[dict[str, Any]], bool],
) -> Evidence:
    """One example's evidence from its ``fold`` input: the summaries already folded, and the match rows
    (not the kept "best" ones, already summarised) that ``counts`` as evidence, ``label`` telling which
    of them show the label."""
    parts = [Evidence.of_row(r) for r in rows if folded_kind(r) == "evidence"]
    found = [r for r in rows if not folded_kind(r) and counts(r)]
    if found:
        parts.append(Evidence.of_matches(found, limit, any(label(r) for r in found)))
    return Evidence.combine(parts, limit)


def evidence_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The evidence summary among one example's folded rows, or None."""
    return next((r for r in rows if folded_kind(r) == "evidence"), None)


def top_rows(rows: Iterable[dict[str, Any]], k: int, column: str) -> list[dict[str, Any]]:
    """The ``k`` match rows of highest ``column``, one per ``(doc_id, start)`` (the higher value, then the
    lesser content), highest first, ties by document then start: the same whatever the input order."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        key = (str(row["doc_id"]), int(row["start"]))
        old = seen.get(key)
        if old is None or _outranks(row, old, column):
            seen[key] = row
    ordered = sorted(seen.values(), key=lambda r: (-float(r[column]), str(r["doc_id"]), int(r["start"])))
    return ordered[:k]


def _outranks(row: dict[str, Any], old: dict[str, Any], column: str) -> bool:
    if float(row[column]) != float(old[column]):
        return float(row[column]) > float(old[column])
    return repr(sorted(row.items(), key=str)) < repr(sorted(old.items(), key=str))


def kept(row: dict[str, Any]) -> dict[str, Any]:
    """A match row as ``fold`` keeps it (marked ``best``)."""
    return row if row.get(FOLD) == "best" else {**row, FOLD: "best"}


def evidence_row(
    record: Record,
    columns: dict[str, Any],
    evidence: Evidence,
    *,
    contaminated: bool,
    unit: str,
    max_evidence: int,
    error: str,
    spans: Iterable[tuple[str, int, int]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``example_row`` from folded ``evidence`` (``spans`` replaces its spans when given)."""
    row = example_row(
        record,
        columns,
        contaminated=contaminated,
        label_found=evidence.label_found,
        docs=evidence.doc_ids,
        spans=evidence.spans if spans is None else spans,
        unit=unit,
        max_evidence=max_evidence,
        error=error,
        evidence=extra,
    )
    row["n_docs"] = evidence.n_docs
    return row


def fold_ranked(
    rows: Any,
    needed: Sequence[str],
    method: str,
    *,
    column: str,
    limit: int,
    counts: Callable[[dict[str, Any]], bool],
    label: Callable[[dict[str, Any]], bool],
) -> list[dict[str, Any]]:
    """The ``fold`` of a matcher that keeps an example's best match row by ``column``: per example (in record
    id order) the evidence summary of the rows that ``counts`` (when there are any; ``fold_evidence``),
    then the best row, kept (``top_rows``)."""
    out = []
    for record_id, group in fold_input(rows, needed, method).items():
        evidence = fold_evidence(group, limit, counts, label)
        if evidence.n_docs:
            out.append(evidence.row(record_id, group[0].get("partition")))
        ranked = [r for r in group if folded_kind(r) != "evidence"]
        out.extend(kept(r) for r in top_rows(ranked, 1, column))
    return out


def ranked_example(rows: Sequence[dict[str, Any]]) -> tuple[Evidence, dict[str, Any] | None]:
    """An example's rows from ``fold_ranked``: its evidence and its best match row (None if none)."""
    best = next((r for r in rows if folded_kind(r) == "best"), None)
    return Evidence.of_row(evidence_summary(rows)), best
