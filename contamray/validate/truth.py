"""Attach the known truth to a finished run: per verdict ``truth``, per example ``member``, grid labels.

Closed-data cells (a model was probed): the runner writes ``truth`` (the partition was injected into
that model) into ``partitions.parquet`` and ``member`` (the row was trained on) into
``examples.parquet`` for models with an ``inject:`` spec; where those columns are absent (a model
without a spec, an older run), the truth follows from the run's resolved config: a model without a
spec has no injected partition, and a model with one has exactly the partitions its spec names.

Open-data cells (``corpus:<kind>``): the truth is the corpus's manifest, ``<run>/corpus/manifest.json``
(record id -> ``partition``, ``how``; written by the planted corpus and by
``contamray.inject.corpus.injected_corpus``): a row is in the corpus unless ``how`` is ``near_miss``
or ``not_injected``; a partition is contaminated when any of its rows is. A files corpus without a
manifest has no known truth (``truth`` stays empty and the cells are left out of the scores).

A cell whose own rows are labelled (``member`` per example: the runner's, or the corpus manifest's by record
id) takes its truth from them - contaminated when any of its rows is - since two benchmark keys may read one
split (a held-out after the tested rows, ``offset``) and only one of them holds the injected rows.

A method's own reference partitions (``methods.<label>.reference``, one key or a mapping benchmark ->
key: the known-unseen benchmarks its test compares against, e.g. Min-K%'s held-out) cannot be judged by
that method - each is a yardstick, never tested - so their truth is left empty there (``role:
reference``) and the scores skip them. A key with a held-out of its own (a chain: the reference of one
benchmark, tested against another) is tested by the runner and keeps its truth.

Every labelled verdict also carries its grid coordinates: ``duplication`` (copies of the partition in
the training stream), ``kind`` (``form/content/order``, e.g. ``verbatim/input_only/canonical``),
``family`` (closed/open) and ``benchmark`` (the adapter name, first element of the partition).

Caveat, stated wherever the numbers are shown: for public benchmarks "not injected" is not "clean" -
the base model may have seen them in pre-training. Only ``synthetic_facts`` is clean by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from contamray.pipeline.store import read_partitions
from contamray.records import benchmark_of

NOT_MEMBER = {"near_miss", "not_injected"}


@dataclass
class LabelledRun:
    output_dir: Path
    config: dict[str, Any]
    partitions: pd.DataFrame  # one row per verdict + truth, duplication, kind, family, benchmark
    examples: pd.DataFrame  # one row per example x method + member


def load_config(output_dir: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    file = output_dir / "config.yaml"
    if not file.is_file():
        raise FileNotFoundError(f"{output_dir} has no config.yaml; pass the output directory of a contamray run")
    container = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    assert isinstance(container, dict)
    return container


def benchmark_partitions(config: dict[str, Any]) -> dict[str, str]:
    """Benchmark key -> its partition id, as the loader names it (``benchmarks.partition_ids``)."""
    from contamray.benchmarks import partition_ids

    return partition_ids(config.get("benchmarks") or {})


def injections(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Model name -> {partition: {duplication, kind, fraction}} for every model with an inject spec."""
    from contamray.inject.spec import validate_inject_spec

    names = benchmark_partitions(config)
    out: dict[str, dict[str, Any]] = {}
    for model, spec in (config.get("models") or {}).items():
        inject = (spec or {}).get("inject")
        if not inject:
            out[model] = {}
            continue
        parsed = validate_inject_spec(inject, f"models.{model}.inject", set(names))
        out[model] = {
            names[p.benchmark]: {"duplication": p.duplication * parsed.epochs, "kind": p.kind, "fraction": p.fraction}
            for p in parsed.partitions
        }
    return out


def reference_partitions(config: dict[str, Any]) -> dict[str, set[str]]:
    """Method label -> the partitions of its ``reference`` benchmarks (one key, or a mapping benchmark ->
    key), for methods that have one."""
    names = benchmark_partitions(config)
    return {label: {names[k] for k in keys if k in names} for label, keys in reference_keys(config).items()}


def reference_keys(config: dict[str, Any]) -> dict[str, set[str]]:
    """Method label -> the benchmark keys that are only its ``reference`` (one key, or a mapping benchmark ->
    key): yardsticks, never tested. A key mapped to a held-out of its own is tested even when it also serves as
    another's reference (a chain), as the runner files it (``Method.served_as_reference``). Keys, not
    partitions: a held-out may be other rows of the very split it is held out from (``offset``)."""
    from contamray.pipeline.heldouts import resolve_heldouts

    out = {}
    config, _ = resolve_heldouts(config)  # benchmarks.<key>.heldout: each held-out method's reference
    for label, spec in (config.get("methods") or {}).items():
        ref = (spec or {}).get("reference") if isinstance(spec, dict) else None
        given = list(ref.values()) if isinstance(ref, dict) else [ref] if ref else []
        tested = {k for k, v in ref.items() if v and v != k} if isinstance(ref, dict) else set()
        keys = {k for k in given if isinstance(k, str) and k not in tested}
        if keys:
            out[label] = keys
    return out


def corpus_truth(output_dir: Path) -> dict[str, dict[str, Any]] | None:
    """The open-data corpus's manifest (record id -> row truth), or None when the run has none."""
    file = output_dir / "corpus" / "manifest.json"
    if not file.is_file():
        return None
    manifest = json.loads(file.read_text())
    out = {}
    for rid, row in manifest.items():
        how = str(row.get("how", ""))
        member = bool(row.get("member", how not in NOT_MEMBER)) and how not in NOT_MEMBER
        dup = row.get("duplication", 1 if member else 0)
        out[str(rid)] = {"partition": row.get("partition", ""), "how": how, "member": member, "duplication": dup}
    return out


def _closed_labels(parts: pd.DataFrame, inj: dict[str, dict[str, Any]]) -> pd.DataFrame:
    truth, dup, kind = [], [], []
    for _, row in parts.iterrows():
        model_inj = inj.get(str(row["model"]))
        given = row.get("truth") if "truth" in parts.columns else None
        info = (model_inj or {}).get(str(row["partition"]))
        if given is not None and not pd.isna(given):
            truth.append(bool(given))
        elif model_inj is not None:
            truth.append(info is not None)
        else:
            truth.append(None)
        dup.append(info["duplication"] if info else 0)
        kind.append(info["kind"] if info else "clean")
    return parts.assign(truth=truth, duplication=dup, kind=kind)


def _open_labels(parts: pd.DataFrame, manifest: dict[str, dict[str, Any]] | None) -> pd.DataFrame:
    if manifest is None:
        return parts.assign(truth=None, duplication=0, kind="unknown")
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for row in manifest.values():
        if row["member"]:
            by_partition.setdefault(str(row["partition"]), []).append(row)
    truth, dup, kind = [], [], []
    for _, row in parts.iterrows():
        rows = by_partition.get(str(row["partition"]), [])
        truth.append(bool(rows))
        dup.append(max((int(r["duplication"]) for r in rows), default=0))
        hows = sorted({r["how"] for r in rows})
        kind.append(hows[0] if len(hows) == 1 else ("mixed: " + ", ".join(hows) if hows else "clean"))
    return parts.assign(truth=truth, duplication=dup, kind=kind)


def label_run(output_dir: str | Path) -> LabelledRun:
    """Read a finished run (``partitions.parquet``, ``examples.parquet``, ``config.yaml``) and label it."""
    folder = Path(output_dir)
    for name in ("partitions.parquet", "examples.parquet"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} has no {name}; pass the output directory of a finished contamray run")
    config = load_config(folder)
    parts = read_partitions(folder)
    examples = pd.read_parquet(folder / "examples.parquet")
    is_open = parts["model"].astype(str).str.startswith("corpus:")
    inj = injections(config)
    manifest = corpus_truth(folder)
    examples = _label_examples(examples, inj, manifest)
    examples["run"] = folder.name
    labelled = pd.concat(
        [_closed_labels(parts[~is_open], inj), _open_labels(parts[is_open], manifest)], ignore_index=False
    ).sort_index()
    labelled = _by_own_rows(labelled, examples)
    labelled["family"] = ["open" if o else "closed" for o in is_open]
    keys = labelled["benchmark"] if "benchmark" in labelled.columns else pd.Series([None] * len(labelled))
    labelled["benchmark"] = labelled["partition"].astype(str).map(benchmark_of)
    labelled["run"] = folder.name
    refs, ref_partitions = reference_keys(config), reference_partitions(config)
    is_ref = [
        str(k) in refs.get(str(m), set()) if isinstance(k, str) else str(p) in ref_partitions.get(str(m), set())
        for m, p, k in zip(labelled["method"], labelled["partition"], keys)
    ]
    labelled["role"] = ["reference" if r else "" for r in is_ref]
    labelled["truth"] = [None if r else t for r, t in zip(is_ref, labelled["truth"])]
    return LabelledRun(output_dir=folder, config=config, partitions=labelled, examples=examples)


def _by_own_rows(parts: pd.DataFrame, examples: pd.DataFrame) -> pd.DataFrame:
    """A cell's truth from its own rows where they are labelled (``member``): contaminated when any of them
    was trained on / is in the corpus. Two benchmark keys may read one split (a held-out after the tested rows,
    ``offset``), so what was injected into a *partition* does not say which of them holds the injected rows."""
    if "benchmark" not in parts.columns or "benchmark" not in examples.columns or examples.empty:
        return parts
    known = examples[examples["member"].notna()]
    member_of = known.groupby(["model", "method", "benchmark"])["member"].agg(lambda s: bool(s.astype(bool).any()))
    truth, dup, kind = list(parts["truth"]), list(parts["duplication"]), list(parts["kind"])
    cells = zip(parts["model"].astype(str), parts["method"].astype(str), parts["benchmark"].astype(str))
    for i, key in enumerate(cells):
        if key in member_of.index and truth[i] is not None:
            truth[i] = bool(member_of[key])
            if not truth[i]:
                dup[i], kind[i] = 0, "clean"
    return parts.assign(truth=truth, duplication=dup, kind=kind)


def _label_examples(
    examples: pd.DataFrame, inj: dict[str, dict[str, Any]], manifest: dict[str, dict[str, Any]] | None
) -> pd.DataFrame:
    if examples.empty:
        return examples.assign(member=pd.Series(dtype=object))
    given = examples["member"] if "member" in examples.columns else pd.Series([None] * len(examples))
    members = []
    for (model, partition, rid), known in zip(
        examples[["model", "partition", "record_id"]].itertuples(index=False, name=None), given
    ):
        model = str(model)
        if model.startswith("corpus:"):
            row = manifest.get(str(rid)) if manifest is not None else None
            members.append(None if manifest is None else bool(row and row["member"]))
        elif known is not None and not pd.isna(known):
            members.append(bool(known))
        elif model in inj:
            info = inj[model].get(str(partition))
            # without the runner's column only whole-partition injections are known row by row
            members.append(False if info is None else (True if info["fraction"] >= 1.0 else None))
        else:
            members.append(None)
    return examples.assign(member=members)
