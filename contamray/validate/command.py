"""``contamray validate``: run the injection grid and write the detector scoreboard (into the README).

- ``contamray validate [overrides...]``: compose ``+exp=validate`` (plus overrides), run one injected
  model per duplication count (``contamray.validate.grid``) with every method, label the runs with
  their truth, write ``scoreboard.md`` / ``scoreboard.csv`` / ``instances.csv`` into ``--out`` and the
  table into the README between the scoreboard markers (``--readme``, default ``./README.md``);
- ``contamray validate --runs DIR...``: the same table from finished runs, without running anything;
- ``--merge`` (with either): only the rows of the methods the run scored replace theirs in the README's table
  (``scoreboard.merge_rows``): a method added to the grid or whose rule changed, measured alone;
- ``contamray validate --truth RUN_DIR``: the canary table of one run (verdicts against the truth),
  also written to ``RUN_DIR/truth.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from datetime import datetime
from pathlib import Path

from contamray import logs

CLEAN = '"Clean" = not injected; only `synthetic_facts` partitions are clean by construction.'


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contamray validate",
        description="Run every method over an injection grid (duplication x contamination type x benchmark) and "
        "report partition-level accuracy, FPR on clean partitions, instance-level ROC AUC and TPR at 5%% FPR, and "
        "cost; the table goes into the README between <!-- scoreboard:start --> and <!-- scoreboard:end -->.",
    )
    p.add_argument("--runs", nargs="+", type=Path, default=None, metavar="RUN_DIR",
                   help="score these finished runs instead of running the grid")
    p.add_argument("--truth", type=Path, default=None, metavar="RUN_DIR",
                   help="print (and write RUN_DIR/truth.md) the verdict-vs-truth table of one run, then stop")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: outputs/validate/<time>)")
    p.add_argument("--readme", type=Path, default=Path("README.md"), help="README to update (default: ./README.md)")
    p.add_argument("--no-readme", action="store_true", help="do not touch the README")
    p.add_argument("--merge", action="store_true",
                   help="replace only the rows of the methods this run scored (e.g. method=[a,b]) in the README's "
                   "scoreboard, keeping the other rows and their note; the new note is appended")
    p.add_argument("--max-fpr", type=float, default=0.05, help="FPR of the instance-level TPR (default: 0.05)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the grid, e.g. run.limit=10")
    return p


def _prepare_corpus(config: dict, model_name: str, output_dir: Path) -> dict:
    """Fine-tune (or find cached) the run's injected model; its training stream becomes the corpus."""
    from contamray.inject.corpus import injected_corpus
    from contamray.inject.prepare import default_cache_dir, prepare_injected_model
    from contamray.pipeline.plan import build_plan
    from contamray.pipeline.runner import load_benchmarks

    plan = build_plan(config)
    spec = config["models"][model_name]
    records, _ = load_benchmarks(plan, {p["benchmark"] for p in spec["inject"]["partitions"]})
    model = prepare_injected_model(spec["source"], spec["inject"], records, default_cache_dir(), plan.seed,
                                   plan.data.get("mirror_dir"), where=f"models.{model_name}.inject")
    return injected_corpus(model, output_dir)


def run_grid(overrides: list[str], out: Path) -> tuple[list[Path], dict[str, float]]:
    """Run the grid of ``+exp=validate``; returns the run directories and their wall times."""
    from omegaconf import OmegaConf, open_dict

    from contamray.run import run
    from contamray.validate.compose import compose_config, to_dict
    from contamray.validate.grid import grid_runs

    if not any(o.startswith("+exp=") or o.startswith("exp=") for o in overrides):
        overrides = ["+exp=validate", *overrides]
    base = compose_config(overrides, out)
    runs = grid_runs(to_dict(base))
    cells = base.run.get("cells_uri") or str(out.parent / "cells")
    dirs, seconds = [], {}
    for grid_run in runs:
        cfg = base.copy()
        name = f"{base.validate.get('model_name', 'injected')}_dup{grid_run.duplication}"
        run_dir = out / grid_run.name
        start = time.perf_counter()
        with open_dict(cfg):
            cfg.models = OmegaConf.create({name: grid_run.model})
            cfg.run.name = f"validate_{grid_run.name}"
            cfg.run.output_dir = str(run_dir)
            cfg.run.cells_uri = cells
            if grid_run.injected_corpus:
                cfg.corpus = OmegaConf.create(_prepare_corpus(to_dict(cfg), name, run_dir))
        dirs.append(run(cfg))
        seconds[grid_run.name] = round(time.perf_counter() - start, 1)
        logging.getLogger("contamray").info("validate: %s finished in %.0f s", grid_run.name, seconds[grid_run.name])
    return dirs, seconds


def _recorded(dirs: list[Path]) -> tuple[dict[str, float], list[str]]:
    """Wall times and overrides a grid run recorded (``runs.json`` beside its run directories), for the note."""
    parents = {Path(d).resolve().parent for d in dirs}
    file = parents.pop() / "runs.json" if len(parents) == 1 else None
    if file is None or not file.is_file():
        return {}, []
    record = json.loads(file.read_text())
    seconds = {name: float(t) for name, t in record.get("seconds", {}).items() if name in {Path(d).name for d in dirs}}
    return seconds, [str(o) for o in record.get("overrides", [])]


def main(argv: list[str]) -> int:
    from contamray.validate.scoreboard import instance_rows, merged_note, render, scoreboard, update_readme
    from contamray.validate.table import write_truth_table
    from contamray.validate.truth import label_run

    args = parser().parse_args(argv)
    logs.configure()
    try:
        if args.truth is not None:
            print(write_truth_table(args.truth).read_text())
            return 0
        out = args.out or Path("outputs") / "validate" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        out.mkdir(parents=True, exist_ok=True)
        seconds: dict[str, float] = {}
        overrides = list(args.overrides)
        if args.runs:
            dirs = list(args.runs)
            seconds, recorded = _recorded(dirs)
            overrides = overrides or recorded
        else:
            dirs, seconds = run_grid(overrides, out)
        runs = [label_run(d) for d in dirs]
    except (FileNotFoundError, ValueError) as err:
        print(f"contamray validate: {err}", file=sys.stderr)
        return 2
    total = sum(seconds.values())
    board = scoreboard(runs, args.max_fpr)
    note = (
        f"{merged_note(list(board['method'])) if args.merge else 'Regenerated'} by "
        f"`contamray validate{' ' + ' '.join(overrides) if overrides else ''}` on "
        f"{datetime.now():%Y-%m-%d}: {len(runs)} run(s)"
        + (f", {total / 60:.0f} min wall time on {os.cpu_count()} CPU cores ({platform.machine()})" if total else "")
        + ("." if args.merge else f". {CLEAN}")  # a merge's rows share the definition the table's note gives
    )
    markdown = render(runs, args.max_fpr, note)
    (out / "scoreboard.md").write_text(markdown)
    board.to_csv(out / "scoreboard.csv", index=False)
    instance_rows(runs, args.max_fpr).to_csv(out / "instances.csv", index=False)
    record = {"runs": [str(d) for d in dirs], "seconds": seconds, "overrides": overrides}
    (out / "runs.json").write_text(json.dumps(record, indent=1))
    print(markdown)
    if not args.no_readme:
        try:
            update_readme(args.readme, markdown, merge=args.merge)
        except (FileNotFoundError, ValueError) as err:
            print(f"contamray validate: README not updated: {err}", file=sys.stderr)
            return 2
        print(f"scoreboard written to {args.readme} and {out}")
    return 0
