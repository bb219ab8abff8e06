"""Partition-level checks as Ray Jobs: what ``POST /v1/jobs`` submits and ``GET /v1/jobs/{id}`` reports.

A job is an ordinary run, ``python -m contamray.run`` through the Jobs API (as ``jobs/submit.sh`` does),
writing ``<jobs.output_root>/<job id>/`` and sharing finished cells through ``jobs.cells_uri`` - the
same result store as batch runs (``pipeline/store.py``), so a run with the same cells reuses them.

Nothing in a request reaches the command line unchecked: models, benchmarks and methods come from
the allow-lists; every other override must match a key pattern of ``allow.job_keys`` (``*`` = one of
the job's method labels or benchmark names) with a plain value (no interpolation ``${...}``, no path
separators, ``run.limit`` within ``limits.max_job_limit``); ``+``/``~`` overrides are refused. The
composed config is validated (``build_plan``) before the job is submitted, so a wrong key is a 422 now,
not a failed job later.

Progress is read from the store: the job's cells are hashed as its run will hash them (the same plan,
the same rows: ``runner.load_benchmarks``, ``plan.cell_hash``) and counted as done when their verdict
is stored. A job is visible only to the token that submitted it.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contamray.serve.check import compose_plan, jsonable
from contamray.serve.config import ServerSettings
from contamray.serve.security import ApiError

JOB_PREFIX = "contamray-api-"
JOB_ID = re.compile(r"^contamray-api-[0-9a-f]{12}$")
PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_.,:\[\]{} '-]*$")  # lists and mappings of names and numbers
NAME_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a split or config name
INT_KEYS = ("run.limit", "run.seed")
NAME_KEYS = ("split", "config", "sample", "correction")


@dataclass(frozen=True)
class JobSpec:
    models: tuple[str, ...]
    benchmarks: tuple[str, ...]
    methods: tuple[str, ...]
    experiment: str = "base"
    overrides: tuple[str, ...] = field(default_factory=tuple)


def job_overrides(spec: JobSpec, settings: ServerSettings) -> list[str]:
    """The run's Hydra overrides for ``spec``; ApiError 403 outside the allow-lists, 422 for other faults."""
    allow = settings.allow
    for kind, names, allowed in (("model", spec.models, allow.models), ("benchmark", spec.benchmarks,
                                                                        allow.benchmarks)):
        if not names:
            raise ApiError(422, "invalid_job", f"{kind}s: empty; name at least one of {', '.join(allowed)}")
        outside = [n for n in names if n not in allowed]
        if outside:
            raise ApiError(403, f"{kind}_not_allowed",
                           f"{kind}(s) {', '.join(outside)} not served here; allowed: {', '.join(allowed)}")
    unknown = [m for m in spec.methods if m not in allow.methods]
    if unknown or not spec.methods:
        raise ApiError(422, "unknown_method", {"message": f"unknown method(s) {unknown or '(none given)'}; choose from "
                                               "the methods listed (GET /v1/methods)", "methods": list(allow.methods)})
    if spec.experiment not in allow.experiments:
        raise ApiError(403, "experiment_not_allowed",
                       f"experiment {spec.experiment!r} not allowed; allowed: {', '.join(allow.experiments)}")
    out = [f"+exp={spec.experiment}", f"model=[{','.join(spec.models)}]", f"benchmark=[{','.join(spec.benchmarks)}]",
           f"method=[{','.join(spec.methods)}]"]
    if settings.mirror_dir:
        out.append(f"data.mirror_dir={settings.mirror_dir}")
    return out + checked_overrides(spec.overrides, spec, settings, allow.job_keys)


def checked_overrides(overrides: tuple[str, ...], spec: JobSpec, settings: ServerSettings,
                      patterns: tuple[str, ...]) -> list[str]:
    """``overrides`` whose keys match ``patterns`` (a job's ``allow.job_keys``, an on-demand check's
    ``allow.check_keys``) with plain values, as ``key=value``; else ApiError 422 naming the key."""
    return [_checked_override(o, spec, settings, patterns) for o in overrides]


def _checked_override(override: str, spec: JobSpec, settings: ServerSettings, patterns: tuple[str, ...]) -> str:
    key, sep, value = override.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or key.startswith(("+", "~")):
        raise ApiError(422, "invalid_override", f"override {override!r}: write key=value with a key of "
                       f"{', '.join(patterns)} (adding or deleting keys with +/~ is not allowed)")
    if not any(_key_matches(key, p, spec) for p in patterns):
        raise ApiError(422, "override_not_allowed", {
            "message": f"override key {key!r} is not allowed here ('*' = one of the methods or benchmarks named)",
            "allowed_keys": list(patterns)})
    if "$" in value or not PLAIN_VALUE.match(value):
        raise ApiError(422, "invalid_override", f"override {key}: value {value!r} must be plain names and numbers "
                       "(no interpolation, no paths)")
    if key in INT_KEYS:
        if not value.isdigit():
            raise ApiError(422, "invalid_override", f"override {key}: {value!r} is not a whole number")
        if key == "run.limit" and not 1 <= int(value) <= settings.limits.max_job_limit:
            raise ApiError(422, "invalid_override", f"override run.limit: {value}; give 1 to "
                           f"{settings.limits.max_job_limit} (limits.max_job_limit)")
    if key.rsplit(".", 1)[-1] in NAME_KEYS and not NAME_VALUE.match(value):
        raise ApiError(422, "invalid_override", f"override {key}: {value!r} is not a name (letters, digits, _ . -)")
    if key.endswith(".limit") and key != "run.limit" and (not value.isdigit() or
                                                          int(value) > settings.limits.max_job_limit):
        raise ApiError(422, "invalid_override", f"override {key}: give a whole number <= "
                       f"{settings.limits.max_job_limit} (limits.max_job_limit)")
    return f"{key}={value}"


def _key_matches(key: str, pattern: str, spec: JobSpec) -> bool:
    if "*" not in pattern:
        return key == pattern
    head, _, tail = pattern.partition("*")
    if not (key.startswith(head) and key.endswith(tail)) or len(key) <= len(head) + len(tail):
        return False
    name = key[len(head): len(key) - len(tail)]
    return name in (spec.methods if head == "methods." else spec.benchmarks if head == "benchmarks." else ())


class Jobs:
    """Submits jobs and reports their status, progress and results (one per API replica)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._hashes: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def client(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        with self._lock:
            if self._client is None:
                address = self.settings.jobs.get("address")
                if not address:
                    import ray

                    address = ray.get_runtime_context().gcs_address  # the cluster this replica runs on
                self._client = JobSubmissionClient(address)
            return self._client

    def submit(self, spec: JobSpec, caller: str) -> dict[str, Any]:
        overrides = job_overrides(spec, self.settings)
        plan = compose_plan(overrides)  # a wrong key is the client's 422 now, not a failed job later
        jobs = self.settings.jobs
        job_id = f"{JOB_PREFIX}{uuid.uuid4().hex[:12]}"
        out = f"{jobs['output_root']}/{job_id}"
        argv = [str(jobs.get("python") or "python"), "-m", "contamray.run", f"hydra.run.dir={out}",
                f"run.cells_uri={jobs['cells_uri']}", *overrides]
        try:
            self.client().submit_job(
                entrypoint=" ".join(shlex.quote(a) for a in argv),
                submission_id=job_id,
                runtime_env=dict(jobs.get("runtime_env") or {}) or None,
                metadata={"contamray_api": "1", "owner": caller[:32], "output_dir": out,
                          "cells_total": str(len(plan.cells)), "overrides": json.dumps(overrides)},
                entrypoint_num_cpus=float(jobs.get("entrypoint_num_cpus") or 0),
                entrypoint_resources={k: float(v) for k, v in (jobs.get("entrypoint_resources") or {}).items()}
                or None,
            )
        except (RuntimeError, ConnectionError) as err:  # the cluster's Jobs API, not the request, failed
            first = str(err).splitlines()[0][:300]
            raise ApiError(503, "jobs_unavailable", f"the Ray Jobs API did not take the job ({first}); check that "
                           "the cluster's dashboard and its job agent are up (a local Ray needs the agent's port, "
                           "52365, free), or set jobs.address") from None
        return {"job_id": job_id, "status": "PENDING", "cells_total": len(plan.cells), "output_dir": out,
                "overrides": overrides}

    def status(self, job_id: str, caller: str) -> dict[str, Any]:
        if not JOB_ID.match(job_id):
            raise ApiError(404, "job_not_found", f"no job {job_id!r}: job ids look like {JOB_PREFIX}<12 hex digits>")
        try:
            info = self.client().get_job_info(job_id)
        except RuntimeError:
            raise ApiError(404, "job_not_found", f"no job {job_id!r} on this cluster") from None
        meta = info.metadata or {}
        if meta.get("contamray_api") != "1" or meta.get("owner") != caller[:32]:
            raise ApiError(404, "job_not_found", f"no job {job_id!r} submitted with this token")
        status = str(getattr(info.status, "value", info.status))
        total = int(meta.get("cells_total", "0"))
        out_dir = meta.get("output_dir", "")
        body: dict[str, Any] = {
            "job_id": job_id,
            "status": status,
            "message": (info.message or "").splitlines()[0] if info.message else "",
            "output_dir": out_dir,
            "progress": self._progress(job_id, meta, status, total),
        }
        if status == "SUCCEEDED":
            body["results"] = read_partitions(out_dir)
        return body

    def _progress(self, job_id: str, meta: dict[str, str], status: str, total: int) -> dict[str, Any]:
        if status == "SUCCEEDED":
            return {"cells_done": total, "cells_total": total}
        written = read_progress(meta.get("output_dir", ""))
        if written is not None:  # the run's own count (pipeline/store.py), cheap and exact
            return {"cells_done": int(written["cells_done"]), "cells_total": int(written["cells_total"]),
                    "cells_scored": int(written.get("cells_scored", 0))}  # fmt: skip
        try:
            hashes = self._cell_hashes(job_id, json.loads(meta.get("overrides", "[]")))
            from contamray.pipeline.store import ResultStore

            store = ResultStore(meta["output_dir"], cells_root=self.settings.jobs["cells_uri"])
            return {"cells_done": sum(store.has(h) for h in hashes), "cells_total": len(hashes)}
        except (ApiError, OSError, ValueError, KeyError) as err:
            return {"cells_done": None, "cells_total": total, "note": f"progress unavailable: {err}"}

    def _cell_hashes(self, job_id: str, overrides: list[str]) -> list[str]:
        """The job's cell hashes, as its run computes them (the plan, then the rows it reads)."""
        with self._lock:
            if job_id in self._hashes:
                return self._hashes[job_id]
        from contamray.corpus.fingerprint import corpus_fingerprint
        from contamray.pipeline.plan import rows_digest
        from contamray.pipeline.runner import load_benchmarks

        plan = compose_plan(overrides)
        records, failures = load_benchmarks(plan, {c.benchmark for c in plan.cells})
        plan.row_digests = {name: rows_digest(records[name], failures[name]) for name in records}
        if any(c.family == "open" for c in plan.cells):
            plan.corpus_digest = corpus_fingerprint(plan.corpus, plan.row_digests)
        hashes = [plan.cell_hash(c) for c in plan.cells]
        with self._lock:
            self._hashes[job_id] = hashes
        return hashes


def read_progress(out_dir: str) -> dict[str, Any] | None:
    """The run's ``progress.json`` (cells total / scored / done), or None before the run wrote one."""
    if not out_dir:
        return None
    import fsspec

    from contamray.pipeline.store import PROGRESS_FILE

    try:
        fs, path = fsspec.core.url_to_fs(out_dir.rstrip("/") + "/" + PROGRESS_FILE)
        if not fs.exists(path):
            return None
        with fs.open(path, "rb") as fh:
            body = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and "cells_total" in body and "cells_done" in body else None


def read_partitions(out_dir: str) -> list[dict[str, Any]]:
    """The finished run's ``partitions.parquet`` rows (details parsed back from their JSON text)."""
    import pandas as pd

    path = Path(out_dir) / "partitions.parquet"
    if not path.is_file():
        return []
    rows = pd.read_parquet(path).to_dict(orient="records")
    for row in rows:
        if isinstance(row.get("details"), str):
            try:
                row["details"] = json.loads(row["details"])
            except ValueError:
                pass
    return jsonable(rows)
