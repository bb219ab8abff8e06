"""An offline corpus with known contamination: filler documents with benchmark rows planted in them.

With no pretraining corpus at hand (CI, a laptop, the smoke run), open-data methods still need a
corpus whose truth is known. This builds one from a mirrored text dataset (XSum documents by default)
and plants a seeded subset of each benchmark partition's rows into it, in three ways:

- ``verbatim``: input and label, as a web page copying the benchmark with its answers would;
- ``input_only``: the question without its answer;
- ``near_miss``: input and label with every 5th word replaced, so no 8-gram of it survives — an
  exact-match method must not find it.

The manifest (``manifest.json``) records which row was planted how and in which document, so a run's
open-data verdicts can be checked against the truth.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from contamray.artifacts import content_digest, publish_dir
from contamray.records import Record

SHARDS = 4
NEAR_MISS_EVERY = 5


def prepare_corpus(
    plan: Any, records: dict[str, list[Record]], output_dir: Path, artifacts: str | None = None
) -> dict[str, Any]:
    """The corpus the plan scans: configured files as they are, or a planted corpus built now (in the run's
    folder, and published under ``artifacts`` when given, for read tasks on any node)."""
    corpus = dict(plan.corpus)
    kind = corpus.get("kind")
    if kind == "files":
        corpus["paths"] = configured_paths(corpus)
        return corpus
    if kind != "planted":
        raise ValueError(KIND_ERROR.format(kind=kind))
    from contamray.benchmarks import load_records

    filler = load_records(
        corpus.get("filler", "xsum"),
        n=int(corpus.get("filler_docs", 200)),
        seed=plan.seed,
        mirror_dir=plan.data.get("mirror_dir"),
        strict=False,
    ).records
    folder = Path(output_dir) / "corpus"
    paths, manifest = build_planted_corpus(
        records,
        [r.input for r in filler],
        folder,
        seed=plan.seed,
        planted_fraction=float(corpus.get("planted_fraction", 0.25)),
        near_miss_fraction=float(corpus.get("near_miss_fraction", 0.1)),
        clean=clean_benchmarks(corpus, records),
    )
    digest = content_digest(folder)
    if artifacts:
        uri = publish_dir(folder, f"{artifacts}/corpus/{digest}")
        paths = [f"{uri}/{Path(p).name}" for p in paths]
    return {"kind": "planted", "paths": paths, "format": "jsonl", "text_field": "text", "id_field": "id",
            "digest": digest}  # fmt: skip


KINDS = ("none", "files", "planted")
KIND_ERROR = ("corpus.kind: {kind!r} is not one of none, files (corpus=files corpus.paths=[...]: files on disk or in "
              "an object store), planted (corpus=planted: built at run time)")  # fmt: skip


def configured_paths(corpus: dict[str, Any]) -> list[str]:
    """``corpus.paths`` of a ``files`` corpus as a list. Raises ValueError with the fix when none is given."""
    paths = corpus.get("paths")
    if not paths or paths == "???":
        raise ValueError("corpus.paths: no corpus files given; set corpus.paths=[/data/*.jsonl.gz] (files, "
                         "directories, globs, fsspec URIs such as s3://bucket/corpus/*.parquet, or hub:// datasets)")
    return [paths] if isinstance(paths, str) else [str(p) for p in paths]


def check_corpus(corpus: dict[str, Any], benchmarks: Collection[str], scanned: bool) -> None:
    """What the plan checks of ``corpus`` before any work, so a typo stops the run in a second rather than after
    the benchmarks are loaded and Ray is up: its ``kind``; a planted corpus' filler dataset and ``clean`` keys
    (``benchmarks``: the run's keys); when open-data methods will ``scanned`` it, a files corpus' ``paths``, each
    resolved to at least one file (``fingerprint.file_listing``: one listing, no file read). Raises ValueError
    naming the key."""
    from contamray.benchmarks.registry import adapter_names
    from contamray.corpus.fingerprint import file_listing

    kind = corpus.get("kind", "none")
    if kind not in KINDS:
        raise ValueError(KIND_ERROR.format(kind=kind))
    if kind == "planted":
        filler = corpus.get("filler", "xsum")
        if filler not in adapter_names():
            raise ValueError(f"corpus.filler: {filler!r} is not a benchmark adapter; choices: "
                             f"{', '.join(adapter_names())}")  # fmt: skip
        clean_benchmarks(corpus, benchmarks)
    if kind == "files" and scanned:
        try:
            file_listing(configured_paths(corpus))
        except OSError as err:  # a path that does not exist, a glob that matches nothing, an unreachable store
            fix = "point corpus.paths at existing files, directories or globs"
            raise ValueError(f"corpus.paths: {str(err).removeprefix('corpus: ')}; {fix}") from None


def clean_benchmarks(corpus: dict[str, Any], benchmarks: Collection[str]) -> list[str]:
    """``corpus.clean``: benchmark keys left out of the corpus (their near-misses are still planted). Raises
    ValueError naming a key that is not one of ``benchmarks`` (the run's keys) and the choices."""
    clean = corpus.get("clean") or []
    clean = [clean] if isinstance(clean, str) else list(clean)
    unknown = sorted(set(clean) - set(benchmarks))
    if unknown:
        choices = ", ".join(sorted(benchmarks))
        raise ValueError(f"corpus.clean: {', '.join(unknown)} is not a benchmark of this run; choices: {choices}")
    return clean


def build_planted_corpus(
    records: dict[str, list[Record]],
    filler_texts: list[str],
    folder: Path,
    seed: int = 0,
    planted_fraction: float = 0.25,
    near_miss_fraction: float = 0.1,
    clean: Collection[str] = (),
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Write the corpus as jsonl shards under ``folder``; returns (paths, manifest by record id).

    Benchmarks in ``clean`` get no planted row, only their near-misses: the corpus holds nothing of
    them, so a method that flags them shows a false positive.
    """
    import random

    if not filler_texts:
        raise ValueError("planted corpus: the filler dataset gave no documents; check corpus.filler")
    rng = random.Random(f"planted|{seed}")
    docs = [{"id": f"filler-{i}", "text": text} for i, text in enumerate(filler_texts)]
    manifest: dict[str, dict[str, Any]] = {}
    for bench in sorted(records):
        rows = list(records[bench])
        rng.shuffle(rows)
        n_plant = 0 if bench in clean else round(len(rows) * planted_fraction)
        n_near = round(len(rows) * near_miss_fraction)
        chosen = rows[: n_plant + n_near]
        for i, record in enumerate(chosen):
            if i < n_plant:
                how = "verbatim" if i % 2 == 0 else "input_only"
            else:
                how = "near_miss"
            text = _planted_text(record, how, rng)
            host = rng.randrange(len(docs))
            doc = docs[host]
            # its own line between two lines of the host, as a copied paragraph sits in a web page
            # (spliced mid-sentence it would dilute passage embeddings, not n-grams)
            lines = doc["text"].split("\n")
            cut = rng.randrange(len(lines) + 1)
            doc["text"] = "\n".join(lines[:cut] + [text] + lines[cut:])
            manifest[record.id] = {"partition": record.partition, "how": how, "doc_id": doc["id"]}
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in range(SHARDS):
        path = folder / f"shard-{shard:03d}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for doc in docs[shard::SHARDS]:
                fh.write(json.dumps(doc) + "\n")
        paths.append(str(path))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return paths, manifest


def _planted_text(record: Record, how: str, rng: Any) -> str:
    if how == "input_only":
        return record.input
    text = f"{record.input} {record.label}"
    if how == "near_miss":
        words = text.split()
        for i in range(NEAR_MISS_EVERY - 1, len(words), NEAR_MISS_EVERY):
            words[i] = f"zq{rng.randrange(10**6)}"
        text = " ".join(words)
    return text
