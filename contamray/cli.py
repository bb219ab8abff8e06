"""``contamray``: the command line.

- ``contamray run [+exp=NAME] [overrides...]``: the same as ``python -m contamray.run`` (Hydra
  overrides, ``-m`` for a multirun sweep);
- ``contamray report RUN_DIR... [--out DIR] [--correction holm|bh|none] [--alpha 0.05]``: merge run
  directories into one cross-model report (``report.html``, ``tables.md``, ``cells.csv``, ``plots/``);
  ``--out`` defaults to the run directory when there is one, else ``./contamray-report``;
- ``contamray inject [--model NAME] [overrides...]``: fine-tune (or find cached) the injected models of a
  config (``models.<name>.inject``), e.g. ``contamray inject +exp=canary``;
- ``contamray validate [overrides...] | --runs DIR... | --truth RUN_DIR``: the detector scoreboard over an
  injection grid, written into README.md; ``--truth`` prints one run's verdicts against the truth;
- ``contamray calibrate [--benchmarks ...] [--slices 10] [--size 20]``: each closed-data test's flag rate on
  slices of benchmarks under one model (default: the embedded base model), written into README.md;
- ``contamray methods``: the method presets ``method=[...]`` takes (``conf/method/``), each with its method, family,
  parameters as a run starts from them, citation, declared per-example score and membership columns, and where
  it applies;
- ``contamray benchmarks``: benchmark adapters with their hub id, config, splits and task type;
- ``contamray serve [--host H] [--port P] [--insecure-local] [overrides...]``: the on-demand HTTP API on Ray
  Serve (``contamray/serve/``; overrides are keys of ``conf/api/server.yaml``), until interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_MULTI_OUT = Path("contamray-report")


def _methods() -> None:
    """Every method preset (what ``method=[...]`` takes) with the values a run starts from - the preset's over
    the method's ``Config`` defaults - as the API's ``GET /v1/methods`` lists them (``serve/catalog.py``)."""
    from contamray.methods.base import get_method
    from contamray.presets import preset_names
    from contamray.serve.catalog import method_entry

    for label in preset_names("method"):
        entry = method_entry(label)
        module = sys.modules[type(get_method(entry["method"])).__module__]
        doc = (module.__doc__ or "").strip().splitlines()
        params = ", ".join(f"{key}={value!r}" for key, value in entry["parameters"].items())
        cites = entry["citation"]
        cites = cites if len(cites) <= 300 else cites[:297] + "..."
        applies = entry["applies"]
        limits = [f"tasks: {'/'.join(applies['tasks'])}"] if applies["tasks"] else []
        limits += ["multiple-choice only"] if applies["needs_choices"] else []
        limits += [f">= {applies['min_rows']} rows"] if applies["min_rows"] > 1 else []
        where = ", ".join(limits) or "every benchmark"
        method = f" (method {entry['method']})" if entry["method"] != label else ""
        print(
            f"{label} [{entry['family']}]{method} {doc[0] if doc else ''}\n    {params}\n"
            f"    cites: {cites}\n    score: {entry['score'] or '-'} ({entry['score_label'] or 'none declared'}); "
            f"membership score: {entry['membership'] or '- (decides per partition)'}; applies to: {where}"
        )


def _benchmarks() -> None:
    from contamray.benchmarks import adapter_names, get_adapter

    for name in adapter_names():
        print(get_adapter(name).describe())


def report_parser() -> argparse.ArgumentParser:
    from contamray.report.correction import CORRECTIONS

    parser = argparse.ArgumentParser(
        prog="contamray report",
        description="Merge contamray run directories into one report: a table and heatmap per method (rows "
        "models, columns partitions), p-values corrected for multiple testing across the grid, per-partition "
        "score distributions, all in a self-contained report.html.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="directories written by `contamray run` (a cell in several runs is taken from the last)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the run directory if one is given, else "
                        f"./{DEFAULT_MULTI_OUT})")
    parser.add_argument("--correction", default="holm", choices=CORRECTIONS,
                        help="multiple-testing correction across the grid: holm (family-wise error), bh "
                        "(Benjamini-Hochberg false discovery rate) or none (default: holm)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level (default: 0.05)")
    return parser


def _report(argv: list[str]) -> int:
    from contamray.report.correction import check_correction
    from contamray.report.html import build_report

    args = report_parser().parse_args(argv)
    try:
        correction, alpha = check_correction(args.correction, args.alpha, "--correction", "--alpha")
    except ValueError as err:
        print(f"contamray report: {err}", file=sys.stderr)
        return 2
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else DEFAULT_MULTI_OUT)
    try:
        files = build_report(args.run_dirs, out, correction, alpha)
    except (FileNotFoundError, ValueError) as err:
        print(f"contamray report: {err}", file=sys.stderr)
        return 2
    print(files.markdown.read_text())
    print(f"report: {files.html}")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv else "help"
    if command == "run":
        from contamray import run

        sys.argv = ["contamray.run", *argv]
        run.cli_main()
    elif command == "report":
        code = _report(argv)
        if code:
            sys.exit(code)
    elif command in ("inject", "validate", "calibrate", "serve"):
        if command == "inject":
            from contamray.inject.command import main as command_main
        elif command == "calibrate":
            from contamray.validate.calibrate import main as command_main
        elif command == "serve":
            from contamray.serve.command import main as command_main
        else:
            from contamray.validate.command import main as command_main
        code = command_main(argv)
        if code:
            sys.exit(code)
    elif command == "methods":
        _methods()
    elif command == "benchmarks":
        _benchmarks()
    else:
        print(__doc__)
        sys.exit(0 if command in ("help", "-h", "--help") else 2)


if __name__ == "__main__":
    main()
