"""Concurrent multirun for contamray: ``python -m contamray.run -m model=a,b benchmark=[x],[y]``.

Hydra's basic launcher runs a sweep's jobs one after another. A contamination sweep is mostly waiting
on engine actors, so here every job runs at once in a thread of the one driver process, all on the
same Ray cluster (``ray.init`` once): job B's engines load while job A's score. Each job keeps its own
output directory (``hydra.sweep.dir/<job num>``), resolved before the jobs start so concurrent jobs
never read one another's Hydra runtime state. ``hydra.launcher.max_concurrent`` bounds the threads.

Ctrl-C or SIGTERM reaches this thread, not the jobs': it stops them all (``contamray.interrupts.stop_all``: each
job's stages stop where they are, keeping the cells finished and the batches answered, as a stopped single run
does), waits for them to end, and exits with 130 (143), saying how to go on (the same sweep directory: each job
reuses what it stored in its own). Ray is started here, in the main thread, before the jobs (``_start_ray``).

The hydra-ray-launcher plugin starts a cluster per sweep and pins old Ray releases; with a cluster
already up (``RAY_ADDRESS``) this is the lighter fit.
"""


import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from contamray import interrupts

log = logging.getLogger(__name__)


@dataclass
class ContamrayLauncherConf:
    _target_: str = "hydra_plugins.contamray_launcher.launcher.ContamrayLauncher"
    max_concurrent: int = 8


ConfigStore.instance().store(group="hydra/launcher", name="contamray", node=ContamrayLauncherConf, provider="contamray")


class ContamrayLauncher(Launcher):
    def __init__(self, max_concurrent: int = 8) -> None:
        super().__init__()
        self.max_concurrent = max(1, int(max_concurrent))
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info("Launching %d jobs concurrently on one Ray cluster", len(job_overrides))
        configs = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
                job_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
                if "run" in sweep_config and "output_dir" in sweep_config.run:
                    sweep_config.run.output_dir = str(job_dir)
            configs.append(sweep_config)
        interrupts.reset()
        _start_ray(configs[0])
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent, len(configs)), thread_name_prefix="job") as pool:
            futures = [
                pool.submit(
                    run_job,
                    hydra_context=self.hydra_context,
                    task_function=self.task_function,
                    config=cfg,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                    configure_logging=False,
                )
                for cfg in configs
            ]
            _wait_or_stop(futures, str(self.config.hydra.sweep.dir))
            runs = [f.result() for f in futures]
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return runs


def _start_ray(config: DictConfig) -> None:
    """Ray for every job of the sweep, joined or started here, in the main thread, as the first job's config says
    (the jobs share one Ray, ``contamray.run.init_ray``). Started from a job's thread, Ray took 15-35 s more to shut
    down at the sweep's end (its core worker's shutdown, flushing metrics), and Ray's failure-signal handler stood
    in front of the main thread's SIGTERM handler (``contamray.interrupts.take_sigterm``, called by ``init_ray``)."""
    from contamray.run import init_ray

    init_ray(OmegaConf.to_container(config.ray, resolve=True) if "ray" in config else {})  # type: ignore[arg-type]


def _wait_or_stop(futures: list[Future], sweep_dir: str) -> None:
    """Wait for the jobs; on Ctrl-C or SIGTERM stop them all, wait for them to end and exit (130 / 143)."""
    try:
        wait(futures)
    except interrupts.STOPPED as stop:
        interrupts.stop_all()
        log.warning("interrupted: stopping the sweep's %d job(s) where they are", sum(not f.done() for f in futures))
        wait(futures)  # each stops within seconds, keeping what it finished (its log says what)
        interrupts.exit_stopped(stop, f"each job's cells finished and batches answered so far are stored in its own "
                                      f"directory under {sweep_dir}: the same command with hydra.sweep.dir={sweep_dir} "
                                      "reuses them")  # fmt: skip
