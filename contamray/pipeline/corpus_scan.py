"""The open-data corpus scan: every open-data cell's benchmark index against the corpus, shard by shard,
folded where the data is and stored as it goes, so a scan resumes where it stopped (issue #16).

- **Shards and passes.** The corpus files are listed once (``corpus.fingerprint.file_listing``: path,
  size, mtime) and scanned in passes of ``ray.corpus_files_per_pass`` files in path order; a hub dataset
  is one shard. One pass is one stream of match actors' outputs (``matched_stream``): by default a pool of
  ``FileMatchWorker`` actors reading their own files (``pipeline.match_pool``), else Ray Data read tasks ->
  ``MatchWorker`` actors; either pool autoscales from ``ray.match_concurrency`` to ``ray.match_concurrency_max``
  actors (default the cluster's CPUs). A batch
  of ``ray.corpus_batch_size`` documents is matched in pieces of about ``ray.corpus_batch_bytes`` bytes of
  text (``MatchWorker``): GPT-4 substrings hold ~42 bytes per character, so 1,024 book-length documents
  matched at once would need ~20 GB in one worker. A document longer than that is itself cut into pieces
  overlapping by what each method's ``window`` declares (n - 1 words for an n-gram method), so no window
  is lost or counted twice (``contamray.corpus.pieces``).
- **Fold where the data is.** A match actor folds the rows its method's ``match`` gives for a batch
  (``Method.fold``, ``methods/open/common.FOLD_CONTRACT``): per example a few rows (counts as numbers, the
  first ``max_evidence`` documents as evidence), whatever the number of corpus copies, folds its batches and
  tasks together as it goes (``actors.FileMatchWorker``: one output per actor and pass, ``pipeline.match_pool``;
  a Ray Data ``MatchWorker``, fed by read tasks: one per batch), and sends them pickled per record. The driver
  files them by record, still pickled, and folds them into what it holds
  once they weigh as much (``_Folding``: a few records at a time, so the fold's working structures never
  exist for every example at once): it holds O(benchmark examples) per cell, never O(matches).
- **Resume mid-corpus.** When a pass ends, each cell's folded rows for it are written to the result store
  (``scans/<index hash>/<shard key>.pkl``, atomically): the index hash covers everything the matching
  depends on (method and parameters, the benchmark's rows, the results version), the shard key the
  pass's files by path, size and mtime (a planted corpus, rebuilt in every run's folder: by name, size
  and the corpus' content digest). A re-run of the same config scans only the passes with no stored
  result and says how many it reused; a cell whose index differs (another method, other parameters,
  other rows) reuses nothing, even from a method that shares its n-gram length - equality is not proven
  by a name - and the log says which cells each pass scans.
  An unpinned hub dataset (no ``revision``) can change under the same URI, so its scans are not reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from contamray.corpus import is_hub_uri
from contamray.corpus.fingerprint import file_listing
from contamray.interrupts import RunInterrupted, stop_requested
from contamray.methods.base import Method
from contamray.pipeline.actors import CORPUS_ERRORS, Folds, MatchWorker, record_parts
from contamray.pipeline.match_pool import pooled_matches
from contamray.pipeline.placement import cpu_work_cpus, cpu_work_options
from contamray.pipeline.plan import RESULTS_VERSION, Cell, Plan
from contamray.pipeline.progress import Progress
from contamray.pipeline.store import ResultStore
from contamray.records import Record

log = logging.getLogger("contamray")

DEFAULT_FILES_PER_PASS = 8
DEFAULT_BATCH_BYTES = 16 << 20
# the driver folds a cell's incoming rows once this many are waiting (and at least as many as it holds),
# or once their pickled bytes (evidence: hits, grams, texts) are this many and at least as many as it holds:
# a batch's folded rows are few but, when the corpus copies its examples, each carries max_evidence
# documents' evidence, and all the batches of a pass waiting unfolded made the driver O(matches)
REFOLD_ROWS = 20_000
REFOLD_BYTES = 1 << 20
REFOLD_RECORDS = 32  # records folded together in a refold


@dataclass(frozen=True)
class Shard:
    """One pass of the scan: ``paths`` to read, ``key`` naming their content, ``reusable`` when the key proves it."""

    paths: tuple[str, ...]
    key: str
    reusable: bool
    size: int
    sizes: tuple[int, ...] = ()  # bytes of each path (0: unknown, e.g. a hub dataset)


@dataclass
class ScanCell:
    """An open-data cell as the scan sees it: its method and config, index hash and built index."""

    cell: Cell
    method: Method
    cfg: Any
    index_hash: str
    index_ref: Any = None


@dataclass
class ScanResult:
    """What the scan gives the scoring step: folded match rows and seconds of matching per cell key, the
    corpus rows the readers could not use and the listed files' sizes (``corpus.coverage``), and the passes
    scanned / reused."""

    matches: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    errors: list[dict[str, str]] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each listed file (0: unknown), by path
    scanned: int = 0
    reused: int = 0
    # where the scanned passes were matched: per Ray node id, the match actors that ran batches there
    workers: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def index_hash(plan: Plan, cell: Cell) -> str:
    """A hash of everything a cell's matching depends on, and nothing about the corpus."""
    mp = plan.methods[cell.method]
    parts = {
        "results": RESULTS_VERSION,
        "method": mp.method_name,
        "params": mp.resolved(),
        "benchmark": cell.benchmark,
        "rows": plan.row_digests.get(cell.benchmark, ""),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shards(corpus: dict[str, Any], files_per_pass: int) -> list[Shard]:
    """The corpus' passes, in path order; a planted corpus' files keyed by name and content."""
    listing = sorted(file_listing(corpus["paths"]))
    planted = corpus.get("kind") == "planted"
    out = []
    for start in range(0, len(listing), max(1, files_per_pass)):
        group = listing[start : start + max(1, files_per_pass)]
        ident: list[Any] = []
        reusable = True
        for path, size, mtime in group:
            if size < 0:  # a hub dataset: its URI carries the revision, or "unpinned"
                reusable = reusable and not path.endswith("#unpinned")
                ident.append(path)
            elif planted:  # rebuilt in each run's folder (or published by content): named by its content
                ident.append((path.rsplit("/", 1)[-1], size, corpus.get("digest", "")))
            else:
                ident.append((path, size, mtime))
        key = hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:16]
        paths = tuple(path.rsplit("#", 1)[0] if size < 0 else path for path, size, _ in group)
        sizes = tuple(max(0, s) for _, s, _ in group)
        out.append(Shard(paths, key, reusable, sum(sizes), sizes))
    return out


def scan_corpus(
    plan: Plan,
    cells: list[Cell],
    records: dict[str, list[Record]],
    corpus: dict[str, Any],
    store: ResultStore,
) -> ScanResult:
    """Scan ``corpus`` for every open-data cell of ``cells``: folded matches per cell key (see the module
    docstring); each pass is stored as it finishes and reused by a re-run."""
    scan_cells = []
    for cell in cells:
        mp = plan.methods[cell.method]
        scan_cells.append(ScanCell(cell, mp.method, mp.config(), index_hash(plan, cell)))
    passes = shards(corpus, int(plan.ray.get("corpus_files_per_pass", DEFAULT_FILES_PER_PASS)))
    result = ScanResult()
    folds: dict[str, _Folding] = defaultdict(_Folding)
    total_bytes = sum(s.size for s in passes)
    result.sizes = {path: size for s in passes for path, size in zip(s.paths, s.sizes, strict=True)}
    with Progress("corpus scan", len(passes), unit="passes") as progress:
        for number, shard in enumerate(passes, 1):
            stored = {
                sc.cell.key: store.get_scan(sc.index_hash, shard.key) if shard.reusable else None for sc in scan_cells
            }
            missing = [sc for sc in scan_cells if stored[sc.cell.key] is None]
            if missing:
                _build_indexes(missing, records, result)
                what = "" if len(missing) == len(scan_cells) else f" for {len(missing)} of {len(scan_cells)} cells"
                log.info(
                    "corpus pass %d/%d: %d file(s), %.1f MB of %.1f MB%s",
                    number, len(passes), len(shard.paths), shard.size / 1e6, total_bytes / 1e6, what,
                )  # fmt: skip
                fresh, workers = _scan_pass(plan, corpus, shard, missing)
                for node, actors in workers.items():
                    result.workers[node] |= actors
                log.info(
                    "corpus pass %d/%d: matched by %d actor(s) on %d node(s)",
                    number, len(passes), sum(len(a) for a in workers.values()), len(workers),
                )  # fmt: skip
                for sc in missing:
                    part = fresh[sc.cell.key]  # its matches still pickled per record: rows only for the store
                    if shard.reusable:
                        rows = {**part, "matches": part["matches"].rows()}
                        store.put_scan(sc.index_hash, shard.key, pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
                        del rows
                    stored[sc.cell.key] = part
                result.scanned += 1
            else:
                result.reused += 1
            for sc in scan_cells:
                part = stored[sc.cell.key]
                assert part is not None
                result.seconds[sc.cell.key] += float(part["seconds"])
                matches = part["matches"]
                packed = list(matches.folded.items()) if isinstance(matches, _Folding) else record_parts(matches)
                _fold_into(sc.method, sc.cfg, folds[sc.cell.key], packed)
            result.errors.extend(stored[scan_cells[0].cell.key]["errors"])  # type: ignore[index]
            progress.update(1)
    for sc in scan_cells:
        _fold_into(sc.method, sc.cfg, folds[sc.cell.key], [], final=True)
        result.matches[sc.cell.key] = folds[sc.cell.key].rows()
    if result.reused:
        log.info("corpus scan: %d of %d pass(es) reused from the result store", result.reused, len(passes))
    return result


def _build_indexes(cells: list[ScanCell], records: dict[str, list[Record]], result: ScanResult) -> None:
    for sc in cells:
        if sc.index_ref is None:
            started = time.perf_counter()
            sc.index_ref = ray.put(sc.method.build_index(records[sc.cell.benchmark], sc.cfg))
            result.seconds[sc.cell.key] += time.perf_counter() - started


Packed = list[tuple[str, bytes]]  # (record id, pickled rows of that record), as MatchWorker sends them


@dataclass
class _Folding:
    """A cell's folded rows and the rows waiting to be folded into them, by record id and pickled (a
    fifth of their size as objects). A fold works per example (``FOLD_CONTRACT`` 5), so a refold goes
    ``REFOLD_RECORDS`` records at a time: the driver holds the rows of a few examples as objects, and
    the fold's working structures for those only."""

    folded: dict[str, bytes] = field(default_factory=dict)
    pending: dict[str, list[bytes]] = field(default_factory=dict)
    waiting: int = 0  # pieces waiting (each at least a row)
    folded_bytes: int = 0
    pending_bytes: int = 0

    def add(self, parts: Packed) -> None:
        """Rows to fold, pickled per record."""
        for record, blob in parts:
            self.pending.setdefault(record, []).append(blob)
            self.pending_bytes += len(blob)
        self.waiting += len(parts)

    def refold(self, method: Any, cfg: Any) -> None:
        """The waiting rows folded into the folded rows, ``REFOLD_RECORDS`` records at a time."""
        records = sorted(self.pending)
        for start in range(0, len(records), REFOLD_RECORDS):
            group: list[dict[str, Any]] = []
            for record in records[start : start + REFOLD_RECORDS]:
                if record in self.folded:
                    self.folded_bytes -= len(self.folded[record])
                    group += pickle.loads(self.folded.pop(record))
                for blob in self.pending.pop(record):
                    group += pickle.loads(blob)
            folded = record_parts(method.fold(group, cfg))
            del group
            for record, blob in folded:
                self.folded[record] = blob
                self.folded_bytes += len(blob)
        self.waiting, self.pending_bytes = 0, 0

    def rows(self) -> list[dict[str, Any]]:
        """The folded rows, in record id order (``fold``'s)."""
        return [row for record in sorted(self.folded) for row in pickle.loads(self.folded[record])]


def _fold_into(method: Any, cfg: Any, folding: _Folding, parts: Packed, final: bool = False) -> None:
    """Add ``parts`` to the cell's waiting rows; fold them into its folded rows when enough wait (pieces or
    bytes, at least as many as it holds: the folds cost linear time in all) or at the end."""
    f = folding
    f.add(parts)
    if f.waiting and (
        final or f.waiting >= max(REFOLD_ROWS, len(f.folded)) or f.pending_bytes >= max(REFOLD_BYTES, f.folded_bytes)
    ):
        f.refold(method, cfg)


def gpu_share(plan: Plan, cells: list[ScanCell]) -> float:
    """The share of a GPU each match actor of the methods that encode with a neural model
    (``OpenMethod.match_on_gpu``: the embedding methods) holds: ``ray.match_gpu_share`` when the cluster has
    GPUs and such a method is scanned, else 0 (every match actor on CPUs)."""
    share = float(plan.ray.get("match_gpu_share", 0.25) or 0.0)
    if share <= 0 or not any(getattr(sc.method, "match_on_gpu", False) for sc in cells):
        return 0.0
    return min(share, 1.0) if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def _scan_pass(
    plan: Plan, corpus: dict[str, Any], shard: Shard, cells: list[ScanCell]
) -> tuple[dict[str, dict[str, Any]], dict[str, set[str]]]:
    """``shard``'s files scanned for ``cells``: per cell key its folded rows, seconds of matching, and the pass's
    bad corpus rows; and per Ray node id the match actors that ran there. One stream (``_stream``), or two on a
    cluster with GPUs when an embedding method is scanned: the methods that encode on GPU actors (each holding
    ``gpu_share`` of a GPU), the others on CPU actors kept off GPU nodes; each stream reads the files."""
    share = gpu_share(plan, cells)
    on_gpu = [sc for sc in cells if share and getattr(sc.method, "match_on_gpu", False)]
    groups = [(g, s) for g, s in (([sc for sc in cells if sc not in on_gpu], 0.0), (on_gpu, share)) if g]
    out: dict[str, dict[str, Any]] = {}
    workers: dict[str, set[str]] = defaultdict(set)
    errors: list[dict[str, str]] | None = None
    for group, group_share in groups:
        part, placed = _stream(plan, corpus, shard, group, group_share)
        for node, actors in placed.items():
            workers[node] |= actors
        for key, value in part.items():
            errors = value["errors"] if errors is None else errors  # each stream reads the same bad rows
            out[key] = {**value, "errors": errors}
    return out, dict(workers)


def _stream(
    plan: Plan, corpus: dict[str, Any], shard: Shard, cells: list[ScanCell], share: float
) -> tuple[dict[str, dict[str, Any]], dict[str, set[str]]]:
    """One stream of matches over ``shard``'s files for ``cells`` (``matched_stream``), by actors holding one CPU
    and ``share`` of a GPU (0: CPU actors, kept off GPU nodes when the cluster has CPU-only ones)."""
    low = max(1, int(plan.ray.get("match_concurrency", 1)))
    # by default as many actors as the CPUs they may use: CPU actors stay off GPU nodes when there are others
    ceiling = plan.ray.get("match_concurrency_max") or (
        ray.cluster_resources().get("CPU", low) if share else cpu_work_cpus() or low
    )
    if share:
        ceiling = min(int(ceiling), max(1, int(ray.cluster_resources().get("GPU", 0) / share)))
        low = min(low, ceiling)
    high = max(low, int(ceiling))
    indexes = [
        (sc.cell.key, sc.cell.method, plan.methods[sc.cell.method].method_name, plan.methods[sc.cell.method].params,
         sc.index_ref)
        for sc in cells
    ]  # fmt: skip
    placement: dict[str, Any] = {"num_gpus": share} if share else cpu_work_options()
    matched = matched_stream(
        list(shard.paths),
        corpus,
        indexes,
        low,
        high,
        sizes=list(shard.sizes) or None,
        read_by=reader_of(plan, shard),
        batch_docs=int(plan.ray.get("corpus_batch_size", 256)),
        max_bytes=int(plan.ray.get("corpus_batch_bytes", DEFAULT_BATCH_BYTES)),
        placement=placement,
    )
    workers: dict[str, set[str]] = defaultdict(set)

    def placed(batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for batch in batches:
            for node, actor in zip(batch.get("node", ()), batch.get("actor", ())):
                workers[str(node)].add(str(actor))
            yield batch

    folded = fold_stream(placed(matched), {sc.cell.key: (sc.method, sc.cfg) for sc in cells})
    out = {key: {"matches": fold, "seconds": folded.seconds[key], "errors": folded.errors}
           for key, fold in folded.folds.items()}  # fmt: skip
    return out, dict(workers)


@dataclass
class FoldedStream:
    """A match stream folded by the driver: per cell key its folded rows (``_Folding.rows``) and seconds of
    matching, and the stream's bad corpus rows."""

    folds: dict[str, _Folding]
    seconds: dict[str, float]
    errors: list[dict[str, str]]


def fold_stream(batches: Iterable[dict[str, Any]], folds: Folds) -> FoldedStream:
    """The driver's part of a scan: the match actors' output batches (``actors.match_output`` rows) folded per cell
    as they arrive (``folds``: cell key -> (method, config)), a refold whenever enough rows wait (``_fold_into``)
    and once at the end. ``bench/open_data_scan.py`` folds its one-process baseline's output with it too. A stopped
    sweep (``interrupts.stop_all``: a job runs in a thread the signal does not reach; a single run's Ctrl-C interrupts
    the driver's thread itself) raises ``RunInterrupted`` at the next batch; the passes finished before are stored."""
    out = FoldedStream({key: _Folding() for key in folds}, dict.fromkeys(folds, 0.0), [])
    for cell_key, blob, spent in _blobs(batches):
        if stop_requested():
            raise RunInterrupted("corpus scan: stopped; the passes finished before are stored")
        if cell_key == CORPUS_ERRORS:
            out.errors.extend(pickle.loads(blob))
            continue
        out.seconds[cell_key] += spent
        _fold_into(*folds[cell_key], out.folds[cell_key], pickle.loads(blob) if len(blob) else [])
    for key, (method, cfg) in folds.items():
        _fold_into(method, cfg, out.folds[key], [], final=True)
    return out


def reader_of(plan: Plan, shard: Shard) -> str:
    """Who reads a pass's files: ``ray.corpus_read`` (``actors``, the default: each match actor reads whole
    files; ``tasks``: Ray Data read tasks feed the actors blocks) - a hub dataset is always read by tasks."""
    return "tasks" if any(is_hub_uri(path) for path in shard.paths) else str(plan.ray.get("corpus_read") or "actors")


TASK_BYTES = 64 << 20  # a match actor's task: files of about this many bytes together
TASKS_PER_ACTOR = 4  # ... but a small pass still gives every actor of the pool this many tasks


def file_tasks(paths: list[str], sizes: list[int] | None, actors: int) -> list[list[str]]:
    """``paths`` in consecutive groups, each one task of a match actor: files of about ``TASK_BYTES`` together
    (fewer when the pass is small: at least ``TASKS_PER_ACTOR`` tasks per actor), a larger file alone. Each
    task is an actor call (~1-2 ms) and a fold into what its actor holds; a group shares them, and four tasks per
    actor keep the pool's tail short. Without ``sizes``, a file a task."""
    if not sizes or len(sizes) != len(paths):
        return [[p] for p in paths]
    target = max(1, min(TASK_BYTES, sum(sizes) // max(1, TASKS_PER_ACTOR * actors)))
    tasks: list[list[str]] = []
    group: list[str] = []
    size = 0
    for path, nbytes in zip(paths, sizes, strict=True):
        group.append(path)
        size += nbytes
        if size >= target:
            tasks.append(group)
            group, size = [], 0
    return tasks + [group] if group else tasks


def matched_stream(
    paths: list[str],
    corpus: dict[str, Any],
    indexes: list[tuple[str, str, str, dict[str, Any], Any]],
    low: int,
    high: int,
    *,
    read_by: str = "actors",
    batch_docs: int = 256,
    max_bytes: int = DEFAULT_BATCH_BYTES,
    placement: dict[str, Any] | None = None,
    sizes: list[int] | None = None,
) -> Iterator[dict[str, Any]]:
    """The match actors' output batches over ``paths`` (``actors.match_output`` rows), from an autoscaling pool of
    ``low`` .. ``high`` actors, each holding one CPU (and ``placement``'s resources).

    ``read_by="actors"``: groups of files (``file_tasks``: consecutive files of about ``TASK_BYTES`` together when
    ``sizes`` are known, else one file a group), each read and matched by one ``FileMatchWorker`` of a
    ``match_pool`` (which never grows past the number of groups); ``"tasks"``: Ray Data read tasks (a quarter CPU
    each, so match actors holding every CPU cannot starve them) parse the files into blocks of documents that
    any ``MatchWorker`` of a Ray Data actor pool matches, in batches of ``batch_docs`` documents - more parallel
    within a single large file, at the cost of moving every document through the object store; the pool leaves
    a CPU to the readers."""
    from contamray.corpus import read_corpus

    options = {"format": corpus.get("format", "auto"), "text_field": corpus.get("text_field", "text"),
               "id_field": corpus.get("id_field")}  # fmt: skip
    placement = cpu_work_options() if placement is None else placement
    if read_by == "actors":
        worker = {"indexes": indexes, "max_bytes": max_bytes, "read": options, "batch_docs": batch_docs}
        return pooled_matches(file_tasks(paths, sizes, high), worker, low, high, placement)
    # read tasks need a quarter CPU each: a pool holding every CPU it may use would wait for them forever
    high = max(1, min(high, int(cpu_work_cpus() or 2) - 1))
    low = min(low, high)
    ds = read_corpus(
        paths,
        **options,
        errors="keep",  # bad rows travel to the driver, which lists them (a worker's log can be lost)
        ray_remote_args={"num_cpus": 0.25, **cpu_work_options()},
    )
    matched = ds.map_batches(
        MatchWorker,
        # a worker matches a batch in pieces of about max_bytes of text: its memory follows the bytes
        fn_constructor_kwargs={"indexes": indexes, "max_bytes": max_bytes},
        compute=ray.data.ActorPoolStrategy(min_size=low, max_size=high),
        batch_size=batch_docs,
        batch_format="numpy",
        num_cpus=1,
        **placement,
    )
    return matched.iter_batches(batch_format="numpy", batch_size=None)


def _blobs(batches: Iterable[dict[str, Any]]) -> Iterator[tuple[str, bytes, float]]:
    for batch in batches:
        for cell_key, blob, spent in zip(batch["cell"], batch["matches"], batch["seconds"]):
            yield str(cell_key), bytes(blob), float(spent)
