"""Corpus readers: jsonl (plain or compressed), parquet and plain text, as rows ``doc_id``, ``text``.

Two entry points over the same parsers, so both give the same documents with the same ids:

- ``read_corpus(paths, ...) -> ray.data.Dataset``: files are read in parallel by Ray Data read tasks
  (one custom ``FileBasedDatasource`` per format), streamed block by block, never loaded whole;
- ``iter_documents(paths, ...)``: a plain generator for use without Ray (tests, small corpora).

Paths: local files, directories (read recursively; names starting with ``.`` or ``_`` are skipped,
as Ray does), globs (``*``, ``?``, ``[...]``; ``**`` for any depth) and URIs of any pyarrow
filesystem (``s3://``, ``gs://``, ``hdfs://``, ``file://``) or, failing that, of any installed fsspec
filesystem. A ``filesystem`` (pyarrow or fsspec) can be passed instead. Compression is detected
from the file name as Ray does (``.gz``, ``.bz2``, ``.zst``, ``.lz4``, ``.br``).

Document ids are stable across runs and machines that see the same files: the value of
``id_field`` when given (and present in the row), otherwise ``"<path>:<n>"`` with ``n`` the 1-based
line number (jsonl, text read per line) or the 0-based row number (parquet); a text file read as
one document has id ``"<path>"``. ``<path>`` is the resolved path (absolute for local files, the
URI with its scheme otherwise).

Bad input does not kill a run. Ray Data's own ``read_json`` parses each file whole (pyarrow, then
Python's ``json`` as a fallback), so one malformed line fails its read task and with it the whole
dataset, and a row without the text field silently becomes a null. Here every line is parsed on its
own: a line that is not JSON, not an object, or has no string ``text_field`` (likewise a null
parquet cell, a text line that is not valid UTF-8, a parquet file without the column) is reported
with its path and line number and skipped (``errors="skip"``, the default; the first
``MAX_REPORTS_PER_FILE`` per file are logged one by one, then a count), kept as a row with empty
text and an ``error`` column (``errors="keep"``, for a pipeline that wants to count them), or
raised (``errors="raise"``).
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

if TYPE_CHECKING:
    import ray.data

logger = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet", "text")
TEXT_MODES = ("file", "line")
ERROR_MODES = ("skip", "keep", "raise")
MAX_REPORTS_PER_FILE = 10

_COMPRESSION_SUFFIXES = (".gz", ".gzip", ".bz2", ".zst", ".zstd", ".lz4", ".br", ".snappy")
_FORMAT_SUFFIXES = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
}
_GLOB_CHARS = re.compile(r"[*?\[]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_READ_CHUNK = 1 << 22
_BLOCK_ROWS = 1024
_BLOCK_BYTES = 32 << 20


@dataclass(frozen=True)
class ReadOptions:
    """How rows become documents; shared by the Ray datasource and the plain generator."""

    format: str
    text_field: str = "text"
    id_field: str | None = None
    text_mode: str = "file"
    errors: str = "skip"
    encoding: str = "utf-8"


def detect_format(path: str) -> str:
    """The corpus format of a file from its name (compression suffixes are looked through)."""
    name = path.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    for suffix, fmt in _FORMAT_SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise ValueError(
        f"cannot tell the corpus format of {path!r} from its name (known endings: "
        f"{', '.join(sorted(_FORMAT_SUFFIXES))}, optionally compressed); pass format='jsonl', "
        "'parquet' or 'text' (corpus.format in the config)"
    )


# --------------------------------------------------------------------------- paths


@dataclass
class CorpusFiles:
    """The files of a corpus after expanding directories and globs, on one filesystem."""

    filesystem: pafs.FileSystem
    paths: list[str]  # paths as the filesystem knows them
    prefix: str  # prepended to a path to show it (the URI scheme, or "")

    def display(self, path: str) -> str:
        return self.prefix + path


def _as_pyarrow_fs(filesystem: Any) -> pafs.FileSystem:
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError as err:  # pragma: no cover - fsspec is a dependency
        raise TypeError(f"filesystem {filesystem!r} is neither a pyarrow nor an fsspec filesystem") from err
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise TypeError(
        f"filesystem {filesystem!r} is neither a pyarrow.fs.FileSystem nor an fsspec AbstractFileSystem"
    )


def _fs_for(path: str) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path inside it, display prefix) for a path or URI."""
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path)), ""
    scheme = path.split("://", 1)[0]
    if scheme == "file":
        return pafs.LocalFileSystem(), os.path.abspath(path.split("://", 1)[1]), ""
    try:
        fs, inner = pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        try:
            import fsspec

            fsspec_fs, inner = fsspec.core.url_to_fs(path)
        except (ImportError, ValueError) as err:
            raise ValueError(
                f"no filesystem for {path!r}: neither pyarrow nor fsspec knows the scheme {scheme!r}; "
                "install the fsspec implementation for it or pass filesystem="
            ) from err
        fs = _as_pyarrow_fs(fsspec_fs)
    return fs, inner, f"{scheme}://"


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.startswith("_")


def _list_dir(fs: pafs.FileSystem, directory: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=True))
    base = directory.rstrip("/")
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(base) :].lstrip("/")
        if any(_skipped(part) for part in rel.split("/")):
            continue
        out.append(info.path)
    return sorted(out)


def _expand_glob(fs: pafs.FileSystem, pattern: str) -> list[str]:
    if isinstance(fs, pafs.LocalFileSystem):
        return sorted(p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p))
    head = pattern[: _GLOB_CHARS.search(pattern).start()]  # type: ignore[union-attr]
    base = head.rsplit("/", 1)[0] if "/" in head else ""
    return [p for p in _list_dir(fs, base) if fnmatch.fnmatchcase(p, pattern)]


def resolve_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], filesystem: Any = None
) -> CorpusFiles:
    """Expand paths, directories and globs to a sorted, de-duplicated list of files on one filesystem."""
    items = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    if not items:
        raise ValueError("corpus: no paths given; set corpus.paths to files, directories, globs or URIs")
    given = _as_pyarrow_fs(filesystem) if filesystem is not None else None
    fs_out: pafs.FileSystem | None = given
    prefix = ""
    files: list[str] = []
    for i, item in enumerate(items):
        if given is not None:
            # the caller's filesystem: paths are inside it; a URI scheme is kept only for display
            scheme, _, rest = item.rpartition("://")
            fs, inner, pre = given, rest, (scheme + "://" if scheme else "")
        else:
            fs, inner, pre = _fs_for(item)
            if fs_out is not None and (type(fs) is not type(fs_out) or pre != prefix):
                raise ValueError(
                    f"corpus: path {item!r} is on another filesystem than {items[0]!r}; read one "
                    "filesystem per call (or pass filesystem=)"
                )
            if fs_out is None:
                fs_out = fs
        if i == 0:
            prefix = pre
        if _GLOB_CHARS.search(inner):
            found = _expand_glob(fs, inner)
            if not found:
                raise FileNotFoundError(f"corpus: the glob {item!r} matches no file")
            files.extend(found)
            continue
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.File:
            files.append(inner)
        elif info.type == pafs.FileType.Directory:
            found = _list_dir(fs, inner)
            if not found:
                raise FileNotFoundError(f"corpus: the directory {item!r} holds no readable file")
            files.extend(found)
        else:
            raise FileNotFoundError(f"corpus: {item!r} does not exist")
    assert fs_out is not None
    return CorpusFiles(fs_out, sorted(dict.fromkeys(files)), prefix)


# --------------------------------------------------------------------------- parsing


class _Reporter:
    """Reports bad rows of one file: log (first few), keep as error rows, or raise."""

    def __init__(self, display_path: str, errors: str) -> None:
        self.path = display_path
        self.errors = errors
        self.count = 0

    def bad(self, where: str, reason: str) -> dict[str, str] | None:
        message = f"{where}: {reason}"
        if self.errors == "raise":
            raise ValueError(f"corpus: {message} (read with errors='skip' to skip such rows)")
        self.count += 1
        if self.count <= MAX_REPORTS_PER_FILE:
            logger.warning("corpus: skipping %s", message)
        if self.errors == "keep":
            return {"doc_id": where, "text": "", "error": reason}
        return None

    def close(self) -> None:
        if self.count > MAX_REPORTS_PER_FILE:
            logger.warning(
                "corpus: %s: %d bad rows in all, %d more than reported above",
                self.path,
                self.count,
                self.count - MAX_REPORTS_PER_FILE,
            )


def _iter_lines(stream: Any) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without its newline) from a binary stream, read in chunks."""
    carry = b""
    number = 0
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            break
        parts = (carry + bytes(chunk)).split(b"\n")
        carry = parts.pop()
        for line in parts:
            number += 1
            yield number, line
    if carry:
        yield number + 1, carry


def _utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (legal in JSON escapes, not in UTF-8 or Arrow) as U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _row_id(row: dict[str, Any], id_field: str | None, fallback: str) -> str:
    if id_field is None:
        return fallback
    value = row.get(id_field)
    return fallback if value is None else _utf8_safe(str(value))


def _iter_jsonl(stream: Any, path: str, opts: ReadOptions, report: _Reporter) -> Iterator[dict[str, str]]:
    for number, line in _iter_lines(stream):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            bad = report.bad(where, f"not a JSON line ({err})")
        else:
            if not isinstance(row, dict):
                bad = report.bad(where, f"a JSON {type(row).__name__}, not an object")
            elif not isinstance(row.get(opts.text_field), str):
                value = row.get(opts.text_field)
                reason = (
                    f"no field {opts.text_field!r} (fields: {', '.join(sorted(map(str, row))[:10])}); "
                    "set text_field to the field holding the document text"
                    if value is None
                    else f"field {opts.text_field!r} is a {type(value).__name__}, not a string"
                )
                bad = report.bad(where, reason)
            else:
                text = _utf8_safe(row[opts.text_field])
                yield {"doc_id": _row_id(row, opts.id_field, where), "text": text}
                continue
        if bad is not None:
            yield bad


def _iter_text(stream: Any, path: str, opts: ReadOptions, report: _Reporter) -> Iterator[dict[str, str]]:
    if opts.text_mode == "line":
        for number, line in _iter_lines(stream):
            where = f"{path}:{number}"
            try:
                text = line.decode(opts.encoding).rstrip("\r")
            except UnicodeDecodeError as err:
                bad = report.bad(where, f"not valid {opts.encoding} ({err})")
                if bad is not None:
                    yield bad
                continue
            if text.strip():
                yield {"doc_id": where, "text": text}
        return
    data = stream.read()
    try:
        text = bytes(data).decode(opts.encoding)
    except UnicodeDecodeError as err:
        bad = report.bad(path, f"not valid {opts.encoding} ({err})")
        if bad is not None:
            yield bad
        return
    if text.strip():
        yield {"doc_id": path, "text": text}


def _iter_parquet(source: Any, path: str, opts: ReadOptions, report: _Reporter) -> Iterator[dict[str, str]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(source)
    names = parquet.schema_arrow.names
    if opts.text_field not in names:
        bad = report.bad(
            path,
            f"no column {opts.text_field!r} (columns: {', '.join(names[:10])}); set text_field to the "
            "column holding the document text",
        )
        if bad is not None:
            yield bad
        return
    id_field = opts.id_field if opts.id_field in names else None
    if opts.id_field is not None and id_field is None:
        logger.warning("corpus: %s has no column %r; its ids are <path>:<row>", path, opts.id_field)
    columns = [opts.text_field] + ([id_field] if id_field and id_field != opts.text_field else [])
    row_number = 0
    for batch in parquet.iter_batches(batch_size=_BLOCK_ROWS, columns=columns):
        texts = batch.column(opts.text_field).to_pylist()
        ids = batch.column(id_field).to_pylist() if id_field else [None] * len(texts)
        for text, doc_id in zip(texts, ids, strict=True):
            where = f"{path}:{row_number}"
            row_number += 1
            if isinstance(text, str):
                yield {"doc_id": where if doc_id is None else str(doc_id), "text": text}
                continue
            kind = "null" if text is None else f"a {type(text).__name__}, not a string"
            bad = report.bad(where, f"column {opts.text_field!r} is {kind}")
            if bad is not None:
                yield bad


_PARSERS: dict[str, Callable[[Any, str, ReadOptions, _Reporter], Iterator[dict[str, str]]]] = {
    "jsonl": _iter_jsonl,
    "text": _iter_text,
    "parquet": _iter_parquet,
}


def _iter_file(source: Any, path: str, opts: ReadOptions) -> Iterator[dict[str, str]]:
    report = _Reporter(path, opts.errors)
    for row in _PARSERS[opts.format](source, path, opts, report):
        if opts.errors == "keep" and "error" not in row:
            row = {**row, "error": ""}
        yield row
    report.close()


def _open(fs: pafs.FileSystem, path: str, fmt: str) -> Any:
    if fmt == "parquet":
        return fs.open_input_file(path)
    return fs.open_input_stream(path, compression="detect")


# --------------------------------------------------------------------------- Ray Data


def _datasource_class() -> type:
    from ray.data.datasource import FileBasedDatasource

    class CorpusDatasource(FileBasedDatasource):
        """Streams one corpus format through ``_iter_file`` in Ray read tasks."""

        def __init__(self, paths: list[str], opts: ReadOptions, prefix: str, **kwargs: Any) -> None:
            super().__init__(paths, **kwargs)
            self._opts = opts
            self._prefix = prefix

        def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
            if self._opts.format == "parquet":  # needs random access, not a stream
                return filesystem.open_input_file(path)
            return super()._open_input_source(filesystem, path, **open_args)

        def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
            yield from _blocks(_iter_file(f, self._prefix + path, self._opts), self._opts.errors == "keep")

    return CorpusDatasource


def _blocks(rows: Iterator[dict[str, str]], with_error: bool) -> Iterator[pa.Table]:
    columns = ("doc_id", "text", "error") if with_error else ("doc_id", "text")
    batch: list[dict[str, str]] = []
    size = 0
    for row in rows:
        batch.append(row)
        size += len(row["text"])
        if len(batch) >= _BLOCK_ROWS or size >= _BLOCK_BYTES:
            yield pa.table({c: pa.array([r[c] for r in batch], pa.string()) for c in columns})
            batch, size = [], 0
    if batch:
        yield pa.table({c: pa.array([r[c] for r in batch], pa.string()) for c in columns})


def _options(format: str, text_field: str, id_field: str | None, text_mode: str, errors: str) -> None:
    if format not in FORMATS + ("auto",):
        raise ValueError(f"corpus: format {format!r} is unknown; expected auto, {', '.join(FORMATS)}")
    if text_mode not in TEXT_MODES:
        raise ValueError(f"corpus: text_mode {text_mode!r} is unknown; expected {', '.join(TEXT_MODES)}")
    if errors not in ERROR_MODES:
        raise ValueError(f"corpus: errors {errors!r} is unknown; expected {', '.join(ERROR_MODES)}")
    if not text_field:
        raise ValueError("corpus: text_field is empty; name the field holding the document text")


def _by_format(files: CorpusFiles, format: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for path in files.paths:
        fmt = format if format != "auto" else detect_format(path)
        groups.setdefault(fmt, []).append(path)
    return groups


def read_corpus(
    paths: str | Sequence[str],
    format: str = "auto",
    text_field: str = "text",
    id_field: str | None = None,
    *,
    text_mode: str = "file",
    errors: str = "skip",
    filesystem: Any = None,
    encoding: str = "utf-8",
    override_num_blocks: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> ray.data.Dataset:
    """A Ray Dataset of the corpus documents, columns ``doc_id`` and ``text`` (+ ``error`` if kept).

    ``format="auto"`` picks each file's format from its name, so one call may mix formats (one
    datasource per format, unioned). ``text_mode`` says whether a text file is one document
    (``"file"``) or one document per non-empty line (``"line"``). See the module docstring for ids,
    paths and bad rows. Files are split across read tasks; a single file is read by one task.
    Lone surrogates in JSON strings (``"\\ud800"``, not encodable in UTF-8) become U+FFFD.
    """
    import ray.data

    _options(format, text_field, id_field, text_mode, errors)
    files = resolve_paths(paths, filesystem)
    datasource_cls = _datasource_class()
    datasets = []
    for fmt, group in sorted(_by_format(files, format).items()):
        opts = ReadOptions(fmt, text_field, id_field, text_mode, errors, encoding)
        source = datasource_cls(group, opts, files.prefix, filesystem=files.filesystem)
        datasets.append(
            ray.data.read_datasource(
                source, override_num_blocks=override_num_blocks, ray_remote_args=ray_remote_args or {}
            )
        )
    return datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])


def iter_documents(
    paths: str | Sequence[str],
    format: str = "auto",
    text_field: str = "text",
    id_field: str | None = None,
    *,
    text_mode: str = "file",
    errors: str = "skip",
    filesystem: Any = None,
    encoding: str = "utf-8",
) -> Iterator[dict[str, str]]:
    """The documents of ``read_corpus`` (same ids, same rows), one dict at a time, without Ray.

    Files are read in sorted path order; within a file, in file order.
    """
    _options(format, text_field, id_field, text_mode, errors)
    files = resolve_paths(paths, filesystem)
    for path in files.paths:
        fmt = format if format != "auto" else detect_format(path)
        opts = ReadOptions(fmt, text_field, id_field, text_mode, errors, encoding)
        with _open(files.filesystem, path, fmt) as source:
            yield from _iter_file(source, files.display(path), opts)
