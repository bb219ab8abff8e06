"""What a corpus scan covered, and what that does to an open-data verdict.

An open-data method says "clean" when it did not find a partition's rows in the corpus. That holds only for the
documents the scan read: the readers skip what they cannot read and go on (``corpus.readers``: a bad row, a file
lost whole - unreadable, gone, its match actor dead on every try -, or the rest of a file after a break), and list
each in the run's ``corpus_errors.jsonl``. ``CorpusCoverage`` is that list read against the corpus' file listing:

- ``rows_skipped``: rows lost one by one (a bad JSON line, a row without the text field) - a few documents;
- ``files_unread``: files lost whole or from a row on (``readers.loses_documents``), and ``unread_bytes``, the sum
  of their sizes: an upper bound of the listed bytes that were not read (a file cut after its first half counts
  whole - where it broke is known by line, not by byte); ``share`` = ``unread_bytes`` / ``total_bytes`` of the
  listing, or None when a lost file's size is unknown (a hub dataset's shard). What a *truncated* file lost past
  its end is in no listing: a ``.gz`` cut short holds fewer bytes than it once compressed, so no count of bytes
  bounds the documents it lost - counting the file whole is the convention, and its path is named for restoring.

``with_coverage`` adds the losses to an open-data verdict (``details``: ``corpus_rows_skipped``,
``corpus_files_unread``, ``corpus_unread_bytes``, ``corpus_bytes``, ``corpus_unread_share``; and its summary),
and turns a "clean" into ``inconclusive`` when up to more than ``corpus.max_unread`` of the corpus (by bytes; by
default 5 %) may not have been read, or an unknown share: not finding the rows in what was read cannot then say
they are not in the corpus. A "contaminated" stays contaminated (what was found is in the corpus; its rate is a
lower bound). Rows skipped one by one never decide: their documents are few and their number is stated.

The scan writes one ``CorpusCoverage`` per open-data cell beside its scored examples (``ResultStore.put_coverage``),
so a verdict reduced later - by a re-run that finds the cell scored but not reduced - says the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from contamray.corpus.readers import loses_documents

DEFAULT_MAX_UNREAD = 0.05
MAX_UNREAD_KEY = "corpus.max_unread"
MAX_LISTED = 20  # files named in a verdict's details (all are in corpus_errors.jsonl)


def _file_of(where: str) -> str:
    """The file of a bad-row report's place (``<path>:<line>`` or ``<path>``)."""
    path, _, line = where.rpartition(":")
    return path if path and line.isdigit() else where


def corpus_losses(errors: Sequence[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """What a scan's bad-row reports (``{"where", "error"}``) lost: the rows skipped one by one, and the files lost
    whole or from a row on (``readers.loses_documents``), sorted."""
    lost = sorted({_file_of(str(e.get("where", ""))) for e in errors if loses_documents(str(e.get("error", "")))})
    rows = sum(not loses_documents(str(e.get("error", ""))) for e in errors)
    return rows, lost


def describe_losses(rows: int, files: Sequence[str]) -> str:
    """``corpus_losses`` in a sentence for a report ("" when nothing was lost): an open-data "clean" then means
    "not found in the documents read"."""
    parts = [f"{rows} corpus row(s) could not be read and were skipped"] if rows else []
    if files:
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        parts.append(f"{len(files)} corpus file(s) were read only in part or not at all ({shown})")
    if not parts:
        return ""
    covered = "the open-data verdicts cover the documents read - a 'clean' there means 'not found in what was read'"
    return "; ".join(parts) + f": {covered}."


@dataclass(frozen=True)
class CorpusCoverage:
    """What one scan could not read (see the module docstring); all zero when it read everything."""

    rows_skipped: int = 0
    files_unread: list[str] = field(default_factory=list)
    unread_bytes: int = 0
    total_bytes: int = 0
    unknown_sizes: int = 0  # files lost whose size the listing does not give

    @property
    def lost(self) -> bool:
        return bool(self.rows_skipped or self.files_unread)

    @property
    def share(self) -> float | None:
        """Up to this share of the corpus' bytes was not read; None when it cannot be bounded."""
        if self.unknown_sizes or (self.files_unread and self.total_bytes <= 0):
            return None
        return self.unread_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CorpusCoverage:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def coverage_of(errors: Sequence[Mapping[str, Any]], sizes: Mapping[str, int]) -> CorpusCoverage:
    """The coverage of a scan from its bad-row reports and the bytes of each listed file (``sizes``, by the path
    the readers name files by; 0 or absent: unknown, as a hub dataset's)."""
    rows, files = corpus_losses(errors)
    known = [sizes.get(f, 0) for f in files]
    return CorpusCoverage(
        rows_skipped=rows,
        files_unread=files,
        unread_bytes=sum(known),
        total_bytes=sum(max(0, s) for s in sizes.values()),
        unknown_sizes=sum(s <= 0 for s in known),
    )


def check_max_unread(value: Any) -> float:
    """``corpus.max_unread`` as a share in [0, 1], or a ``ValueError`` naming the key and the fix."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        share = math.nan
    if isinstance(value, bool) or not 0.0 <= share <= 1.0:
        raise ValueError(
            f"{MAX_UNREAD_KEY}: {value!r} is not a share between 0 and 1 (the most of the corpus' bytes a scan may "
            f"leave unread before an open-data 'clean' becomes inconclusive; default {DEFAULT_MAX_UNREAD})"
        )
    return share


def _percent(share: float) -> str:
    return f"{100 * share:.3g} %"


def with_coverage(
    verdict: dict[str, Any], coverage: CorpusCoverage | None, max_unread: float | None
) -> dict[str, Any]:
    """An open-data verdict with what its scan could not read (see the module docstring): in ``details`` and the
    summary, and "clean" made ``inconclusive`` when more than ``max_unread`` of the corpus may be unread.
    ``max_unread`` None: the losses are stated, the decision left alone - for a closed-data verdict whose rows were
    labelled dirty or clean by the scan (clean-vs-dirty evaluation): a dirty row the scan missed is counted clean,
    which dilutes the gap the test looks for but does not make its null false."""
    if coverage is None or not coverage.lost:
        return verdict
    share = coverage.share
    details = dict(verdict.get("details") or {})
    details.update(
        corpus_rows_skipped=coverage.rows_skipped,
        corpus_files_unread=coverage.files_unread[:MAX_LISTED],
        n_corpus_files_unread=len(coverage.files_unread),
        corpus_unread_bytes=coverage.unread_bytes,
        corpus_bytes=coverage.total_bytes,
        corpus_unread_share=share,
    )
    files = len(coverage.files_unread)
    bound = "" if not files else (
        f" (up to {_percent(share)} of the corpus' bytes)" if share is not None else " (a share not known)"
    )  # fmt: skip
    parts = [f"{coverage.rows_skipped} corpus row(s) skipped"] if coverage.rows_skipped else []
    if files:
        parts.append(f"{files} file(s) read in part or not at all{bound}")
    lost = ", ".join(parts)
    summary = str(details.get("summary") or "")
    details["summary"] = f"{summary}; {lost} (corpus_errors.jsonl)" if summary else f"{lost} (corpus_errors.jsonl)"
    out = {**verdict, "details": details}
    if max_unread is None:
        return out
    if verdict.get("decision") == "clean" and files and (share is None or share > max_unread):
        what = f"up to {_percent(share)} of the corpus' bytes" if share is not None else "a share of unknown size"
        out.update(
            decision="inconclusive",
            contaminated=False,
            reason=(
                f"the rows were not found in what the scan read, but {files} corpus file(s) were read in part or not "
                f"at all - {what}, more than {MAX_UNREAD_KEY} = {max_unread:g} - so they may be in what was not "
                "read; restore the files listed in corpus_errors.jsonl and run again, or raise "
                f"{MAX_UNREAD_KEY} to accept the loss"
            ),
        )
    return out
