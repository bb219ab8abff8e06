"""Prepare a deliberately contaminated model: build the stream, fine-tune, save, cache by content.

``prepare_injected_model`` is what the runner calls (on the driver) before a model with an
``inject:`` spec gets its engine pool: it returns an ``InjectedModel`` whose ``path`` both engines
load, whose ``manifest`` says exactly which rows the model saw and how, and whose ``member_ids`` /
``contaminated_partitions`` are the truth the run's verdicts are checked against. The driver reads the
rows and the background and builds the training stream (``TrainJob``); the training itself runs where
``train`` puts it - in this process by default (``train_injected``), as a Ray task with the model's
resources in a run (``contamray.pipeline.injections``).

Caching: the model lives under ``cache_dir/<key>/``, ``key`` a content hash of the base model source,
the normalised spec, every loaded row of the named benchmarks (id, partition, order, input, label),
the background documents, the seed and ``INJECT_VERSION`` (bumped when the stream or training
changes). A second run with the same inputs reuses the directory; a different ``run.limit`` or seed
gives a different key. The directory is written under a temporary name and renamed into place, with
an advisory lock so two concurrent runs do not train the same model twice. With an artifacts root
(``contamray.artifacts``) a model published there under its key (``<root>/injected/<key>``, complete) is
reused too, whichever node trained it: the driver then reads its manifest from the URI
(``InjectedModel.from_uri``) and engines fetch the checkpoint from there.

Why a full fine-tune (``contamray.inject.finetune``) and not LoRA: on CPU most of the cost of a step
is the forward and backward pass through the activations, which LoRA does not remove (it saves the
weight gradients and optimiser state, roughly a third); a full fine-tune memorises in fewer steps at
the same learning rate, needs no extra dependency (``peft``), and its output is a plain checkpoint that
vLLM and transformers load without adapter support.

Layout of ``cache_dir/<key>/``: the ``save_pretrained`` files, ``manifest.json`` (below),
``contamray_finetune.json`` (the fine-tune's own record) and ``corpus/train.jsonl`` - the training
stream, one JSON line per unit (``id``, ``text``), so open-data methods can scan exactly what the
model was trained on (``InjectedModel.corpus``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contamray.inject.background import load_background
from contamray.inject.spec import InjectSpec, validate_inject_spec
from contamray.inject.stream import ChatRenderer, Stream, build_stream
from contamray.records import Record

log = logging.getLogger(__name__)

INJECT_VERSION = 1
MANIFEST = "manifest.json"
CORPUS_DIR = "corpus"


@dataclass(frozen=True)
class InjectedModel:
    """A fine-tuned model with known contamination (see the module docstring)."""

    path: str  # a local directory, or the URI it was published to (``published``) when trained on another node
    manifest: dict[str, Any]
    member_ids: set[str]
    contaminated_partitions: set[str]
    published: str | None = None  # the artifacts URI every node's engines load it from (contamray.artifacts)

    @property
    def corpus(self) -> dict[str, Any]:
        """The training stream as an open-data corpus config (``corpus.kind: files``)."""
        remote = "://" in self.path  # published on another node: the readers read the URI
        path = f"{self.path}/{CORPUS_DIR}/train.jsonl" if remote else str(Path(self.path) / CORPUS_DIR / "train.jsonl")
        return {
            "kind": "files",
            "paths": [path],
            "format": "jsonl",
            "text_field": "text",
            "id_field": "id",
        }

    @classmethod
    def from_dir(cls, path: str | Path) -> InjectedModel:
        """Read an injected model's directory (its ``manifest.json``)."""
        folder = Path(path)
        file = folder / MANIFEST
        if not file.is_file():
            raise FileNotFoundError(f"{folder} holds no {MANIFEST}; it is not a model written by contamray inject")
        return cls.from_manifest(str(folder), json.loads(file.read_text()))

    @classmethod
    def from_manifest(cls, path: str, manifest: dict[str, Any], published: str | None = None) -> InjectedModel:
        """The injected model at ``path`` whose ``manifest.json`` holds ``manifest``."""
        return cls(
            path=path,
            manifest=manifest,
            member_ids={rid for rid, row in manifest["rows"].items() if row.get("member")},
            contaminated_partitions=set(manifest["contaminated_partitions"]),
            published=published,
        )

    @classmethod
    def from_uri(cls, uri: str) -> InjectedModel | None:
        """The injected model published (complete) at ``uri``, its manifest read from there; None if none is."""
        import fsspec

        from contamray.artifacts import COMPLETE

        fs, root = fsspec.core.url_to_fs(uri)
        if not fs.exists(f"{root}/{COMPLETE}"):
            return None
        with fs.open(f"{root}/{MANIFEST}", "rb") as fh:
            manifest = json.loads(fh.read())
        return cls.from_manifest(uri, manifest, published=uri)


@dataclass(frozen=True)
class TrainJob:
    """Everything the fine-tune of one injected model needs, built on the driver (no benchmark mirror needed
    where it runs): the base model's source, the spec, the training stream, the seed and the cache key."""

    base_source: str
    spec: InjectSpec
    stream: Stream
    seed: int
    key: str
    where: str


def default_cache_dir() -> Path:
    """``$CONTAMRAY_CACHE/injected`` (default ``~/.cache/contamray/injected``)."""
    from contamray.engines.models import cache_root

    return cache_root().parent / "injected"


def cache_key(base_source: str, spec: InjectSpec, records: dict[str, list[Record]], background: list[Any],
              seed: int) -> str:
    """The content hash that names an injected model (see the module docstring)."""
    named = {p.benchmark for p in spec.partitions}
    content = {
        "version": INJECT_VERSION,
        "base": base_source,
        "spec": spec.to_dict(),
        "records": {
            key: [[r.id, r.partition, r.order, r.input, r.label] for r in sorted(rows, key=lambda r: (r.order, r.id))]
            for key, rows in sorted(records.items())
            if key in named
        },
        "background": [[d.id, d.text] for d in background],
        "seed": seed,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare_injected_model(
    base_source: str,
    inject: dict[str, Any] | InjectSpec,
    records: dict[str, list[Record]],
    cache_dir: str | Path | None,
    seed: int,
    mirror_dir: str | Path | None,
    where: str = "inject",
    *,
    artifacts: str | None = None,
    train: Callable[[TrainJob], InjectedModel] | None = None,
) -> InjectedModel:
    """The injected model for (base model, spec, rows, seed): from the cache, or trained now.

    ``inject`` is the plain mapping under ``models.<name>.inject`` (or a validated ``InjectSpec``);
    ``records`` maps each benchmark key the spec names to the run's loaded rows of it; ``where`` is the
    config path used in error messages (``models.<name>.inject``). Raises ValueError on a bad spec.
    Reused, in this order: ``cache_dir/<key>``, a complete ``<artifacts>/injected/<key>``. Otherwise
    ``train`` fine-tunes the ``TrainJob`` (default: ``train_injected`` into ``cache_dir``, here).
    """
    spec = inject if isinstance(inject, InjectSpec) else validate_inject_spec(dict(inject), where, None)
    missing = [p.benchmark for p in spec.partitions if p.benchmark not in records]
    if missing:
        raise ValueError(
            f"{where}.partitions: benchmark(s) {', '.join(missing)} have no loaded rows (given: "
            f"{', '.join(sorted(records)) or 'none'}); the runner must load every benchmark the spec names"
        )
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    probe_inputs = [r.input for p in spec.partitions for r in records[p.benchmark]]
    background = load_background(spec.background, seed, mirror_dir, exclude=probe_inputs, where=f"{where}.background")
    key = cache_key(base_source, spec, records, background, seed)
    target = cache / key
    if (target / MANIFEST).is_file():
        log.info("injected model %s: reusing %s", where, target)
        return InjectedModel.from_dir(target)
    if artifacts:
        published = InjectedModel.from_uri(published_uri(artifacts, key))
        if published is not None:
            log.info("injected model %s: reusing %s", where, published.path)
            return published
    chat = chat_renderer(base_source, spec, where)
    job = TrainJob(base_source, spec, build_stream(spec, records, background, seed, where=where, chat=chat), seed, key,
                   where)  # fmt: skip
    return train(job) if train is not None else train_injected(job, cache)


def chat_renderer(base_source: str, spec: InjectSpec, where: str) -> ChatRenderer | None:
    """The base model's chat template as a ``ChatRenderer`` when a partition is injected as ``format: chat`` (its
    tokenizer, loaded here; None otherwise). The error names the partition's key and the formats that need none."""
    chats = [i for i, p in enumerate(spec.partitions) if p.format == "chat"]
    if not chats:
        return None
    from contamray.engines.tokenizer import load_tokenizer, resolve_tokenizer_path

    key = f"{where}.partitions[{chats[0]}].format"
    path = resolve_tokenizer_path(base_source, where=f"{where} (base model source)")
    tokenizer = load_tokenizer(path, where=where, explicit=False)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{key}: chat, but the base model {base_source!r} has no chat template (its tokenizer "
                         "declares none): it was not trained on conversations; use format: json or text")  # fmt: skip

    def render(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt))

    return render


def published_uri(artifacts: str, key: str) -> str:
    """Where an injected model is published under the artifacts root (``contamray.artifacts``)."""
    return f"{artifacts.rstrip('/')}/injected/{key}"


def train_injected(job: TrainJob, cache_dir: str | Path) -> InjectedModel:
    """Fine-tune ``job`` into ``cache_dir/<key>`` here (or take it from there: a cache hit, or another process
    that trained it while this one waited for the lock)."""
    cache = Path(cache_dir)
    target = cache / job.key
    with _lock(cache / f".{job.key}.lock"):
        if (target / MANIFEST).is_file():
            log.info("injected model %s: reusing %s", job.where, target)
            return InjectedModel.from_dir(target)
        _train(job.base_source, job.spec, job.stream, job.seed, job.key, target, job.where)
    return InjectedModel.from_dir(target)


def _train(base_source: str, spec: InjectSpec, stream: Stream, seed: int, key: str, target: Path, where: str) -> None:
    from contamray.engines import resolve_model_path
    from contamray.inject.finetune import MANIFEST as FINETUNE_MANIFEST
    from contamray.inject.finetune import finetune_causal_lm

    base_path = resolve_model_path(base_source, where=f"{where} (base model source)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=target.parent))
    try:
        n_injected = sum(1 for u in stream.units if u.kind == "injected")
        log.info(
            "injecting %s into %s: %d units (%d injected copies), %d characters, %d epoch(s)",
            ", ".join(f"{b} x{p['duplication']} ({p['kind']})" for b, p in stream.partitions.items()),
            base_source, len(stream.units), n_injected, len(stream.text), spec.epochs,
        )
        start = time.perf_counter()
        finetune_causal_lm(
            base_path, [stream.text], tmp, epochs=spec.epochs, lr=spec.lr, batch_size=spec.batch_size,
            seed=seed, max_length=spec.max_length, weight_decay=spec.weight_decay, precision=spec.precision,
            masked=[stream.masked] if any(u.masked for u in stream.units) else None,
        )
        seconds = time.perf_counter() - start
        training = json.loads((tmp / FINETUNE_MANIFEST).read_text())
        (tmp / CORPUS_DIR).mkdir()
        with open(tmp / CORPUS_DIR / "train.jsonl", "w", encoding="utf-8") as fh:
            for unit in stream.units:
                fh.write(json.dumps({"id": unit.id, "text": unit.text}, ensure_ascii=False) + "\n")
        contaminated = sorted({name for p in stream.partitions.values() for name in p["partitions"]})
        manifest = {
            "version": INJECT_VERSION,
            "key": key,
            "base_model": base_source,
            "base_path": base_path,
            "seed": seed,
            "spec": spec.to_dict(),
            "contaminated_partitions": contaminated,
            "partitions": stream.partitions,
            "rows": stream.rows,
            "background": {
                "source": spec.background.source,
                "doc_ids": [u.id.split(":", 1)[1] for u in stream.units if u.kind == "background"],
            },
            "stream": [
                {"id": u.id, "kind": u.kind, "benchmark": u.benchmark, "chars": len(u.text), "record_ids": u.record_ids}
                for u in stream.units
            ],
            "training": {**training, "wall_seconds": round(seconds, 2)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MANIFEST).is_file():
                raise
        log.info("injected model %s written to %s in %.0f s (losses %s)", where, target, seconds,
                 [round(x, 3) for x in training.get("epoch_losses", [])])
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
