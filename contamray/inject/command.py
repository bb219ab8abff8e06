"""``contamray inject [--model NAME] [--cache-dir DIR] [overrides...]``: build the injected models of a config.

Composes the run config exactly as ``python -m contamray.run`` would (``+exp=canary``, any override),
loads the benchmark rows each ``models.<name>.inject`` spec names - the same rows, sampled with the same
seed, that the run will probe - and fine-tunes (or finds in the cache) each injected model. Prints the
model directory and what was injected. A later run with the same config reuses the cached model.

Example::

    contamray inject +exp=canary data.mirror_dir=../shared/benchmarks
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from contamray import logs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contamray inject",
        description="Fine-tune the injected models of a run config (models.<name>.inject) and print where they "
        "are; a run with the same config then reuses them.",
    )
    p.add_argument("--model", action="append", default=None, help="only this model (repeatable; default: all "
                   "models with an inject spec)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where injected models live (default: $CONTAMRAY_CACHE/injected)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +exp=canary run.limit=10")
    return p


def main(argv: list[str]) -> int:
    from contamray.inject.prepare import default_cache_dir, prepare_injected_model
    from contamray.pipeline.plan import ConfigError, build_plan
    from contamray.pipeline.runner import load_benchmarks
    from contamray.validate.compose import compose_config, to_dict

    args = parser().parse_args(argv)
    logs.configure()
    config = to_dict(compose_config(args.overrides, tempfile.mkdtemp(prefix="contamray-inject-")))
    try:
        plan = build_plan(config)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    specs = {name: (spec or {}).get("inject") for name, spec in (config.get("models") or {}).items()}
    chosen = args.model or [name for name, inject in specs.items() if inject]
    bad = [m for m in chosen if not specs.get(m)]
    if bad or not chosen:
        with_spec = [n for n, s in specs.items() if s]
        print(f"contamray inject: no inject spec for model(s) {', '.join(bad) or '(none selected)'}; models with one: "
              f"{', '.join(with_spec) or 'none (use e.g. +exp=canary)'}", file=sys.stderr)
        return 2
    cache = args.cache_dir or default_cache_dir()
    for name in chosen:
        where = f"models.{name}.inject"
        keys = {p["benchmark"] for p in specs[name]["partitions"]}
        records, _ = load_benchmarks(plan, keys)
        try:
            model = prepare_injected_model(
                config["models"][name]["source"], specs[name], records, cache, plan.seed,
                plan.data.get("mirror_dir"), where=where,
            )
        except ValueError as err:
            print(f"contamray inject: {err}", file=sys.stderr)
            return 2
        print(f"{name}: {model.path}")
        for bench, info in model.manifest["partitions"].items():
            print(f"  {bench} ({', '.join(info['partitions'])}): {info['n_injected']}/{info['n_rows']} rows x"
                  f"{info['duplication']} {info['kind']} ({info['format']})")
        training = model.manifest["training"]
        print(f"  background: {len(model.manifest['background']['doc_ids'])} documents of "
              f"{model.manifest['background']['source']}; {training['n_blocks']} blocks of <= {training['max_length']} "
              f"tokens, {training['epochs']} epoch(s), losses {training['epoch_losses']}, {training['seconds']} s")
    return 0
