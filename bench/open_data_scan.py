"""Open-data scan benchmark: contamray's 13-gram scan against LLMSanitize's and datatrove's, per core, through
Ray Data, and the driver's memory under contamination - each figure a ratio against a baseline of this run.

What is measured (issues 4 and 16, "Benchmark"), on one machine and one corpus, in this one process run:

1. **LLMSanitize**: ntunlp/LLMSanitize's ``build_ngrams`` + ``overlap_ngrams`` (``utils/string_utils.py``)
   with its GPT-3 text cleaning (``clean_text_gpt3`` of ``open_data_methods/gpt3.py``), 13-grams,
   over the corpus and the benchmark. The package is installed with ``pip install llmsanitize
   --no-deps`` into a throwaway venv under /tmp and its two files are loaded by path (the package's
   ``__init__`` imports its whole model stack). Its ``word_tokenize`` needs nltk's punkt data, which
   cannot be downloaded here, so it runs as ``word_tokenize(text, preserve_line=True)`` - nltk's own
   tokenizer without the sentence splitter, i.e. *less* work than the real thing: the ratio is
   conservative. Its ``>= 10 documents`` deletion loop raises in Python 3 and is left out.
2. **datatrove**: HuggingFace datatrove 0.10.1 (``pip install datatrove==0.10.1 spacy "xxhash<4" regex``
   into a throwaway venv under /tmp; spaCy is its English word tokenizer, xxhash its default n-gram hash).
   This script runs again under that venv's python (``--child-datatrove``): ``NGramsDecontIndexer`` builds
   its own index from the same benchmark items (label as the document text, input as its ``query``,
   ``n_grams=13``, ``find_query_ngrams=True`` and the default overlap n-grams: the input, label and
   input-label regions contamray's ``ngram_overlap`` indexes), then ``NGramsDecontFilter`` runs over the
   same corpus documents in memory; the filter is timed (its corpus pass), the index build and load
   apart. Tokenizer: datatrove's own for English, ``spacy.blank("en")`` - rule-based, it needs no model
   download, so it runs here as it would anywhere; a second run with a whitespace tokenizer is printed
   for reference (the issue's "~11x"). The indexer imports lighteval after the documents it is given to
   load hub tasks; it is given no hub task, so lighteval (torch, transformers) is an empty stand-in. Both
   tools' flagged documents are compared: contamray also matches items shorter than 13 words whole (GPT-3's
   rule), which datatrove's 13-grams cannot reach; the output counts those.
3. **contamray**: ``ngram_overlap`` with ``n=13`` - ``build_index`` on the benchmark, ``match`` over the
   corpus in batches of 256 documents, ``score`` - in one process (per-core throughput); the same files
   read, matched and folded in one process as the match actors and the driver do (``pipeline.actors.scan_files``
   whose output ``corpus_scan.fold_stream`` folds: the end-to-end rate); then through
   Ray exactly as the pipeline runs it (``corpus_scan.matched_stream`` -> the driver's ``fold_stream``), with
   match actors reading their own files (``ray.corpus_read=actors``: ``pipeline.match_pool``) and fed by Ray Data
   read tasks (``tasks``),
   1 and 2 workers each (scaling); every Ray scan's folded rows must equal the one-process scan's. A Ray run
   pays a fixed start-up (worker processes, the index fetch, the
   first file) whatever the corpus size, so the scan rate is taken from the difference between the corpus
   copied ``--scan-copies`` times (40: ~190 MB, so the start-up, which varies by a second or two from run
   to run, is small beside the scan) and the 1x corpus (best of two runs each); both wall times are printed.
   ``ray_scan_efficiency`` is the 2-worker rate (actors reading their files) over twice the one-process end-to-end rate
   (the same many-copies corpus read, matched and folded in this process: the match actors' and the driver's
   work without Ray);
   ``ray_scan_efficiency_vs_match_only`` over twice the in-memory matching rate. ``--ray-only`` runs just
   this part.
4. **Memory**: the peak RSS of a streaming scan (``iter_documents`` -> ``match``, in a fresh child
   process) on the corpus and on the corpus ten times over: flat, set by the benchmark index; and
   the reference's peak RSS, which holds every corpus n-gram in a dict.
5. **The driver under contamination**: ``pipeline/corpus_scan.scan_corpus`` (passes of 4 files, an
   autoscaling pool of 1..2 match actors, the result store) run from a fresh child process, the
   scan's driver, whose peak RSS (``VmHWM``; ``ru_maxrss`` would include this script's own, carried
   across fork + exec) is read after the scan. Benchmark: ``--rss-items`` GSM8K rows,
   uncapped ``ngram_overlap`` n=13 (a match row per copy before the fold); corpus: ``--rss-docs`` mirrored
   documents, each row appended to ``--rss-copies`` (100) of them - verbatim in all of them, or verbatim in
   one and with its words shuffled in the rest (same bytes, no match). The ratio of the two peaks is
   ``driver_rss_ratio_100x_matches``. ``--rss-only`` runs just this part.

The corpus of 1-4 is mirrored benchmark text (XSum articles, AG News, IMDB reviews, SAMSum dialogues)
with 200 GSM8K, ARC, MMLU and TruthfulQA items planted verbatim, written as jsonl shards. The last lines
are ``name: value``: ``ratio_vs_llmsanitize_per_core`` and ``ratio_vs_datatrove_per_core`` (contamray
MB/s per core over the reference's, spaCy tokenizer; guard >= 50x), ``driver_rss_ratio_100x_matches``
(goal <= 1.1), ``ray_scan_efficiency`` (goal >= 0.8; and ``ray_scan_efficiency_vs_match_only``).

    python bench/open_data_scan.py --mirror ../shared/benchmarks [--mb 4.7] [--venv /tmp/llmsanitize-venv]
        [--datatrove-venv /tmp/datatrove-venv] [--rss-items 200] [--rss-docs 2000]

``--mb 1 --rss-items 50 --rss-docs 500`` is a quick run (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib.util
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up in pipes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = (  # (mirror file, text field)
    ("EdinburghNLP/xsum/default/test.jsonl", "document"),
    ("fancyzhx/ag_news/default/test.jsonl", "text"),
    ("stanfordnlp/imdb/plain_text/test.jsonl", "text"),
    ("knkarthick/samsum/default/test.jsonl", "dialogue"),
)
BATCH = 256
SHARD_DOCS = 2000


# --------------------------------------------------------------------------- data


def benchmark_records(mirror: Path) -> list[Any]:
    from contamray.benchmarks import load_records

    records = []
    for name in ("gsm8k", "arc_challenge", "mmlu", "truthfulqa_gen"):
        records += load_records(name, mirror_dir=mirror, n=None).records
    return records


def build_corpus(
    mirror: Path, records: list[Any], target_mb: float, folder: Path, copies: int
) -> tuple[list[Path], dict[str, list[Any]]]:
    """jsonl shards of mirrored text (~target_mb) with 200 benchmark items planted, ``copies`` times; and
    the documents holding a planted item (id: position in one copy) with their items."""
    texts: list[str] = []
    size = 0
    for rel, field in SOURCES:
        with open(mirror / rel, encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)[field]
                texts.append(text)
                size += len(text.encode())
                if size >= target_mb * 1e6:
                    break
        if size >= target_mb * 1e6:
            break
    rng = random.Random(0)
    planted: dict[str, list[Any]] = defaultdict(list)
    for record in rng.sample(records, 200):
        i = rng.randrange(len(texts))
        texts[i] = f"{texts[i]}\n{record.input}\n{record.label}"
        planted[str(i)].append(record)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for copy in range(copies):
        for start in range(0, len(texts), SHARD_DOCS):
            path = folder / f"copy{copy:02d}-shard{start // SHARD_DOCS:03d}.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for i, text in enumerate(texts[start : start + SHARD_DOCS]):
                    f.write(json.dumps({"id": f"{copy}-{start + i}", "text": text}) + "\n")
            paths.append(path)
    return paths, planted


def corpus_texts(paths: list[Path]) -> list[str]:
    return [json.loads(line)["text"] for p in paths for line in open(p, encoding="utf-8")]


def megabytes(texts: list[str]) -> float:
    return sum(len(t.encode()) for t in texts) / 1e6


# --------------------------------------------------------------------------- the reference


def ensure_llmsanitize(venv: Path) -> Path:
    """The installed ``llmsanitize`` package folder in a throwaway venv (created when missing)."""
    found = list(venv.glob("lib/python*/site-packages/llmsanitize"))
    if not found:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "llmsanitize"], check=True)
        found = list(venv.glob("lib/python*/site-packages/llmsanitize"))
    if not found:
        raise RuntimeError(f"llmsanitize is not installed in {venv}")
    return found[0]


def load_reference(package: Path) -> tuple[Any, Any]:
    """(``string_utils`` module, ``clean_text_gpt3``) loaded from the installed files by path."""
    import nltk

    os.environ.setdefault("TQDM_DISABLE", "1")
    spec = importlib.util.spec_from_file_location(
        "llmsanitize_string_utils", package / "utils" / "string_utils.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    module.word_tokenize = functools.partial(nltk.word_tokenize, preserve_line=True)  # no punkt data here
    tree = ast.parse((package / "open_data_methods" / "gpt3.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "clean_text_gpt3")
    namespace: dict[str, Any] = {"string": __import__("string")}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(package / "gpt3.py"), "exec"), namespace)
    return module, namespace["clean_text_gpt3"]


def run_reference(
    module: Any, clean: Any, corpus: list[str], eval_texts: list[str]
) -> tuple[float, float, int]:
    """(corpus pass seconds: ``build_ngrams``, benchmark pass seconds: ``overlap_ngrams``, dirty examples)."""
    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bars
        start = time.perf_counter()
        train = module.build_ngrams(corpus, 13, clean)
        middle = time.perf_counter()
        overlaps = module.overlap_ngrams(eval_texts, train, 13, clean)
    return middle - start, time.perf_counter() - middle, sum(found >= 1 for found, _ in overlaps)


# --------------------------------------------------------------------------- datatrove

DATATROVE = "datatrove==0.10.1"
# what its English word tokenizer (spaCy) and its default hash (xxhash, ``xxhash<4`` in its own
# "processing" extra) need; ``spacy.blank("en")`` is rule-based, no model download
DATATROVE_EXTRAS = ("spacy", "xxhash<4", "regex")


def ensure_datatrove(venv: Path) -> Path:
    """The python of a throwaway venv holding datatrove (created when missing)."""
    python = venv / "bin" / "python"
    probe = "import datatrove.pipeline.decont.n_grams, spacy, xxhash"
    if not python.exists() or subprocess.run([str(python), "-c", probe], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", DATATROVE, *DATATROVE_EXTRAS], check=True)
    return python


def run_datatrove(python: Path, paths: list[Path], items: Path, tokenizer: str) -> dict[str, Any]:
    """This script as a child of the venv's ``python`` (which has datatrove, not contamray): its result."""
    out = subprocess.run(
        [str(python), __file__, "--child-datatrove", tokenizer, "--items", str(items), *map(str, paths)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_datatrove(paths: list[str], items: Path, tokenizer: str) -> None:
    """datatrove's ``NGramsDecontIndexer`` over the benchmark items, then its ``NGramsDecontFilter`` over the
    corpus (documents in memory, as contamray's corpus pass gets them), 13-grams, input and label n-grams
    (``find_query_ngrams=True``; the overlap n-grams are on by default) - contamray's ``ngram_overlap``
    indexes the same three regions. Runs in the datatrove venv: no contamray import here."""
    import types

    from datatrove.data import Document
    from datatrove.pipeline.decont import n_grams
    from datatrove.utils.word_tokenizers import WordTokenizer

    # The indexer loads lighteval hub tasks after the documents it is given; it is given every item as a
    # document and no hub task, so lighteval (torch, transformers, datasets) is an empty stand-in here.
    registry = types.SimpleNamespace(get_task_dict=lambda tasks: {})
    stub = {
        "lighteval": types.ModuleType("lighteval"),
        "lighteval.tasks": types.ModuleType("lighteval.tasks"),
        "lighteval.tasks.lighteval_task": types.ModuleType("lighteval.tasks.lighteval_task"),
        "lighteval.tasks.registry": types.ModuleType("lighteval.tasks.registry"),
    }
    stub["lighteval.tasks.lighteval_task"].LightevalTask = types.SimpleNamespace(load_datasets=lambda tasks: None)
    stub["lighteval.tasks.registry"].Registry = lambda **kwargs: registry
    sys.modules.update(stub)
    n_grams.NGramsDecontIndexer._requires_dependencies = []

    class Whitespace(WordTokenizer):
        """``str.split``: what the issue's "~11x with a whitespace tokenizer" measured."""

        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    language: Any = Whitespace() if tokenizer == "whitespace" else "eng"  # "eng": spaCy's blank English
    config = n_grams.NGramsDecontConfig(n_grams=13, find_query_ngrams=True)
    rows = [json.loads(line) for line in open(items, encoding="utf-8")]
    bench_docs = [Document(text=r["label"], id=r["id"], metadata={"query": r["input"]}) for r in rows]
    corpus = [
        Document(text=json.loads(line)["text"], id=str(i))
        for i, line in enumerate(line for p in paths for line in open(p, encoding="utf-8"))
    ]
    index = tempfile.mkdtemp(prefix="datatrove-index-")
    try:
        t0 = time.perf_counter()
        n_grams.NGramsDecontIndexer(index, config=config, language=language).run(iter(bench_docs))
        step = n_grams.NGramsDecontFilter(index, config=config, language=language)
        step.load_index_hashes()
        t1 = time.perf_counter()
        kept = {doc.id for doc in step.run(iter(corpus))}
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(index, ignore_errors=True)
    removed = sorted(doc.id for doc in corpus if doc.id not in kept)
    print(json.dumps({"index_s": t1 - t0, "filter_s": t2 - t1, "removed": removed, "docs": len(corpus)}))


# --------------------------------------------------------------------------- contamray


def run_contamray(records: list[Any], docs: list[dict[str, str]]) -> tuple[float, float, int, int, set[str]]:
    """(corpus pass seconds: ``match`` over every batch, benchmark pass seconds: ``build_index`` +
    ``score``, contaminated examples, indexed n-grams, ids of the documents with a match)."""
    from contamray.methods.base import get_method

    method = get_method("ngram_overlap")
    cfg = method.make_config({"n": 13})
    t0 = time.perf_counter()
    index = method.build_index(records, cfg)
    t1 = time.perf_counter()
    matches = []
    for i in range(0, len(docs), BATCH):
        matches.extend(method.match(docs[i : i + BATCH], index, cfg))
    t2 = time.perf_counter()
    rows = method.score(records, matches, cfg)
    t3 = time.perf_counter()
    found = {str(m["doc_id"]) for m in matches}
    return t2 - t1, (t1 - t0) + (t3 - t2), sum(r["contaminated"] for r in rows), index.n_grams, found


def reader_rates(paths: list[Path], work: Path) -> dict[str, float]:
    """MB/s of jsonl (uncompressed bytes) per core through ``iter_documents`` - the readers' parser - for the
    shards as they are, gzip'd (level 6) and zstd'd (level 3, when ``zstandard`` is installed); best of 3."""
    import gzip

    from contamray.corpus import iter_documents

    raw = sum(p.stat().st_size for p in paths) / 1e6
    variants: dict[str, list[Path]] = {"jsonl": paths, "jsonl.gz": []}
    for path in paths:
        variants["jsonl.gz"].append(work / f"{path.stem}.jsonl.gz")
        variants["jsonl.gz"][-1].write_bytes(gzip.compress(path.read_bytes(), 6))
    try:
        import zstandard
    except ImportError:
        zstandard = None
    if zstandard is not None:
        variants["jsonl.zst"] = []
        for path in paths:
            variants["jsonl.zst"].append(work / f"{path.stem}.jsonl.zst")
            variants["jsonl.zst"][-1].write_bytes(zstandard.ZstdCompressor(level=3).compress(path.read_bytes()))
    rates = {}
    for name, files in variants.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            sum(1 for _ in iter_documents([str(f) for f in files], id_field="id"))
            best = min(best, time.perf_counter() - start)
        rates[name] = raw / best
        ratio = raw / (sum(f.stat().st_size for f in files) / 1e6)
        print(f"reading {name} (compression {ratio:.1f}x), 1 process: {rates[name]:.0f} MB/s/core of jsonl")
    return rates


def run_ray(records: list[Any], paths: list[Path], workers: int, read_by: str) -> tuple[float, list[dict[str, Any]]]:
    """The pipeline's own scan stream (``pipeline/corpus_scan.matched_stream``: a pool of ``workers`` match
    actors, reading their own files or fed by Ray Data read tasks) -> the driver, which folds what the actors
    folded as it arrives (``corpus_scan.fold_stream``, as a corpus pass does); (wall seconds, folded rows)."""
    import ray

    from contamray.pipeline.corpus_scan import fold_stream, matched_stream

    method, params, cfg = scan_method()
    index = ray.put(method.build_index(records, cfg))
    start = time.perf_counter()
    matched = matched_stream(
        [str(p) for p in paths], {"format": "jsonl", "id_field": "id"},
        [("bench", "gpt3_13gram", "ngram_overlap", params, index)], workers, workers, read_by=read_by,
        batch_docs=BATCH, placement={}, sizes=[p.stat().st_size for p in paths],
    )  # fmt: skip
    folded = fold_stream(matched, {"bench": (method, cfg)})
    rows = folded.folds["bench"].rows()
    return time.perf_counter() - start, rows


def scan_method() -> tuple[Any, dict[str, Any], Any]:
    from contamray.methods.base import get_method

    method = get_method("ngram_overlap")
    params = {"n": 13}
    return method, params, method.make_config(params)


def run_streaming(records: list[Any], paths: list[Path]) -> tuple[float, list[dict[str, Any]]]:
    """Seconds of the same scan in one process, end to end, doing exactly the work of the match actors and the
    driver without Ray: the files read with the corpus readers, matched in batches of ``BATCH`` documents and
    folded (``pipeline.actors.scan_files``, what a ``FileMatchWorker`` runs on its files), its output folded as
    the driver folds the actors' (``corpus_scan.fold_stream``); (seconds, folded rows) - the rows must equal
    the Ray scan's."""
    from contamray.pipeline.actors import Scanner, match_output, scan_files
    from contamray.pipeline.corpus_scan import DEFAULT_BATCH_BYTES, fold_stream

    method, _, cfg = scan_method()
    scanner = Scanner([("bench", method, cfg, method.build_index(records, cfg))], DEFAULT_BATCH_BYTES)
    read = {"format": "jsonl", "text_field": "text", "id_field": "id"}
    start = time.perf_counter()
    scanned = (match_output(bad, results) for bad, results in scan_files(scanner, [str(p) for p in paths], read, BATCH))
    rows = fold_stream(scanned, {"bench": (method, cfg)}).folds["bench"].rows()
    return time.perf_counter() - start, rows


def child_result(*args: str) -> dict[str, float]:
    """Run this script as a child (a fresh process: its memory is its own) and read its JSON result."""
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def child_scan(paths: list[str], mirror: Path) -> None:
    from contamray.corpus import iter_documents
    from contamray.methods.base import get_method

    method = get_method("ngram_overlap")
    cfg = method.make_config({"n": 13})
    index = method.build_index(benchmark_records(mirror), cfg)
    before = peak = rss_mb()
    batch, n_matches = [], 0
    for doc in iter_documents(paths, id_field="id"):
        batch.append(doc)
        if len(batch) == BATCH:
            n_matches += len(method.match(batch, index, cfg))
            batch = []
            peak = max(peak, rss_mb())
    n_matches += len(method.match(batch, index, cfg)) if batch else 0
    peak = max(peak, rss_mb())
    print(
        json.dumps(
            {
                "before": before,
                "peak": peak,
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def child_reference(package: Path, paths: list[str], mirror: Path) -> None:
    module, clean = load_reference(package)
    texts = corpus_texts([Path(p) for p in paths])
    before = rss_mb()
    module.build_ngrams(texts, 13, clean)
    print(json.dumps({"before": before, "peak": rss_mb()}))


# --------------------------------------------------------------------------- the driver under contamination

RSS_SHARD_DOCS = 250
RSS_COPIES = 100


def build_copies_corpus(mirror: Path, items: list[Any], copies: int, slots: int, docs: int, folder: Path) -> list[Path]:
    """jsonl shards of ``docs`` mirrored documents (XSum, then AG News, IMDB, SAMSum: the mirror holds 1,000
    XSum articles); each of ``items`` is appended to ``slots`` distinct documents, verbatim in ``copies`` of
    them and with its words shuffled (same bytes, no 13-gram in common) in the rest. Corpora built with the
    same ``slots`` hold the same documents and bytes whatever ``copies``."""
    texts: list[str] = []
    for rel, field in SOURCES:
        with open(mirror / rel, encoding="utf-8") as fh:
            texts += [json.loads(line)[field] for _, line in zip(range(docs - len(texts)), fh)]
    rng = random.Random(1)
    for record in items:
        words = f"{record.input} {record.label}".split()
        for copy, i in enumerate(rng.sample(range(len(texts)), slots)):
            planted = words if copy < copies else rng.sample(words, len(words))
            texts[i] = f"{texts[i]}\n{' '.join(planted)}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for start in range(0, len(texts), RSS_SHARD_DOCS):
        path = folder / f"shard{start // RSS_SHARD_DOCS:03d}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i, text in enumerate(texts[start : start + RSS_SHARD_DOCS]):
                f.write(json.dumps({"id": str(start + i), "text": text}) + "\n")
        paths.append(path)
    return paths


def rss_items(mirror: Path, n: int) -> list[Any]:
    """The driver test's benchmark: the first ``n`` GSM8K test rows."""
    from contamray.benchmarks import load_records

    return load_records("gsm8k", mirror_dir=mirror, n=None).records[:n]


def peak_rss_mb() -> float:
    """This process' peak RSS in MB: ``VmHWM`` of /proc/self/status where there is one. Not ``ru_maxrss``:
    Linux carries a parent's high-water mark into a child across fork + exec, and this script's parent
    is bigger than the driver it measures."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_driver(paths: list[str], mirror: Path, n_items: int, store: Path) -> None:
    """The pipeline's scan (``pipeline/corpus_scan.scan_corpus``: passes of 4 files, read_corpus ->
    MatchWorker pool of 1..2 actors folding per batch -> this driver folding what arrives -> the result
    store) in this fresh process, the scan's driver; its peak RSS and what it folded."""
    import ray

    from contamray.pipeline.corpus_scan import scan_corpus
    from contamray.pipeline.plan import Cell, MethodPlan, Plan
    from contamray.pipeline.store import ResultStore

    items = rss_items(mirror, n_items)
    settings = {"match_concurrency": 1, "match_concurrency_max": 2, "corpus_files_per_pass": 4}
    plan = Plan(
        models={},
        benchmarks={},
        methods={"ngram13": MethodPlan("ngram13", "ngram_overlap", {"n": 13})},  # uncapped: a row per copy
        corpus={"kind": "files", "paths": paths, "format": "jsonl", "text_field": "text", "id_field": "id"},
        judge=None,
        reference_model=None,
        seed=0,
        data={},
        ray=settings,
    )
    cell = Cell("bench", "gsm8k", "ngram13", "open")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        before = peak_rss_mb()
        result = scan_corpus(plan, [cell], {"gsm8k": items}, plan.corpus, ResultStore(store))
        peak = peak_rss_mb()
    finally:
        ray.shutdown()
    rows = result.matches[cell.key]
    docs = sum(int(r.get("n_docs", 0) or 0) for r in rows)
    print(json.dumps({"before": before, "peak": peak, "rows": len(rows), "docs": docs, "passes": result.scanned}))


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=str(ROOT.parent / "shared" / "benchmarks"))
    parser.add_argument("--scan-copies", type=int, default=40, help="copies of the corpus the Ray scan rates "
                        "are measured on (against 1 copy: the difference excludes start-up)")
    parser.add_argument("--mb", type=float, default=4.7, help="corpus size in MB (the issue's 4.7; --mb 1: quick)")
    parser.add_argument("--venv", default="/tmp/llmsanitize-venv")
    parser.add_argument("--datatrove-venv", default="/tmp/datatrove-venv")
    parser.add_argument("--rss-items", type=int, default=200, help="GSM8K rows of the driver-memory test")
    parser.add_argument("--rss-docs", type=int, default=2000, help="documents of the driver-memory corpus")
    parser.add_argument("--rss-copies", type=int, default=RSS_COPIES, help="copies of each row in its dirty corpus")
    parser.add_argument("--ray-only", action="store_true",
                        help="only the Ray scan rates and ray_scan_efficiency (no reference tools, no memory runs)")
    parser.add_argument("--rss-only", action="store_true",
                        help="only driver_rss_ratio_<copies>x_matches (the driver's memory under contamination)")
    parser.add_argument("--child-scan", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-reference", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-datatrove", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-driver", default="", help=argparse.SUPPRESS)
    parser.add_argument("--items", default="", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    mirror = Path(args.mirror)
    if args.child_scan:
        return child_scan(args.paths, mirror)
    if args.child_reference:
        return child_reference(Path(args.child_reference), args.paths, mirror)
    if args.child_datatrove:
        return child_datatrove(args.paths, Path(args.items), args.child_datatrove)
    if args.child_driver:
        return child_driver(args.paths, mirror, args.rss_items, Path(args.child_driver))

    work = Path(tempfile.mkdtemp(prefix="contamray-bench-"))
    try:
        run(mirror, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(mirror: Path, args: argparse.Namespace, work: Path) -> None:
    """The whole benchmark (see the module docstring); corpus files go under ``work``."""
    if args.rss_only:
        print(f"driver_rss_ratio_{args.rss_copies}x_matches: {driver_rss(mirror, args, work):.3f}")
        return
    records = benchmark_records(mirror)
    paths, planted = build_corpus(mirror, records, args.mb, work / "x1", copies=1)
    paths10, _ = build_corpus(mirror, records, args.mb, work / "x10", copies=10)

    def scaled() -> list[Path]:
        return build_corpus(mirror, records, args.mb, work / "scan", copies=args.scan_copies)[0]

    texts = corpus_texts(paths)
    mb = megabytes(texts)
    docs = [{"doc_id": str(i), "text": t} for i, t in enumerate(texts)]
    if args.ray_only:
        rate = mb / min(run_contamray(records, docs)[0] for _ in range(3))
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; corpus {mb:.2f} MB, "
              f"{len(paths)} shards; contamray match only, 1 process: {rate:.1f} MB/s/core")  # fmt: skip
        rates, stream_rate = ray_scaling(records, paths, scaled(), mb)
        print(f"ray_scan_efficiency_vs_match_only: {rates['actors', 2] / (2 * rate):.2f}")
        print(f"ray_scan_efficiency: {rates['actors', 2] / (2 * stream_rate):.2f}")
        return
    eval_texts = [f"{r.input} {r.label}" for r in records]
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
        "(other work shares the cores)"
    )
    print(
        f"corpus: {mb:.2f} MB in {len(texts)} documents ({len(paths)} jsonl shards); "
        f"10x copy: {10 * mb:.1f} MB"
    )
    print(
        f"benchmark side: {len(records)} examples "
        "(gsm8k, arc_challenge, mmlu, truthfulqa_gen test/validation)"
    )

    package = ensure_llmsanitize(Path(args.venv))
    module, clean = load_reference(package)
    ref_corpus, ref_bench, ref_dirty = run_reference(module, clean, texts, eval_texts)
    ref_rate = mb / ref_corpus
    print(
        f"llmsanitize, 13-grams, 1 process: corpus pass (build_ngrams) {ref_corpus:.2f} s -> "
        f"{ref_rate:.2f} MB/s/core; "
        f"benchmark pass (overlap_ngrams) {ref_bench:.2f} s; {ref_dirty} examples with a collision"
    )
    runs = [run_contamray(records, docs) for _ in range(3)]
    corpus_s = min(r[0] for r in runs)
    bench_s = min(r[1] for r in runs)
    _, _, dirty, n_grams, found = runs[0]
    rate = mb / corpus_s
    print(
        f"contamray ngram_overlap n=13, 1 process (best of 3): corpus pass (match, batches of {BATCH}) "
        f"{corpus_s:.3f} s -> {rate:.1f} MB/s/core; benchmark pass (build_index + score) {bench_s:.2f} s; "
        f"{dirty} contaminated examples; index {n_grams} 13-grams"
    )
    print(
        f"end to end on this corpus: llmsanitize {ref_corpus + ref_bench:.2f} s, "
        f"contamray {corpus_s + bench_s:.2f} s ({(ref_corpus + ref_bench) / (corpus_s + bench_s):.1f}x); "
        "the benchmark pass is paid once, the corpus "
        "pass grows with the corpus"
    )
    (work / "compressed").mkdir()
    reader_rates(paths, work / "compressed")
    datatrove_rate = compare_datatrove(Path(args.datatrove_venv), records, paths, mb, work, found, planted)

    rates, stream_rate = ray_scaling(records, paths, scaled(), mb)
    print(f"ratio_vs_llmsanitize_per_worker_through_ray: {rates['actors', 1] / ref_rate:.1f}x")

    one = child_result("--child-scan", "--mirror", str(mirror), *map(str, paths))
    ten = child_result("--child-scan", "--mirror", str(mirror), *map(str, paths10))
    print(
        f"streaming contamray scan, RSS after building the index -> peak while scanning: 1x corpus "
        f"{one['before']:.0f} -> {one['peak']:.0f} MB, 10x corpus {ten['before']:.0f} -> {ten['peak']:.0f} MB"
    )
    ref = child_result("--child-reference", str(package), "--mirror", str(mirror), *map(str, paths))
    print(
        f"llmsanitize build_ngrams on the 1x corpus, RSS before -> after: "
        f"{ref['before']:.0f} -> {ref['peak']:.0f} MB "
        "(every corpus 13-gram in a dict: grows with the corpus)"
    )
    rss_ratio = driver_rss(mirror, args, work)

    print(f"ratio_vs_llmsanitize_per_core: {rate / ref_rate:.1f}x")
    print(f"ratio_vs_datatrove_per_core: {rate / datatrove_rate:.1f}x")
    print(f"driver_rss_ratio_{args.rss_copies}x_matches: {rss_ratio:.3f}")
    # the figure: 2 workers (actors reading their own files, the default) over twice one process; one
    # process either matching documents already in memory (as the issue measured it) or reading them too, as
    # every Ray worker does
    print(f"ray_scan_efficiency_vs_match_only: {rates['actors', 2] / (2 * rate):.2f}")
    print(f"ray_scan_efficiency: {rates['actors', 2] / (2 * stream_rate):.2f}")


def ray_scaling(
    records: list[Any], paths: list[Path], many: list[Path], mb: float
) -> tuple[dict[tuple[str, int], float], float]:
    """Scan rates through Ray (MB/s after start-up) by reader (actors, tasks) and worker count (1, 2), and the
    one-process end-to-end rate (read + match) they are compared with."""
    import ray

    # the baseline scans the same many-copies corpus as the Ray runs (a 1x pass takes a quarter second: too
    # short to time), doing what the match actors and the driver do (``run_streaming``)
    copies = len(many) // len(paths)
    runs = [run_streaming(records, many) for _ in range(2)]
    streaming, expected = min(t for t, _ in runs), runs[0][1]
    stream_rate = copies * mb / streaming
    print(f"contamray, 1 process end to end (read jsonl + match + fold, the match actors' and the driver's work "
          f"without Ray), {copies}x corpus, best of 2: {streaming:.2f} s -> {stream_rate:.1f} MB/s/core")  # fmt: skip
    # one logical CPU more than match workers: the read tasks of read_by=tasks take a quarter CPU each
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    rates: dict[tuple[str, int], float] = {}
    try:
        for read_by in ("actors", "tasks"):
            for workers in (1, 2):
                run_ray(records, many[: len(paths)], workers, read_by)  # warm-up: imports, worker processes
                t1 = min(run_ray(records, many[: len(paths)], workers, read_by)[0] for _ in range(2))
                scans = [run_ray(records, many, workers, read_by) for _ in range(2)]
                if any(rows != expected for _, rows in scans):  # the same work: the same folded rows
                    raise SystemExit(f"read_by={read_by}, {workers} worker(s): the Ray scan's folded rows differ "
                                     "from the one-process scan's")  # fmt: skip
                tn, n = min(t for t, _ in scans), len(expected)
                # start-up (actor processes, index fetch, the first file) is paid once per run whatever
                # the corpus size; the scan rate is what the other copies add
                rate_w = rates[read_by, workers] = (copies - 1) * mb / max(tn - t1, 1e-9)
                print(
                    f"contamray via Ray (read_by={read_by}: matched_stream -> driver), {workers} worker(s): "
                    f"1x corpus {t1:.2f} s, {copies}x corpus {tn:.2f} s ({n} folded rows, as the 1-process scan's) -> "
                    f"scan rate after start-up {rate_w:.1f} MB/s ({rate_w / workers:.1f} MB/s per worker); "
                    f"start-up about {t1 - mb / rate_w:.1f} s per run"
                )
            print(
                f"read_by={read_by}: scaling 1 -> 2 workers (scan rate) {rates[read_by, 2] / rates[read_by, 1]:.2f}x "
                "(2 physical cores shared by the workers, the driver and any read tasks); "
                f"2 workers over 2 x the 1-process end-to-end rate: {rates[read_by, 2] / (2 * stream_rate):.2f}"
            )
    finally:
        ray.shutdown()
    return rates, stream_rate


def compare_datatrove(
    venv: Path,
    records: list[Any],
    paths: list[Path],
    mb: float,
    work: Path,
    found: set[str],
    planted: dict[str, list[Any]],
) -> float:
    """datatrove's index + filter on the same corpus and items, in its venv (spaCy's word tokenizer, then
    a whitespace one); prints both and which documents each flags; returns its spaCy MB/s."""
    python = ensure_datatrove(venv)
    items = work / "items.jsonl"
    with open(items, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({"id": r.id, "input": r.input, "label": str(r.label)}) + "\n")
    spacy_rate = 0.0
    for tokenizer in ("spacy", "whitespace"):
        out = run_datatrove(python, paths, items, tokenizer)
        removed = set(out["removed"])
        rate = mb / out["filter_s"]
        spacy_rate = spacy_rate or rate
        print(
            f"{DATATROVE} NGramsDecontFilter, 13-grams, input + label + overlap n-grams, {tokenizer} word "
            f"tokenizer{' (blank English model, no download)' if tokenizer == 'spacy' else ''}, 1 process: "
            f"corpus pass (filter) {out['filter_s']:.2f} s -> {rate:.2f} MB/s/core; index build + load "
            f"{out['index_s']:.2f} s; {len(removed)} of {out['docs']} documents removed"
        )
        # contamray matches an item shorter than 13 words whole (GPT-3's rule, 8 words at least); datatrove
        # makes no 13-gram of it: those documents are the difference the comparison expects
        short = {d for d in found - removed if all(len(f"{r.input} {r.label}".split()) < 13 for r in planted[d])}
        print(
            f"  planted documents found: contamray {len(found & planted.keys())}/{len(planted)}, datatrove "
            f"{len(removed & planted.keys())}/{len(planted)}; other documents flagged: contamray "
            f"{len(found - planted.keys())}, datatrove {len(removed - planted.keys())}; same documents: "
            f"{found == removed}; datatrove's within contamray's: {removed <= found}; contamray's others "
            f"{len(found - removed)}, of which {len(short)} hold only items shorter than 13 words (matched whole)"
        )
    return spacy_rate


def driver_rss(mirror: Path, args: argparse.Namespace, work: Path) -> float:
    """The driver's peak RSS scanning the corpus with every item copied ``--rss-copies`` times over the
    same-size corpus with one copy each (``child_driver``, a fresh process each); prints both."""
    items = rss_items(mirror, args.rss_items)
    peaks = {}
    for copies in (1, args.rss_copies):
        folder = work / f"rss-{copies}"
        paths = build_copies_corpus(mirror, items, copies, args.rss_copies, args.rss_docs, folder / "corpus")
        size = sum(p.stat().st_size for p in paths) / 1e6
        out = child_result(
            "--child-driver", str(folder / "store"), "--mirror", str(mirror), "--rss-items", str(args.rss_items),
            *map(str, paths),
        )  # fmt: skip
        peaks[copies] = out["peak"]
        print(
            f"driver of pipeline/corpus_scan.py (1..2 match actors, {out['passes']} pass(es)), {len(items)} GSM8K "
            f"rows each verbatim in {copies} of {args.rss_docs} documents ({size:.1f} MB): peak RSS "
            f"{out['before']:.0f} MB before the scan -> {out['peak']:.0f} MB after; {out['rows']} folded rows, "
            f"{out['docs']} (example, document) matches"
        )
    return peaks[args.rss_copies] / peaks[1]


if __name__ == "__main__":
    main()
