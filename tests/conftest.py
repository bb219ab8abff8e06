"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.xdist_scheduling import pytest_xdist_make_scheduler  # noqa: F401 - a hook: README's loadfile, recovering

# Under pytest-xdist (README's test command runs two workers) each worker process gets a Ray temp dir of its
# own: ray.init() without an address joins the cluster whose address Ray wrote under its temp dir (the
# ``ray.cluster_utils.Cluster`` fixture writes one), and must never find the other worker's - nor, when a worker
# dies and xdist starts a replacement with the same name, the dead one's orphaned cluster (hence the pid).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER and "RAY_TMPDIR" not in os.environ:
    os.environ["RAY_TMPDIR"] = f"/tmp/cr-{WORKER}-{os.getpid()}"  # short: Ray's socket paths have a length limit
    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)


def pytest_configure(config: pytest.Config) -> None:
    _stop_serve_router_before_ray_shutdown()
    if WORKER:
        # two workers on the machine's cores: torch in this process takes one thread, not all of them
        # (the processes a test starts - Ray workers, a run's driver - size their own threads)
        import torch

        torch.set_num_threads(1)


def _stop_serve_router_before_ray_shutdown() -> None:
    """Every ``ray.shutdown()`` of this test process first stops Serve's driver-side router loop
    (``contamray.serve.router_loop``). A module that reached a deployment through a handle leaves that loop
    running for the rest of the process, and the next modules start and stop Ray sessions of their own: a call
    of the loop landing while one of them is shut down ends the whole worker (seen once: an xdist worker lost
    after ``test_match_pool``, the loop started by ``test_finetune_task`` minutes before)."""
    import functools

    import ray

    from contamray.serve.router_loop import stop_driver_router

    shutdown = ray.shutdown
    if getattr(shutdown, "stops_serve_router", False):
        return

    @functools.wraps(shutdown)
    def guarded(*args, **kwargs):
        stop_driver_router()
        return shutdown(*args, **kwargs)

    guarded.stops_serve_router = True  # type: ignore[attr-defined]
    ray.shutdown = guarded


# Modules that take minutes on 2 cores (the slowest of `pytest --durations`: real fine-tunes, engines scoring
# thousands of texts, runs on 3-node clusters), in this order, ahead of the rest. README's command runs
# xdist with ``--dist loadfile --no-loadscope-reorder``: whole modules go to the two workers in collection
# order (two each at the start: the 1st and 3rd to one worker, the 2nd and 4th to the other, then one at a
# time to whichever is free), so both start on long ones and the many short modules fill the end, instead of
# one worker finishing a long module alone. test_null_calibration fine-tunes the contaminated model the
# later modules of this list share (they wait for it: ``built_once``).
LONG_MODULES = (
    "test_null_calibration", "test_order_structure", "test_multinode_scan", "test_null_calibration_guided",
    "test_resume", "test_name_cloze", "test_smoke_run", "test_cdd", "test_sharded_likelihood", "test_position_fields",
    "test_membership_scores", "test_heldout_accuracy", "test_multinode_placement", "test_http_engine", "test_hosting",
    "test_dcq", "test_multirun",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(Path(item.nodeid.split("::")[0]).stem, len(rank)))  # stable


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``<shared temp>/<name>``, built by ``build`` the first time any worker of this test session asks
    (a file lock in the temp dir every xdist worker shares), so a session fixture's work is paid once."""
    root = tmp_path_factory.getbasetemp()
    if WORKER:
        root = root.parent  # <base>/popen-gwN is one worker's; its parent is the session's
    target = root / name
    from contamray.engines.models import _file_lock  # the lock the embedded model's conversion takes

    with _file_lock(root / f".{name}.lock"):
        if not (target / ".built").exists():
            build(target)
            (target / ".built").touch()
    return target


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The local mirror of benchmark splits (hub row schema): env CONTAMRAY_MIRROR_DIR, else the
    ``shared/benchmarks`` folder beside the repository (as in CI's checkout)."""
    default = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    path = Path(os.environ.get("CONTAMRAY_MIRROR_DIR") or default)
    if not path.is_dir():
        pytest.fail(
            f"benchmark mirror not found at {path}; set CONTAMRAY_MIRROR_DIR to the folder holding "
            "<hub org>/<name>/<config>/<split>.jsonl (shared/benchmarks)"
        )
    return path


@pytest.fixture(scope="module")
def ray_cluster():
    """A ``ray.cluster_utils.Cluster`` of one 2-CPU head node, this process its driver; a test adds the nodes it
    needs (``add_node``). Shut down with the module."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


# ---------------------------------------------------------------------------------------------
# A model contaminated on purpose (issue 3): the embedded SmolLM2-135M fine-tuned on one benchmark
# slice serialised in canonical order, for every detector that must tell seen from unseen rows.


@dataclass(frozen=True)
class ContaminatedModel:
    """A fine-tuned checkpoint and the rows it saw / did not see (same benchmark, disjoint rows).

    ``seen`` were written as one text in canonical order (``fields`` as ``format``, each example
    followed by ``EXAMPLE_END[format]``, exactly the sharded likelihood test's serialisation) and
    trained on for ``epochs`` epochs; ``unseen`` are the next rows of the split, never trained on.
    ARC-Challenge questions are short (about 30 tokens) and its test split is in no meaningful order,
    so an unseen slice's canonical order carries no structure the model could know. Measured here:
    on the seen slice the sharded test gives p ~ 1e-3 (10 shards x 25 permutations), on the unseen
    slice p ~ 0.85, Min-K%++ AUC ~ 0.998. Shorter TruthfulQA questions were tried and rejected: their
    Min-K%++ AUC fell to 0.89-0.93 (the k % lowest of ~12 tokens are the ambiguous opening words).
    Fewer epochs leave the order too weakly learnt (8 epochs: p ~ 0.02); the fine-tune takes about
    12 x 1,300 tokens of CPU training (~2.5 min on 2 quiet cores).
    """

    path: str
    seen: list
    unseen: list
    fields: tuple[str, ...]
    format: str
    num_shards: int  # shards of 4 examples: the sharded test's power on this model
    manifest: dict


CONTAMINATION = {
    "benchmark": "arc_challenge",
    "n": 40,
    "fields": ("input",),
    "format": "text",
    "epochs": 12,
    "lr": 5e-4,
    "max_length": 2048,  # the whole slice is one training sequence, as a file would be
    "seed": 0,
}


@pytest.fixture(scope="session")
def contaminated_model(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ContaminatedModel:
    import dataclasses
    import json

    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.inject import finetune_causal_lm
    from contamray.methods.closed.likelihood_text import EXAMPLE_END, serialise

    c = CONTAMINATION
    rows = load_records(c["benchmark"], mirror_dir=mirror_dir).records
    n = c["n"]
    seen = [dataclasses.replace(r, partition=f"{r.partition}:rows0-{n - 1}") for r in rows[:n]]
    unseen = [dataclasses.replace(r, partition=f"{r.partition}:rows{n}-{2 * n - 1}") for r in rows[n : 2 * n]]
    text = "".join(serialise(r, c["fields"], c["format"]) + EXAMPLE_END[c["format"]] for r in seen)

    def build(target: Path) -> None:
        finetune_causal_lm(
            resolve_model_path("smollm2-135m"),
            [text],
            target / "model",
            epochs=c["epochs"],
            lr=c["lr"],
            batch_size=1,
            seed=c["seed"],
            max_length=c["max_length"],
        )

    path = str(built_once(tmp_path_factory, "contaminated", build) / "model")
    manifest = json.loads((Path(path) / "contamray_finetune.json").read_text())
    return ContaminatedModel(path, seen, unseen, c["fields"], c["format"], n // 4, manifest)
