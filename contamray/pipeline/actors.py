"""What runs on Ray workers: a batch of requests answered on an engine (``answer_requests``, inside a
model's Serve replica), and the callable classes Ray Data runs in actor pools: scorers and corpus matchers.

Rows cross stage boundaries as JSON strings (``request``, ``output``, ``payload``, ``rows``): the
methods' columns differ from one another and from cell to cell, and one string column keeps every
batch's Arrow schema the same, whatever a method returns. Corpus match rows, the one high-volume
stream, travel as one pickled list per cell and batch instead (see ``MatchWorker``).

Failures stay local: an engine batch that raises is retried one request at a time so only the
request that is really bad carries an ``error`` (an engine that fails per request, the HTTP engine,
returns the failure on the request's ``Completion`` / ``TokenScores`` instead of raising); a scoring
chunk that raises becomes one error row per example. Nothing is dropped, and the reducer counts the
failed rows. Nothing is cut silently either: an engine's count of the tokens it left out of a too-long
text or prompt travels in ``Output.truncated`` (the runner sums it per example into ``truncated_tokens``).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from contamray.corpus.pieces import Window, batches, text_bytes, widest
from contamray.engines.wire import Output, Request
from contamray.methods.base import get_method
from contamray.records import Record


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def answer_requests(engine: Any, requests: list[Request]) -> list[Output]:
    """Answer a batch of requests on one engine, grouping compatible requests into one call.

    Answers are matched to requests by position, never by key: cells of different methods may send
    requests with the same key (e.g. ``<id>|text``) in one batch, with different options. Generations
    are grouped by sampling parameters other than ``max_tokens`` and by ``chat`` (a chat and a raw prompt
    never share a call); each request keeps its own ``max_tokens`` inside the call (per-request sampling:
    guided prompting's per-example lengths do not split the batch). A score request scores its text and reply:
    joined, or with ``chat`` the reply after the text rendered as a user turn (the engine's ``replies``).
    """
    answers: list[Output | None] = [None] * len(requests)
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, req in enumerate(requests):
        shared = dataclasses.replace(req.sampling, max_tokens=0)
        score_option = (req.vocab_stats, req.context_len, req.stride, req.chat)
        group = ("generate", (shared, req.chat)) if req.kind == "generate" else ("score", score_option)
        groups[group].append(i)
    for (kind, option), positions in groups.items():
        try:
            outs = _call(engine, kind, option, [requests[i] for i in positions])
        except Exception:  # noqa: BLE001 - retried one by one to isolate the bad request
            outs = []
            for i in positions:
                try:
                    outs.extend(_call(engine, kind, option, [requests[i]]))
                except Exception as err:  # noqa: BLE001 - recorded on the request, run goes on
                    outs.append(Output(key=requests[i].key, error=_error_text(err)))
        for i, out in zip(positions, outs, strict=True):
            answers[i] = out
    return [a for a in answers if a is not None]


def _call(engine: Any, kind: str, option: Any, reqs: list[Request]) -> list[Output]:
    texts = [r.text for r in reqs]
    if kind == "generate":
        sampling, chat = option
        limits = [r.sampling.max_tokens for r in reqs]
        completions = engine.complete(texts, dataclasses.replace(sampling, max_tokens=max(limits)), chat=chat,
                                      max_tokens=limits)  # fmt: skip
        # num_tokens: tokens the engine processed (prompt as read + completion), the request's cost
        return [
            Output(key=r.key, error=c.error) if c.error else Output(
                key=r.key,
                text=c.text,
                num_tokens=int(c.num_tokens),
                truncated=int(c.truncated),
                texts=list(c.samples or [c.text]),
                token_ids=[list(map(int, ids)) for ids in c.sample_ids],
            )
            for r, c in zip(reqs, completions, strict=True)
        ]
    vocab_stats, context_len, stride, chat = option
    kwargs = {"replies": [r.reply for r in reqs]} if chat else {}
    texts = texts if chat else [r.text + r.reply for r in reqs]
    scores = engine.score(texts, with_vocab_stats=bool(vocab_stats), context_len=context_len, stride=stride, **kwargs)
    return [
        Output(key=r.key, error=s.error) if s.error else Output(
            key=r.key,
            token_logprobs=list(map(float, s.token_logprobs)),
            num_tokens=s.num_tokens,
            token_mean=list(map(float, s.token_mean)),
            token_std=list(map(float, s.token_std)),
            truncated=int(s.truncated),
            n_windows=int(s.windows),
            prompt_tokens=int(s.prompt_tokens),
        )
        for r, s in zip(reqs, scores, strict=True)
    ]


class ScoreWorker:
    """Turns one chunk of a cell (its records plus engine outputs or corpus matches) into rows."""

    def __init__(self, methods: dict[str, tuple[str, dict[str, Any]]]) -> None:
        self.methods = {
            label: (get_method(name), get_method(name).make_config(params, where=f"methods.{label}"))
            for label, (name, params) in methods.items()
        }

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[str]]:
        return {
            # the chunk's place in the driver's order (actors finish in any order)
            "seq": list(batch["seq"]) if "seq" in batch else list(range(len(batch["cell"]))),
            "cell": list(batch["cell"]),
            "rows": [self._score(label, payload) for label, payload in zip(batch["method"], batch["payload"])],
        }

    def _score(self, label: str, payload: str) -> str:
        method, cfg = self.methods[label]
        data = json.loads(payload)
        records = [Record.from_row(r) for r in data["records"]]
        outputs = {o["key"]: Output.from_row(o) for o in data.get("outputs", [])}
        try:
            if method.family == "closed":
                rows = method.score(records, outputs, cfg)
            elif "outputs" in data:  # open-data method with a judge
                rows = method.score(records, data["matches"], cfg, outputs=outputs)
            else:
                rows = method.score(records, data["matches"], cfg)
        except Exception as err:  # noqa: BLE001 - the chunk's examples become error rows
            detail = _error_text(err) + " | " + traceback.format_exc(limit=3).replace("\n", " ")
            rows = [{"record_id": r.id, "partition": r.partition, "error": detail} for r in records]
        return json.dumps(rows, default=json_default)


REFOLD_ROWS = 20_000  # rows a FileMatchWorker holds for a cell before it folds them again
CORPUS_ERRORS = "corpus-errors"  # MatchWorker's output row for the batch's bad corpus rows (no cell has this key)


def byte_bounded(docs: list[dict[str, Any]], max_bytes: int) -> Iterator[list[dict[str, Any]]]:
    """``docs`` in consecutive pieces of about ``max_bytes`` bytes of UTF-8 text: a piece ends with the
    document that reaches the bound, so a longer document is matched alone and none is cut."""
    return batches(docs, max_bytes, None)


class Scanner:
    """Matches a batch of documents against open-data cells' indexes, each cell's rows folded (``fold``):
    ``MatchWorker``'s work, in-process (no Ray).

    ``cells`` are ``(cell key, method, config, index)``. A batch is matched in pieces of about
    ``max_bytes`` bytes of text (``contamray.corpus.pieces.batches``), so what a method builds per character
    (GPT-4 substrings: ~42 bytes) stays bounded whatever the documents' length: a document longer than
    ``max_bytes`` is cut into pieces that overlap by what the method's ``window`` declares (an n-gram
    method: n - 1 words), each window found by exactly one piece, and all pieces of a document folded in
    one call. Methods whose windows count the same units share one cut (the widest window of them) and so
    the batch's tokenisation; a method without a window (METEOR, the embedding methods) matches every
    document whole.
    """

    def __init__(self, cells: list[tuple[str, Any, Any, Any]], max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.cells = []
        windows: dict[Any, list[Window]] = defaultdict(list)
        for cell_key, method, cfg, index in cells:
            window = method.window(cfg, index)
            self.cells.append((cell_key, method, cfg, index, window.group if window else None))
            if window is not None:
                windows[window.group].append(window)
        self.windows: dict[Any, Window | None] = {None: None, **{g: widest(ws) for g, ws in windows.items()}}

    @property
    def folds(self) -> dict[str, tuple[Any, Any]]:
        """Per cell key, ``(method, config)``: how the cell's rows are folded."""
        return {cell_key: (method, cfg) for cell_key, method, cfg, _, _ in self.cells}

    def results(
        self, docs: list[dict[str, Any]]
    ) -> tuple[list[dict[str, str]], list[tuple[str, list[dict[str, Any]], float]]]:
        """A batch's bad rows (``where``, ``error``: the reader kept them) and, per cell, its folded rows and
        seconds of match and fold over the others."""
        bad = [{"where": d["doc_id"], "error": d["error"]} for d in docs if d.get("error")]
        if bad:
            docs = [d for d in docs if not d.get("error")]
        return bad, self(docs)

    def __call__(self, docs: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]], float]]:
        """``(cell key, folded rows, seconds of match and fold)`` per cell."""
        out = []
        cuts: dict[Any, list[list[dict[str, Any]]]] = {}
        for cell_key, method, cfg, index, group in self.cells:
            started = time.perf_counter()
            if group not in cuts:  # the same lists for every method of the group: one tokenisation
                cuts[group] = list(batches(docs, self.max_bytes, self.windows[group]))
            rows = method.fold([row for piece in cuts[group] for row in method.match(piece, index, cfg)], cfg)
            out.append((cell_key, rows, time.perf_counter() - started))
        return out


def record_parts(rows: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """``(record id, pickled rows of that record)`` per record of ``rows``, in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row["record_id"]), []).append(row)
    return [(record, pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL)) for record, group in groups.items()]


def packed_by_record(rows: list[dict[str, Any]]) -> bytes:
    """Folded rows as ``MatchWorker`` sends them: the pickled ``record_parts``, so the driver files each
    record's rows without turning a whole batch into objects."""
    return pickle.dumps(record_parts(rows), protocol=pickle.HIGHEST_PROTOCOL)


class MatchWorker:
    """Scans corpus batches against every open-data cell's benchmark index (fetched once), with a ``Scanner``
    (byte-bounded pieces; long documents cut by the methods' windows).

    Output: one row per (cell, batch): ``matches``, that cell's match rows folded per example
    (``Method.fold``: a few rows per example however often the batch copies it), pickled per record
    (``packed_by_record``; empty bytes when there are none; the ``CORPUS_ERRORS`` row: a pickled list),
    ``seconds``, the time its method's ``match`` and ``fold`` took on the batch
    (the cell's share of the scan, reported as its cost), and ``node`` / ``actor``, the Ray node and
    actor ids that matched it (the scan logs where its batches ran). A batch of a planted corpus yields
    thousands of rows; a JSON string per row cost as much as the matching itself
    (``bench/open_data_scan.py``), and the rows only travel between our own processes, where pickle
    is Ray's own format anyway.
    """

    def __init__(self, indexes: list[tuple[str, str, str, dict[str, Any], Any]], max_bytes: int = 16 << 20) -> None:
        import ray

        context = ray.get_runtime_context()
        self.node = context.get_node_id()
        self.actor = context.get_actor_id() or ""
        cells = []
        for cell_key, label, name, params, ref in indexes:
            method = get_method(name)
            cells.append((cell_key, method, method.make_config(params, where=f"methods.{label}"), ray.get(ref)))
        self.scanner = Scanner(cells, max_bytes)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        docs = [
            {"doc_id": str(d), "text": t if isinstance(t, str) else ""} for d, t in zip(batch["doc_id"], batch["text"])
        ]
        if "error" in batch:  # the reader kept its bad rows (errors="keep"): they go to the driver, not to matching
            for doc, error in zip(docs, batch["error"]):
                doc["error"] = str(error or "")
        return self.matched(docs)

    def matched(self, docs: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """The output rows for a batch of documents (bad rows, with a non-empty ``error``, listed apart)."""
        return self.output(*self.scanner.results(docs))

    def output(
        self, bad: list[dict[str, str]], results: list[tuple[str, list[dict[str, Any]], float]]
    ) -> dict[str, list[Any]]:
        return match_output(bad, results, self.node, self.actor)


def match_output(
    bad: list[dict[str, str]], results: list[tuple[str, list[dict[str, Any]], float]], node: str = "", actor: str = ""
) -> dict[str, list[Any]]:
    """A match actor's output rows for ``results``: one per cell (and one ``CORPUS_ERRORS`` row when ``bad``),
    marked with the Ray ``node`` and ``actor`` that matched them."""
    cells: list[str] = []
    matches: list[bytes] = []
    seconds: list[float] = []
    if bad:
        cells.append(CORPUS_ERRORS)
        matches.append(pickle.dumps(bad, protocol=pickle.HIGHEST_PROTOCOL))
        seconds.append(0.0)
    for cell_key, rows, spent in results:
        cells.append(cell_key)
        matches.append(packed_by_record(rows) if rows else b"")
        seconds.append(spent)
    return {"cell": cells, "matches": matches, "seconds": seconds, "node": [node] * len(cells),
            "actor": [actor] * len(cells)}  # fmt: skip


class FileMatchWorker(MatchWorker):
    """A ``MatchWorker`` that reads its own files: a task is a group of file paths as the corpus listing gives them
    (``corpus_scan.file_tasks``), each file read with the corpus readers (``read_listed_file``: the ids and bad-row
    reports of ``read_corpus``) and matched in batches of ``batch_docs`` documents / about ``max_bytes`` bytes of
    text. No read task parses the file into Arrow blocks that travel through the object store and are turned back
    into Python strings: the actor parses and matches in one process, as a scan without Ray does
    (``bench/open_data_scan.py``: ``ray_scan_efficiency``). ``pipeline.match_pool`` runs a pool of them.

    The combine happens here: ``scan_into`` folds a task's matches into what the actor holds from its earlier tasks
    (``Held``: per cell a few rows per example, ``FOLD_CONTRACT``: a fold of folds is the fold of the whole), and
    ``flush`` hands it over as one output (``MatchWorker``'s rows) at the end of a pass - the driver folds one
    output per actor, not one per task or file. Both return the actor's ``incarnation``, new in every process
    Ray starts for it: a restarted actor holds nothing of what it folded before, and the pool sees it."""

    def __init__(
        self,
        indexes: list[tuple[str, str, str, dict[str, Any], Any]],
        max_bytes: int = 16 << 20,
        read: dict[str, Any] | None = None,
        batch_docs: int = 256,
    ) -> None:
        super().__init__(indexes, max_bytes)
        self.read = dict(read or {})
        self.batch_docs = max(1, batch_docs)
        self.held = Held(self.scanner.folds)
        self.incarnation = uuid.uuid4().hex

    def scan_into(self, paths: list[str]) -> str:
        """``paths`` read, matched and folded into what this actor holds, batch by batch; its incarnation."""
        for bad, results, _ in scan_batches(self.scanner, paths, self.read, self.batch_docs):
            self.held.add(bad, results)
        return self.incarnation

    def flush(self) -> tuple[str, list[dict[str, list[Any]]]]:
        """Its incarnation and what it holds as one output (then held no more)."""
        return self.incarnation, [self.output(*self.held.take())]


Folds = dict[str, tuple[Any, Any]]  # cell key -> (method, config): how a cell's rows are folded (Scanner.folds)
Results = list[tuple[str, list[dict[str, Any]], float]]  # per cell: (key, folded rows, seconds of match and fold)


class Held:
    """Folded rows per cell gathered over batches (or tasks), the seconds they cost and the bad corpus rows. A
    batch's rows are appended and a cell's rows folded again once they double (``REFOLD_ROWS`` at least): the
    fold's cost stays linear in what is added, and what is held stays a few rows per example."""

    def __init__(self, folds: Folds) -> None:
        self.folds = folds
        self._reset()

    def _reset(self) -> None:
        self.bad: list[dict[str, str]] = []
        self.rows: dict[str, list[dict[str, Any]]] = {key: [] for key in self.folds}
        self.spent: dict[str, float] = dict.fromkeys(self.folds, 0.0)
        self.limit: dict[str, int] = dict.fromkeys(self.folds, REFOLD_ROWS)

    def add(self, bad: list[dict[str, str]], results: Results) -> None:
        self.bad += bad
        for cell_key, cell_rows, seconds in results:
            self.rows[cell_key] += cell_rows
            self.spent[cell_key] += seconds
            if len(self.rows[cell_key]) >= self.limit[cell_key]:  # files copying many items: fold as it goes
                ((_, self.rows[cell_key], self.spent[cell_key]),) = _folded(
                    self.folds, {cell_key: self.rows[cell_key]}, self.spent
                )
                self.limit[cell_key] = max(REFOLD_ROWS, 2 * len(self.rows[cell_key]))

    def take(self) -> tuple[list[dict[str, str]], Results]:
        """The bad rows and, per cell, the rows held folded together; nothing is held after."""
        out = self.bad, _folded(self.folds, self.rows, self.spent)
        self._reset()
        return out


def scan_files(
    scanner: Scanner, paths: list[str], read: dict[str, Any], batch_docs: int, emit_bytes: int | None = None
) -> Iterator[tuple[list[dict[str, str]], Results]]:
    """A task's files in this process (no Ray): each file read with the corpus readers, matched in batches of
    ``batch_docs`` documents / about the scanner's ``max_bytes`` of text, each cell's rows folded across the batches
    and the files (``Held``); ``(bad rows, per cell (key, folded rows, seconds))`` at the end of the files, and once
    per ``emit_bytes`` of text when given - what a ``FileMatchWorker`` does with its tasks (``scan_into`` folds each
    batch straight into what it holds); ``bench/open_data_scan.py`` runs it as the one-process baseline of
    ``ray_scan_efficiency``."""
    held = Held(scanner.folds)
    size = 0
    for bad, results, nbytes in scan_batches(scanner, paths, read, batch_docs):
        held.add(bad, results)
        size += nbytes
        if emit_bytes is not None and size >= emit_bytes:
            yield held.take()
            size = 0
    if size or held.bad:
        yield held.take()


def scan_batches(
    scanner: Scanner, paths: list[str], read: dict[str, Any], batch_docs: int
) -> Iterator[tuple[list[dict[str, str]], Results, int]]:
    """``paths`` read with the corpus readers and matched in batches of ``batch_docs`` documents / about the
    scanner's ``max_bytes`` of text: per batch its bad rows, its rows folded per cell and its bytes of text."""
    from contamray.corpus import read_listed_file

    for path in paths:
        documents = read_listed_file(path, errors="keep", **read)
        for docs in batches(documents, scanner.max_bytes, None, max_docs=batch_docs):
            bad, results = scanner.results(docs)
            yield bad, results, sum(text_bytes(d["text"]) for d in docs)


def _folded(
    folds: Folds, rows: dict[str, list[dict[str, Any]]], spent: dict[str, float]
) -> list[tuple[str, list[dict[str, Any]], float]]:
    """Per cell of ``rows``, its batches' folded rows folded together, and the seconds it took (the fold's too)."""
    out = []
    for cell_key, cell_rows in rows.items():
        started = time.perf_counter()
        method, cfg = folds[cell_key]
        folded = method.fold(cell_rows, cfg) if cell_rows else []
        out.append((cell_key, folded, spent[cell_key] + time.perf_counter() - started))
    return out


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback: NumPy scalars and arrays as numbers and lists, sets as lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
