"""Shared pytest fixtures."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


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
    path = finetune_causal_lm(
        resolve_model_path("smollm2-135m"),
        [text],
        tmp_path_factory.mktemp("contaminated") / "model",
        epochs=c["epochs"],
        lr=c["lr"],
        batch_size=1,
        seed=c["seed"],
        max_length=c["max_length"],
    )
    manifest = json.loads((Path(path) / "contamray_finetune.json").read_text())
    return ContaminatedModel(path, seen, unseen, c["fields"], c["format"], n // 4, manifest)
