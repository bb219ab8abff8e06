"""``python -m contamray.run [+exp=NAME] [overrides...]``: compose the config, plan, run, report.

With no experiment named, the canary runs (``contamray.experiments``): the embedded model fine-tuned on
known partitions, every method, and at the end each verdict against the truth (``truth.md``).

Connects to ``RAY_ADDRESS`` (``ray job submit`` sets it) or starts a local Ray, validates the whole
config before any work (a wrong key stops here with the key and the choices), executes the plan
(``contamray.pipeline.runner``) and writes ``examples.parquet``, ``partitions.parquet``,
``summary.json``, ``report.md``, ``report.html`` (tables with the multiple-testing correction, heatmaps,
score distributions) and the resolved ``config.yaml`` into the run's output directory.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from contamray import logs, output_root
from contamray.experiments import CONF_DIR, key_not_in_run, with_experiment
from contamray.interrupts import STOPPED, exit_stopped, take_sigterm

log = logging.getLogger("contamray")
_RAY_INIT = threading.Lock()  # concurrent multirun jobs share one driver and one Ray connection
RAY_START_ATTEMPTS = 2  # ray.init attempts before a run stops (see init_ray)
output_root.register_resolver()  # hydra.run.dir under run.output_root (contamray/output_root.py)


def init_ray(ray_cfg: dict[str, Any]) -> None:
    """Join the cluster at ``ray.address`` / RAY_ADDRESS, or start a local Ray for this run."""
    import ray

    with _RAY_INIT:
        if ray.is_initialized():
            return
        address = ray_cfg.get("address") or None
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if address is None and ray_cfg.get("num_cpus"):
            # ray.num_cpus asks for a local Ray of that size: started even when another Ray runs on this machine
            # (with no address ray.init joins it, and refuses num_cpus: "When connecting to an existing cluster,
            # num_cpus and num_gpus must not be provided")
            address = "local"
            kwargs["num_cpus"] = int(ray_cfg["num_cpus"])
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                ray.init(address=address, **kwargs)
                take_sigterm()  # the clean-up after a SIGTERM is not cut short by Ray's 3 s abort
                return
            except Exception as err:  # noqa: BLE001 - retried below; the last attempt's error is raised
                if attempt == RAY_START_ATTEMPTS:
                    raise
                # A local Ray's raylet waits a fixed 30 s for its node's dashboard agent to start, and dies when a
                # busy machine takes longer ("Timed out waiting for file ... metrics_agent_port"); a second start
                # usually finds the machine less busy. Whatever the first start left is shut down first.
                log.warning("ray.init failed (%s: %s); starting again (attempt %d of %d)", type(err).__name__,
                            str(err).splitlines()[0][:300] if str(err) else "", attempt + 1, RAY_START_ATTEMPTS)
                ray.shutdown()


def run(cfg: DictConfig) -> Path:
    """Run one composed config; returns the output directory."""
    from contamray.artifacts import artifacts_root, check_artifacts
    from contamray.pipeline.plan import ConfigError, build_plan
    from contamray.pipeline.runner import execute
    from contamray.report.html import write_html_report
    from contamray.report.markdown import write_report

    plan = build_plan(cfg)
    output_dir = Path(cfg.run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    (output_dir / "config.yaml").write_text(config_yaml)
    log.info("plan: %d cells (%d skipped: the method does not apply), engine pools: %s", len(plan.cells),
             len(plan.skipped),
             ", ".join(f"{p.name}({p.backend}, gpus={p.num_gpus}, x{p.concurrency})" for p in plan.engine_pools()))
    output_root.check_uris(cfg.run)
    init_ray(plan.ray)
    output_root.check_job_output(cfg.run, output_dir)
    remote = output_root.destination(cfg.run.get("output_root"), output_dir)
    log.info(output_root.describe(output_dir, remote))
    cells_uri = cfg.run.get("cells_uri") or (f"{remote}/cells" if remote else None)
    artifacts_uri = cfg.run.get("artifacts_uri")
    unreadable = check_artifacts(plan, artifacts_root(artifacts_uri, cells_uri))
    if unreadable and not cfg.run.get("dry_run", False):
        raise ConfigError(unreadable)
    if unreadable:
        plan.warnings.append(unreadable)
    if cfg.run.get("dry_run", False):
        from contamray.pipeline.placement import reserve_engine_pools

        for cell in plan.cells:
            print(f"cell {cell.key} ({cell.family})")
        for cell, reason in plan.skipped:
            print(f"skipped {cell.key}: {reason}")
        for warning in plan.warnings:
            print(f"warning: {warning}")
        for p in reserve_engine_pools(plan):
            print(f"engine pool {p.pool}: backend={p.backend} num_gpus={p.num_gpus} x{p.concurrency} "
                  f"on nodes {p.nodes}")
        return output_dir
    result = execute(
        plan, output_dir, force=bool(cfg.run.get("force", False)), cells_uri=cells_uri, artifacts_uri=artifacts_uri,
        earlier=output_root.earlier_cells(cfg.run, output_dir, remote),
    )
    report = write_report(output_dir, result.partitions, config_yaml, f"contamray run: {cfg.run.name}")
    report_cfg = cfg.get("report") or {}
    write_html_report(
        [output_dir], output_dir, str(report_cfg.get("correction", "holm")), float(report_cfg.get("alpha", 0.05))
    )
    print(report.read_text().split("## Resolved config")[0])
    if any(model.inject for model in plan.models.values()):
        from contamray.validate.table import write_truth_table

        print(write_truth_table(output_dir).read_text())
    if remote:
        output_root.upload(output_dir, remote)
    print(output_root.describe(output_dir, remote))
    return output_dir


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from contamray.pipeline.plan import ConfigError
    from contamray.pipeline.store import StoreWriteError
    from contamray.serve.hosting import DeployError

    logs.configure()
    try:
        run(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    except StoreWriteError as err:  # a full disk: the message says what is kept and what to do
        print(f"store error: {err.strerror}", file=sys.stderr)
        sys.exit(3)
    except DeployError as err:  # a model that cannot be loaded or hosted; the cells finished are stored
        print(f"model error: {err}. The cells finished before are stored: {resume_hint(cfg)}", file=sys.stderr)
        sys.exit(4)
    except STOPPED as stop:  # Ctrl-C, SIGTERM: the stages stopped, what they finished is stored (the log says what)
        if isinstance(stop, SystemExit) and stop.code != signal.SIGTERM:  # not SIGTERM's handler (take_sigterm)
            raise
        exit_stopped(stop, f"the cells finished and the batches answered so far are stored: {resume_hint(cfg)}")


def resume_hint(cfg: DictConfig) -> str:
    """How to run again on what a stopped run stored: its cells are in its own output directory (a new one per
    run) unless ``run.cells_uri`` names a place runs share."""
    if cfg.run.get("cells_uri"):
        return "the same command again reuses them (run.cells_uri)"
    return f"the same command with hydra.run.dir={cfg.run.output_dir} reuses them"


def cli_main() -> None:
    """The command-line entry: the experiment resolved (``contamray.experiments``), then Hydra."""

    sys.argv = [sys.argv[0], *with_experiment(sys.argv[1:])]
    error = key_not_in_run(sys.argv[1:])
    if error:
        print(f"config error: {error}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli_main()
