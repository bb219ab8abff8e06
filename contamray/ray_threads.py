"""How many threads a Ray worker's numeric libraries may use: one per CPU Ray assigned it.

Two match actors on two cores each spawning a thread per core would thrash, and so would a fine-tune task
beside them; torch, faiss and OpenMP default to every core of the machine. The driver (or any process
outside a Ray worker) keeps the libraries' defaults.
"""

from __future__ import annotations


def allocated_cpus() -> int | None:
    """The CPUs Ray assigned the calling actor or task (at least 1); None outside a Ray worker."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return None
    return max(1, int(context.get_assigned_resources().get("CPU", 1)))


def limit_torch_threads() -> None:
    """torch on ``allocated_cpus`` threads inside a Ray worker (imports torch: call it where torch is used)."""
    cpus = allocated_cpus()
    if cpus is not None:
        import torch

        torch.set_num_threads(cpus)
