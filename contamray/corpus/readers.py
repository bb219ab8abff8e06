"""Corpus readers: jsonl (plain or compressed), parquet and plain text, as rows ``doc_id``, ``text``.

Two entry points over the same parsers, so both give the same documents with the same ids:

- ``read_corpus(paths, ...) -> ray.data.Dataset``: files are read in parallel by Ray Data read tasks
  (one custom ``FileBasedDatasource`` per format), streamed block by block, never loaded whole;
- ``iter_documents(paths, ...)``: a plain generator for use without Ray (tests, small corpora);
  ``read_listed_file(path, ...)`` the same for one file of a listing (what a match actor that reads its
  own files calls).

Paths: local files, directories (read recursively; names starting with ``.`` or ``_`` are skipped,
as Ray does), globs (``*``, ``?``, ``[...]``; ``**`` for any depth) and URIs of any pyarrow
filesystem (``s3://``, ``gs://``, ``hdfs://``, ``file://``) or, failing that, of any installed fsspec
filesystem. A ``filesystem`` (pyarrow or fsspec) can be passed instead. Compression is detected
from the file name as Ray does (``.gz``, ``.bz2``, ``.zst``, ``.lz4``, ``.br``). Hub datasets are
read in streaming mode from ``hub://<dataset>?name=<config>&split=<split>`` (``HubSource``): shards of
the stream are spread over Ray read tasks, ids are ``hub://<dataset>/<config>/<split>:<shard>:<row>``.

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
raised (``errors="raise"``). A file that ends early (a truncated ``.gz`` / ``.zst``, an I/O error
mid-stream) keeps the documents read up to its last complete line and is reported once, with the
line after which it broke; a parquet file that cannot be opened is reported and skipped.
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
# how a report that loses a whole file, or the rest of one, ends: what ``loses_documents`` reads
FILE_SKIPPED = "the file is skipped"
REST_SKIPPED = "the rest of the file is skipped"


def loses_documents(error: str) -> bool:
    """Whether a bad-row report lost a file's documents (the whole file, or from a row on; ``FILE_SKIPPED``,
    ``REST_SKIPPED``), not one row: how many documents it held is then unknown."""
    return FILE_SKIPPED in error or REST_SKIPPED in error


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


# --------------------------------------------------------------------------- compressed streams

_PY_CODECS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}


def _py_codec(path: str) -> str | None:
    """The codec decompressed here in Python (gzip, bz2, zstd), from the file name; else None."""
    name = path.lower()
    return next((codec for suffix, codec in _PY_CODECS.items() if name.endswith(suffix)), None)


class _Decompressing:
    """A read-only stream decompressing gzip / bz2 / zstd, concatenated members included.

    pyarrow's decompressing stream raises on a truncated file without handing over the bytes it
    decoded in that read, so up to a whole read chunk of good documents would be lost with the broken
    tail. Python's incremental decompressors return everything decodable; this stream hands it all
    over first and raises ``OSError`` only on the read after it, so a truncated file keeps every
    complete line before the break.
    """

    def __init__(self, raw: Any, codec: str) -> None:
        self.raw = raw
        self.codec = codec
        self._decoder = self._new()
        self._buffer = bytearray()
        self._error: OSError | None = None
        self._finished = False
        self._seen_input = False

    def _new(self) -> Any:
        import bz2
        import zlib

        if self.codec == "gzip":
            return zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        if self.codec == "bz2":
            return bz2.BZ2Decompressor()
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def _fill(self, size: int) -> None:
        while len(self._buffer) < size and not self._finished and self._error is None:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                self._finished = True
                if self._seen_input and not self._decoder.eof:
                    self._error = OSError(f"Truncated compressed stream ({self.codec} data ends early)")
                break
            data = bytes(chunk)
            self._seen_input = True
            try:
                while data:
                    self._buffer += self._decoder.decompress(data)
                    if not self._decoder.eof:
                        break
                    data = self._decoder.unused_data  # the next member or frame, if any
                    self._decoder = self._new()
                    if not data:
                        self._seen_input = False
            except Exception as err:  # noqa: BLE001 - zlib.error, OSError, ZstdError: corrupt data
                self._error = OSError(f"corrupt {self.codec} data: {type(err).__name__}: {err}")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = 1 << 62
        self._fill(size)
        if not self._buffer and self._error is not None:
            raise self._error
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> _Decompressing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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


class _Broken(Exception):
    """The stream failed mid-file (truncated or corrupt compressed data, I/O error)."""

    def __init__(self, after_line: int, cause: BaseException) -> None:
        super().__init__(f"after line {after_line}: {type(cause).__name__}: {cause}")
        self.after_line = after_line
        self.cause = cause


def _iter_lines(stream: Any) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without its newline) from a binary stream, read in chunks.

    A read that fails (a truncated ``.gz`` / ``.zst``, corrupt data) raises ``_Broken`` after every
    complete line before the failure was yielded; the partial line is dropped.
    """
    carry = b""
    number = 0
    while True:
        try:
            chunk = stream.read(_READ_CHUNK)
        except (OSError, EOFError, ValueError) as err:  # pyarrow: OSError("Truncated compressed stream")
            raise _Broken(number, err) from err
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
        except UnicodeDecodeError as err:
            bad = report.bad(where, f"not valid UTF-8 ({err})")
        except ValueError as err:  # JSONDecodeError
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
    try:
        data = stream.read()
    except (OSError, EOFError, ValueError) as err:
        raise _Broken(0, err) from err
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

    try:
        parquet = pq.ParquetFile(source)
    except (OSError, ValueError, pa.ArrowException) as err:  # not parquet, truncated footer
        bad = report.bad(
            path, f"not a readable parquet file ({type(err).__name__}: {err}); {FILE_SKIPPED}"
        )
        if bad is not None:
            yield bad
        return
    names = parquet.schema_arrow.names
    if opts.text_field not in names:
        bad = report.bad(
            path,
            f"no column {opts.text_field!r} (columns: {', '.join(names[:10])}); {FILE_SKIPPED}: set text_field to "
            "the column holding the document text",
        )
        if bad is not None:
            yield bad
        return
    id_field = opts.id_field if opts.id_field in names else None
    if opts.id_field is not None and id_field is None:
        logger.warning("corpus: %s has no column %r; its ids are <path>:<row>", path, opts.id_field)
    columns = [opts.text_field] + ([id_field] if id_field and id_field != opts.text_field else [])
    row_number = 0
    batches = parquet.iter_batches(batch_size=_BLOCK_ROWS, columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except (OSError, ValueError, pa.ArrowException) as err:  # a corrupt row group
            bad = report.bad(
                f"{path}:{row_number}",
                f"unreadable from row {row_number} on ({type(err).__name__}: {err}); {REST_SKIPPED}",
            )
            if bad is not None:
                yield bad
            return
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
    if isinstance(source, _Gone):
        bad = report.bad(path, f"the file was listed when the scan started but is gone now ({source.cause}); "
                         f"{FILE_SKIPPED} - restore it and run again (the corpus fingerprint changes, so the "
                         "open-data cells are scanned again)")  # fmt: skip
        if bad is not None:
            yield bad
        return
    try:
        for row in _PARSERS[opts.format](source, path, opts, report):
            if opts.errors == "keep" and "error" not in row:
                row = {**row, "error": ""}
            yield row
    except _Broken as broken:
        where = (
            f"{path}:{broken.after_line + 1}" if opts.format == "jsonl" or opts.text_mode == "line" else path
        )
        bad = report.bad(
            where,
            f"the file is truncated or corrupt after line {broken.after_line} "
            f"({type(broken.cause).__name__}: {broken.cause}); {REST_SKIPPED}",
        )
        if bad is not None:
            yield bad
    report.close()


def _open(fs: pafs.FileSystem, path: str, fmt: str) -> Any:
    try:
        if fmt == "parquet":
            return fs.open_input_file(path)
        codec = _py_codec(path)
        if codec is not None:
            return _Decompressing(fs.open_input_stream(path, compression=None), codec)
        return fs.open_input_stream(path, compression="detect")
    except FileNotFoundError as err:
        return _Gone(err)


class _Gone:
    """A file listed when the scan started that is gone when its turn comes (deleted, moved, a lost
    mount): read as no documents and reported once (``_iter_file``), so the scan goes on."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause

    def __enter__(self) -> _Gone:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def close(self) -> None:
        return None


# --------------------------------------------------------------------------- hub datasets, streamed

HUB_SCHEME = "hub://"


@dataclass(frozen=True)
class HubSource:
    """A hub dataset read in streaming mode: ``hub://<path>?name=<config>&split=<split>``.

    ``path`` is what ``datasets.load_dataset`` takes (``allenai/c4``, or a packaged builder such as
    ``json`` with ``data_files=a.jsonl,b.jsonl``); ``revision`` pins a commit. Nothing is downloaded
    up front: rows stream shard by shard.
    """

    path: str
    name: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] = ()
    revision: str | None = None

    @property
    def display(self) -> str:
        return f"{HUB_SCHEME}{self.path}/{self.name or 'default'}/{self.split}"


def is_hub_uri(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(HUB_SCHEME)


def parse_hub_uri(uri: str) -> HubSource:
    """``hub://org/name?name=config&split=train&data_files=a,b&revision=sha`` as a HubSource."""
    from urllib.parse import parse_qs

    if not is_hub_uri(uri):
        raise ValueError(f"corpus: {uri!r} is not a hub URI (hub://<dataset>?name=<config>&split=<split>)")
    rest = uri[len(HUB_SCHEME) :]
    path, _, query = rest.partition("?")
    if not path:
        raise ValueError(f"corpus: {uri!r} names no dataset; write hub://<org>/<name>?split=train")
    params = parse_qs(query, keep_blank_values=False)
    known = {"name", "split", "data_files", "revision"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"corpus: {uri!r}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    files = tuple(f for v in params.get("data_files", []) for f in v.split(",") if f)
    return HubSource(
        path=path.strip("/"),
        name=params.get("name", [None])[-1],
        split=params.get("split", ["train"])[-1],
        data_files=files,
        revision=params.get("revision", [None])[-1],
    )


def _hub_dataset(src: HubSource) -> Any:
    import datasets

    kwargs: dict[str, Any] = {"streaming": True, "split": src.split}
    if src.data_files:
        kwargs["data_files"] = list(src.data_files)
    if src.revision:
        kwargs["revision"] = src.revision
    try:
        return datasets.load_dataset(src.path, src.name, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure to open the stream gets the same advice
        raise ValueError(
            f"corpus: cannot stream {src.display} ({type(err).__name__}: {err}); check the dataset id, "
            "name= (config) and split= of the hub URI, and that the hub is reachable"
        ) from err


def _iter_hub_shards(
    src: HubSource, shards: Sequence[int], n_shards: int, opts: ReadOptions
) -> Iterator[dict[str, str]]:
    """Rows of some shards of a streamed hub dataset; ids ``<display>:<shard>:<row in shard>``."""
    dataset = _hub_dataset(src)
    report = _Reporter(src.display, opts.errors)
    for shard in shards:
        part = dataset.shard(num_shards=n_shards, index=shard) if n_shards > 1 else dataset
        for number, row in enumerate(part):
            where = f"{src.display}:{shard}:{number}"
            text = row.get(opts.text_field) if isinstance(row, dict) else None
            if isinstance(text, str):
                doc = {"doc_id": _row_id(row, opts.id_field, where), "text": _utf8_safe(text)}
                yield {**doc, "error": ""} if opts.errors == "keep" else doc
                continue
            reason = (
                f"no field {opts.text_field!r} (fields: {', '.join(sorted(map(str, row))[:10])}); "
                "set text_field to the field holding the document text"
                if text is None
                else f"field {opts.text_field!r} is a {type(text).__name__}, not a string"
            )
            bad = report.bad(where, reason)
            if bad is not None:
                yield bad
    report.close()


def _hub_shard_count(src: HubSource) -> int:
    return max(1, int(getattr(_hub_dataset(src), "num_shards", 1) or 1))


def _hub_datasource_class() -> type:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class HubDatasource(Datasource):
        """Streams a hub dataset: each read task iterates some of its shards."""

        def __init__(self, src: HubSource, opts: ReadOptions) -> None:
            self._src = src
            self._opts = opts
            self._n_shards = _hub_shard_count(src)

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, **kwargs: Any
        ) -> list:
            n = self._n_shards
            groups = [
                list(range(n))[i :: max(1, min(parallelism, n))] for i in range(max(1, min(parallelism, n)))
            ]
            src, opts = self._src, self._opts
            tasks = []
            for shards in groups:

                def read(shards: list[int] = shards) -> Iterator[pa.Table]:
                    yield from _blocks(_iter_hub_shards(src, shards, n, opts), opts.errors == "keep")

                meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
                tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
            return tasks

    return HubDatasource


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
            try:
                if self._opts.format == "parquet":  # needs random access, not a stream
                    return filesystem.open_input_file(path)
                codec = _py_codec(path)
                if codec is not None:  # see _Decompressing: keeps what precedes a truncation
                    return _Decompressing(filesystem.open_input_stream(path, compression=None), codec)
                return super()._open_input_source(filesystem, path, **open_args)
            except FileNotFoundError as err:  # listed, then deleted: reported as a bad row, the scan goes on
                return _Gone(err)

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


def split_hub_uris(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> tuple[list[str], list[str]]:
    """Hub URIs apart from file paths (both may be given in one list)."""
    items = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    if not items:
        raise ValueError(
            "corpus: no paths given; set corpus.paths to files, directories, globs, URIs or hub:// ids"
        )
    return [p for p in items if is_hub_uri(p)], [p for p in items if not is_hub_uri(p)]


def _by_format(files: CorpusFiles, format: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for path in files.paths:
        fmt = format if format != "auto" else detect_format(path)
        groups.setdefault(fmt, []).append(path)
    return groups


def _remote_options(remote: dict[str, Any] | None) -> dict[str, Any]:
    """``read_corpus``'s ``ray_remote_args`` as ``ray.data.read_datasource`` takes them: the options it names
    (``num_cpus``, ``label_selector``...; Ray deprecates passing them in ``ray_remote_args`` and drops that in
    2.64) as keywords, any other in ``ray_remote_args``."""
    import inspect

    import ray.data

    named = set(inspect.signature(ray.data.read_datasource).parameters) - {"datasource", "ray_remote_args"}
    options = {k: v for k, v in (remote or {}).items() if k in named}
    rest = {k: v for k, v in (remote or {}).items() if k not in named}
    return {**options, **({"ray_remote_args": rest} if rest else {})}


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
    remote = _remote_options(ray_remote_args)
    hubs, paths = split_hub_uris(paths)
    datasets = []
    for uri in hubs:
        opts = ReadOptions("hub", text_field, id_field, text_mode, errors, encoding)
        source = _hub_datasource_class()(parse_hub_uri(uri), opts)
        datasets.append(
            ray.data.read_datasource(
                source, override_num_blocks=override_num_blocks, **remote
            )
        )
    if not paths:
        return datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])
    files = resolve_paths(paths, filesystem)
    datasource_cls = _datasource_class()
    for fmt, group in sorted(_by_format(files, format).items()):
        opts = ReadOptions(fmt, text_field, id_field, text_mode, errors, encoding)
        source = datasource_cls(group, opts, files.prefix, filesystem=files.filesystem)
        datasets.append(
            ray.data.read_datasource(
                source, override_num_blocks=override_num_blocks, **remote
            )
        )
    return datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])


def read_listed_file(
    path: str,
    format: str = "auto",
    text_field: str = "text",
    id_field: str | None = None,
    *,
    text_mode: str = "file",
    errors: str = "skip",
    encoding: str = "utf-8",
) -> Iterator[dict[str, str]]:
    """The documents of one listed file (a path as ``file_listing`` gives it: absolute, or a URI), with the
    ids and rows ``read_corpus`` gives them; a file gone since it was listed is reported, not raised."""
    _options(format, text_field, id_field, text_mode, errors)
    fs, inner, prefix = _fs_for(path)
    fmt = format if format != "auto" else detect_format(inner)
    opts = ReadOptions(fmt, text_field, id_field, text_mode, errors, encoding)
    with _open(fs, inner, fmt) as source:
        yield from _iter_file(source, prefix + inner, opts)


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
    hubs, paths = split_hub_uris(paths)
    for uri in hubs:
        src = parse_hub_uri(uri)
        n = _hub_shard_count(src)
        opts = ReadOptions("hub", text_field, id_field, text_mode, errors, encoding)
        yield from _iter_hub_shards(src, range(n), n, opts)
    if not paths:
        return
    files = resolve_paths(paths, filesystem)
    for path in files.paths:
        fmt = format if format != "auto" else detect_format(path)
        opts = ReadOptions(fmt, text_field, id_field, text_mode, errors, encoding)
        with _open(files.filesystem, path, fmt) as source:
            yield from _iter_file(source, files.display(path), opts)
