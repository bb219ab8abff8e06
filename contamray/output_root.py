"""Where a run's results land: ``run.output_root`` (``CONTAMRAY_OUTPUT_ROOT``), a local path or an fsspec URI.

A run writes into ``<root>/<run.name>/<time>/`` (``hydra.run.dir``; an explicit ``hydra.run.dir=...`` wins).
The root is, in this order:

- ``run.output_root`` (default: the environment variable ``CONTAMRAY_OUTPUT_ROOT``): a local directory
  (shared storage on a cluster) or any fsspec URI (``s3://bucket/contamray``, ``gs://...``,
  ``file:///srv/out``). For a URI the run writes into a local staging directory (``STAGING``), streams
  every finished cell to ``<uri>/<name>/<time>/cells`` as it is stored (unless ``run.cells_uri`` says
  otherwise), and copies the run's tables and report to ``<uri>/<name>/<time>/`` when it ends, so an
  interrupted run loses no finished cell and a re-run with the same ``hydra.run.dir`` resumes from them;
- under a Ray Job (``ray job submit -- python -m contamray.run ...``) with no root set: ``outputs/`` in
  ``DEFAULT_JOB_ROOT`` on the node that runs the driver. Without this the run would write under Ray's runtime
  working directory (``.../runtime_resources/working_dir_files/_ray_pkg_<hash>/``), which Ray deletes. On a cluster of
  more than one node that directory is on whichever node ran the driver, so the run refuses to start
  (``check_job_output``) until a root the user can reach is set;
- otherwise ``outputs/`` in the working directory.

The job log says where the results go (``describe``).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

ENV = "CONTAMRAY_OUTPUT_ROOT"
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for the driver of a Ray Job
DEFAULT_JOB_ROOT = "~/contamray"
STAGING = "~/.cache/contamray/staging"
RESOLVER = "contamray.output_root"


def is_uri(root: str) -> bool:
    return "://" in root


def ray_job_id() -> str | None:
    """The submission id when this process is the driver of a Ray Job, else None."""
    raw = os.environ.get(RAY_JOB_ENV)
    if not raw:
        return None
    try:
        metadata = json.loads(raw).get("metadata") or {}
    except (ValueError, AttributeError):
        return "unknown"
    return str(metadata.get("job_submission_id") or "unknown")


def local_root(root: str | None, default: str = "outputs") -> str:
    """The local directory under which ``hydra.run.dir`` / ``hydra.sweep.dir`` are made (the resolver)."""
    if root:
        root = str(root).strip()
        return str(Path(STAGING).expanduser() / _slug(root)) if is_uri(root) else str(Path(root).expanduser())
    if ray_job_id():
        return str(Path(DEFAULT_JOB_ROOT).expanduser() / default)
    return default


def _slug(uri: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in uri)


def register_resolver() -> None:
    """``${contamray.output_root:${run.output_root},outputs}`` in conf/config.yaml's hydra section."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, local_root)


def destination(root: str | None, output_dir: str | Path) -> str | None:
    """The URI a run staged at ``output_dir`` is copied to, when the root is a URI; else None."""
    if not root or not is_uri(str(root)):
        return None
    staging = Path(local_root(root))
    try:
        relative = Path(output_dir).resolve().relative_to(staging.resolve())
    except ValueError:  # an explicit hydra.run.dir outside the staging area: keep its last two parts
        relative = Path(*Path(output_dir).resolve().parts[-2:])
    return f"{str(root).rstrip('/')}/{relative.as_posix()}"


MAX_EARLIER = 50  # the newest earlier run folders whose finished cells a run may reuse (``earlier_cells``)


def earlier_cells(run_cfg: Any, output_dir: str | Path, remote: str | None) -> list[str]:
    """The cells roots of this run name's earlier runs, newest first (at most ``MAX_EARLIER``): the other folders of
    ``<root>/<run.name>/`` - runs' ``<time>/cells``, or a sweep job's ``<time>/<job>/cells`` - on the URI when the root
    is one. A run copies their finished cells it lacks into its own (``ResultStore.adopt``: the same cell hash is the
    same configuration, rows, corpus files and checkpoint files). None when ``run.reuse_earlier`` is false, when
    ``run.cells_uri`` is set (the runs share one store already) or when the run's folder is not in that layout (an
    explicit ``hydra.run.dir`` elsewhere: its own cells only)."""
    import fsspec

    if not run_cfg.get("reuse_earlier", True) or run_cfg.get("cells_uri"):
        return []
    name = str(run_cfg.get("name") or "")
    root = run_cfg.get("output_root")
    here = Path(output_dir).expanduser().resolve()
    for default in ("outputs", "multirun"):
        family = Path(local_root(root, default)).expanduser().resolve() / name
        try:
            depth = len(here.relative_to(family).parts)
        except ValueError:
            continue
        if depth not in (1, 2):
            continue
        own = f"{remote}/cells" if remote else str(here / "cells")
        fs, path = fsspec.core.url_to_fs(f"{str(root).rstrip('/')}/{name}" if remote else str(family))
        found = sorted(fs.glob(f"{path.rstrip('/')}/{'/'.join(['*'] * depth)}/cells"), reverse=True)
        roots = [fs.unstrip_protocol(p) if remote else p for p in found]
        return [r for r in roots if r.rstrip("/") != own.rstrip("/")][:MAX_EARLIER]
    return []


def check_uris(run_cfg: Any) -> None:
    """Refuse, before any work, a ``run.output_root`` / ``cells_uri`` / ``artifacts_uri`` URI whose
    filesystem fsspec cannot load (an unknown scheme, or its package not installed): otherwise the first
    stored cell would fail, after the first cells were computed."""
    import fsspec

    from contamray.pipeline.plan import ConfigError

    for key in ("output_root", "cells_uri", "artifacts_uri"):
        value = run_cfg.get(key)
        if not value or not is_uri(str(value)):
            continue
        protocol = str(value).split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as err:
            raise ConfigError(
                f"run.{key}: {value!r} is on a filesystem fsspec cannot open here ({err}); install its "
                f"package (s3://: s3fs, gs://: gcsfs, az://: adlfs) or use a local path"
            ) from None


def check_job_output(run_cfg: Any, output_dir: Path) -> None:
    """Under a Ray Job with no root set, refuse a cluster of more than one node: the results would sit on
    whichever node ran the driver."""
    from contamray.pipeline.plan import ConfigError

    job = ray_job_id()
    if job is None or run_cfg.get("output_root"):
        return
    nodes = _alive_nodes()
    if nodes > 1:
        raise ConfigError(
            f"this Ray Job ({job}) would write its results to {output_dir} on the node running the driver "
            f"({socket.gethostname()}), one of {nodes} nodes: set run.output_root (or {ENV} in the job's "
            "runtime env) to shared storage or a URI (s3://..., gs://...), or hydra.run.dir to a shared path"
        )


def _alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def describe(output_dir: Path, remote: str | None) -> str:
    where = remote or f"{output_dir} (on {socket.gethostname()})"
    return f"results: {where}" + (f" (staged at {output_dir})" if remote else "")


def upload(output_dir: Path, remote: str) -> None:
    """Copy the run's files (its cells are already at their URI) to ``remote`` with fsspec."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(remote)
    fs.makedirs(path, exist_ok=True)
    for item in sorted(output_dir.rglob("*")):
        relative = item.relative_to(output_dir)
        if item.is_dir() or relative.parts[0] == "cells":
            continue
        target = f"{path.rstrip('/')}/{relative.as_posix()}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(item), target)
