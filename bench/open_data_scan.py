"""Open-data scan benchmark: contamray's 13-gram scan against LLMSanitize's, per core, in one run.

What is measured (issue 4, "Benchmark"), on one machine and one corpus, in this one process run:

1. **Reference**: ntunlp/LLMSanitize's ``build_ngrams`` + ``overlap_ngrams`` (``utils/string_utils.py``)
   with its GPT-3 text cleaning (``clean_text_gpt3`` of ``open_data_methods/gpt3.py``), 13-grams,
   over the corpus and the benchmark. The package is installed with ``pip install llmsanitize
   --no-deps`` into a throwaway venv under /tmp and its two files are loaded by path (the package's
   ``__init__`` imports its whole model stack). Its ``word_tokenize`` needs nltk's punkt data, which
   cannot be downloaded here, so it runs as ``word_tokenize(text, preserve_line=True)`` — nltk's own
   tokenizer without the sentence splitter, i.e. *less* work than the real thing: the ratio is
   conservative. Its ``>= 10 documents`` deletion loop raises in Python 3 and is left out.
2. **contamray**: ``ngram_overlap`` with ``n=13`` — ``build_index`` on the benchmark, ``match`` over the
   corpus in batches of 256 documents, ``score`` — in one process (per-core throughput), then through
   Ray Data exactly as the pipeline runs it (``read_corpus`` -> ``MatchWorker`` actor pool ->
   the driver's fold, ``pipeline/corpus_scan.py``) with 1 and 2 workers (scaling). A Ray run pays a
   fixed start-up (worker processes, the index fetch, the first block) whatever the corpus size, so the
   scan rate is taken from the difference between the 10x and the 1x corpus (best of two runs each);
   both wall times are printed.
3. **Memory**: the peak RSS of a streaming scan (``iter_documents`` -> ``match``, in a fresh child
   process) on the corpus and on the corpus ten times over: flat, set by the benchmark index; and
   the reference's peak RSS, which holds every corpus n-gram in a dict.

The corpus is mirrored benchmark text (XSum articles, AG News, IMDB reviews, SAMSum dialogues) with
GSM8K and ARC items planted verbatim, written as jsonl shards. The last line is
``ratio_vs_llmsanitize_per_core: <x>x`` (contamray MB/s per core / LLMSanitize MB/s per core).

    python bench/open_data_scan.py --mirror ../shared/benchmarks [--mb 4.7] [--venv /tmp/llmsanitize-venv]
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


def build_corpus(mirror: Path, records: list[Any], target_mb: float, folder: Path, copies: int) -> list[Path]:
    """jsonl shards of mirrored text (~target_mb) with 200 benchmark items planted; ``copies`` times."""
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
    for record in rng.sample(records, 200):
        i = rng.randrange(len(texts))
        texts[i] = f"{texts[i]}\n{record.input}\n{record.label}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for copy in range(copies):
        for start in range(0, len(texts), SHARD_DOCS):
            path = folder / f"copy{copy:02d}-shard{start // SHARD_DOCS:03d}.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for i, text in enumerate(texts[start : start + SHARD_DOCS]):
                    f.write(json.dumps({"id": f"{copy}-{start + i}", "text": text}) + "\n")
            paths.append(path)
    return paths


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


# --------------------------------------------------------------------------- contamray


def run_contamray(records: list[Any], docs: list[dict[str, str]]) -> tuple[float, float, int, int]:
    """(corpus pass seconds: ``match`` over every batch, benchmark pass seconds: ``build_index`` +
    ``score``, contaminated examples, indexed n-grams)."""
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
    return t2 - t1, (t1 - t0) + (t3 - t2), sum(r["contaminated"] for r in rows), index.n_grams


def run_ray(records: list[Any], paths: list[Path], workers: int) -> tuple[float, int]:
    """The pipeline's own scan: read_corpus -> MatchWorker actor pool (``workers`` actors) -> the
    driver, which folds what the actors folded per batch; (wall seconds, folded match rows)."""
    import ray

    from contamray.corpus import read_corpus
    from contamray.methods.base import get_method
    from contamray.pipeline.actors import MatchWorker
    from contamray.pipeline.corpus_scan import match_batches

    method = get_method("ngram_overlap")
    params = {"n": 13}
    index = ray.put(method.build_index(records, method.make_config(params)))
    start = time.perf_counter()
    dataset = read_corpus([str(p) for p in paths], id_field="id", override_num_blocks=max(4, 2 * workers))
    matched = dataset.map_batches(
        MatchWorker,
        fn_constructor_kwargs={"indexes": [("bench", "gpt3_13gram", "ngram_overlap", params, index)]},
        compute=ray.data.ActorPoolStrategy(size=workers),
        batch_size=BATCH,
        batch_format="numpy",
        num_cpus=1,
    )
    batches = matched.iter_batches(batch_format="numpy", batch_size=None)
    rows = [r for _, part, _ in match_batches(batches) for r in part]
    folded = method.fold(rows, method.make_config(params))
    return time.perf_counter() - start, len(folded)


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


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=str(ROOT.parent / "shared" / "benchmarks"))
    parser.add_argument("--mb", type=float, default=4.7, help="corpus size in MB (the issue's 4.7)")
    parser.add_argument("--venv", default="/tmp/llmsanitize-venv")
    parser.add_argument("--child-scan", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-reference", default="", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    mirror = Path(args.mirror)
    if args.child_scan:
        return child_scan(args.paths, mirror)
    if args.child_reference:
        return child_reference(Path(args.child_reference), args.paths, mirror)

    work = Path(tempfile.mkdtemp(prefix="contamray-bench-"))
    try:
        run(mirror, Path(args.venv), args.mb, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(mirror: Path, venv: Path, target_mb: float, work: Path) -> None:
    """The whole benchmark (see the module docstring); corpus files go under ``work``."""
    records = benchmark_records(mirror)
    paths = build_corpus(mirror, records, target_mb, work / "x1", copies=1)
    paths10 = build_corpus(mirror, records, target_mb, work / "x10", copies=10)
    texts = corpus_texts(paths)
    mb = megabytes(texts)
    docs = [{"doc_id": str(i), "text": t} for i, t in enumerate(texts)]
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

    package = ensure_llmsanitize(venv)
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
    _, _, dirty, n_grams = runs[0]
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

    import ray

    # one logical CPU more than match workers: with every CPU held by a MatchWorker actor, Ray Data's
    # read tasks (1 CPU each) could never be scheduled and the scan would wait forever
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        rates = {}
        for workers in (1, 2):
            run_ray(records, paths10[: len(paths)], workers)  # warm-up: imports, worker processes
            t1 = min(run_ray(records, paths10[: len(paths)], workers)[0] for _ in range(2))
            t10, n = min(run_ray(records, paths10, workers) for _ in range(2))
            # start-up (actor processes, index fetch, the first block) is paid once per run whatever
            # the corpus size; the scan rate is what the other 9 copies add
            rates[workers] = 9 * mb / max(t10 - t1, 1e-9)
            print(
                f"contamray via Ray Data (read_corpus -> MatchWorker -> driver), {workers} worker(s): "
                f"1x corpus {t1:.2f} s, 10x corpus {t10:.2f} s ({n} match rows) -> "
                f"scan rate after start-up {rates[workers]:.1f} MB/s "
                f"({rates[workers] / workers:.1f} MB/s per worker); "
                f"start-up about {t1 - mb / rates[workers]:.1f} s per run"
            )
        print(
            f"scaling 1 -> 2 workers (scan rate): {rates[2] / rates[1]:.2f}x "
            "(2 physical cores shared by the read tasks, the driver and the workers)"
        )
        print(f"ratio_vs_llmsanitize_per_worker_through_ray: {rates[1] / ref_rate:.1f}x")
    finally:
        ray.shutdown()

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
    print(f"ratio_vs_llmsanitize_per_core: {rate / ref_rate:.1f}x")


if __name__ == "__main__":
    main()
