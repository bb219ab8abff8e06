"""Which experiment a run composes: ``+exp=NAME`` / ``exp=NAME``, or the canary when none is named.

``conf/config.yaml`` holds the base settings every experiment starts from and lists no ``exp``, so an
experiment is appended (``+exp=llama2_openllm``, the spelling Hydra expects). Two conveniences sit on
top, for every entry point (``python -m contamray.run``, ``contamray inject``, ``contamray validate``):

- with no experiment named, the canary runs (``conf/exp/canary.yaml``: fully offline, the embedded
  model fine-tuned on known partitions, every method, ending with the verdicts against the truth) -
  the default a newcomer should see first;
- ``exp=NAME`` (without ``+``) means the same as ``+exp=NAME`` instead of Hydra's "no match in the
  defaults list" error;
- a ``models.<name>.<key>=...`` override of a model the run does not hold (``models.smollm2_135m.source=...``
  on the canary, whose models are ``[canary]``) is named with the run's models and the fix
  (``key_not_in_run``), instead of Hydra's "Could not override", whose suggested ``+`` would add a second
  model to the run; likewise a ``methods.<label>.<key>=...`` override of a method the run does not select, or of
  a key that is not one of the method's parameters (each method's YAML declares them all), is named with the
  run's methods or the method's parameters, not "Key 'x' is not in struct" (the same function, one compose).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

CONF_DIR = str((Path(__file__).parent / "conf").resolve())  # the Hydra config tree every entry point uses
DEFAULT_EXPERIMENT = "canary"
_SPELLINGS = ("+exp=", "++exp=", "exp=")


def with_experiment(overrides: list[str]) -> list[str]:
    """``overrides`` with exactly one ``+exp=...`` (the canary when none was given).

    Hydra flags (``--cfg job``, ``-m``) and other overrides pass through unchanged, in order.
    """
    out: list[str] = []
    named = False
    for arg in overrides:
        for prefix in _SPELLINGS:
            if arg.startswith(prefix):
                out.append("+exp=" + arg[len(prefix):])
                named = True
                break
        else:
            out.append(arg)
    if not named and not _asks_hydra_only(overrides):
        out.append(f"+exp={DEFAULT_EXPERIMENT}")
    return out


def _asks_hydra_only(args: list[str]) -> bool:
    """``--help`` / ``--hydra-help`` / ``--info`` / shell completion: no experiment is composed."""
    hydra_only = ("--help", "-h", "--hydra-help", "--version")
    return any(a in hydra_only or a.startswith(("--info", "-sc", "--shell-completion")) for a in args)


_MODEL_KEY = re.compile(r"^models\.([A-Za-z0-9_\-]+)\.[^=]+=")
_METHOD_KEY = re.compile(r"^methods\.([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)(?:\.[^=]*)?=")


def _composed_without(overrides: list[str], *patterns: re.Pattern[str]) -> Any:
    """The config the run composes without the overrides any of ``patterns`` matches, or None when it does not
    compose (Hydra reports that itself)."""
    from hydra import compose, initialize_config_dir

    rest = [a for a in overrides if not any(p.match(a) for p in patterns)]
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return compose(config_name="config", overrides=rest)
    except Exception:  # noqa: BLE001 - any other problem is Hydra's to report, with its own message
        return None


def key_not_in_run(overrides: list[str]) -> str | None:
    """The error for the first ``models.<name>.<key>=...`` or ``methods.<label>.<key>=...`` override (no ``+``) the
    composed run cannot take, or None: a model the run does not hold, a method it does not select, or a key the
    method does not have. ``overrides`` as Hydra gets them (after ``with_experiment``); the run is composed once,
    without those overrides; a sweep or a config that does not compose without them is left to Hydra (None)."""
    models = {m.group(1): arg for arg in overrides if (m := _MODEL_KEY.match(arg))}
    methods = [(m.group(1), m.group(2), arg.split("=", 1)[0]) for arg in overrides if (m := _METHOD_KEY.match(arg))]
    if not (models or methods) or any(a.startswith("-") for a in overrides):  # -m sweeps, --cfg ...: Hydra's own
        return None
    composed = _composed_without(overrides, _MODEL_KEY, _METHOD_KEY)
    if composed is None:
        return None
    return _model_not_in_run(models, composed) or _method_key_not_in_run(methods, composed)


def _model_not_in_run(named: dict[str, str], composed: Any) -> str | None:
    """A model named by a ``models.<name>.<key>=`` override that the run does not hold, with the fix (instead of
    Hydra's "Could not override", whose suggested ``+`` would add a second model to the run)."""
    models = set(composed.get("models") or {})
    missing = [name for name in named if name not in models]
    if not missing:
        return None
    name = missing[0]
    own = (Path(CONF_DIR) / "model" / f"{name}.yaml").is_file()
    fix = (f"add model=[{name}] to run conf/model/{name}.yaml (the list replaces the run's models)" if own
           else f"add +models.{name}={{source: ...}} for a model spec of your own")  # fmt: skip
    return (f"{named[name].split('=', 1)[0]}: {name} is not a model of this run (its models: "
            f"{', '.join(sorted(models)) or 'none'}); {fix}")  # fmt: skip


def _method_key_not_in_run(named: list[tuple[str, str, str]], composed: Any) -> str | None:
    """A ``methods.<label>.<key>=`` override of a method the run does not select, or of a key its method does not
    have (instead of Hydra's "Key 'x' is not in struct"), with the run's methods or the method's parameters."""
    methods = composed.get("methods") or {}
    for label, key, where in named:
        if label not in methods:
            own = (Path(CONF_DIR) / "method" / f"{label}.yaml").is_file()
            fix = (f"add method=[{label}] to run conf/method/{label}.yaml (the list replaces the run's methods)"
                   if own else f"add +methods.{label}={{method: ...}} for a method block of your own")  # fmt: skip
            return (f"{where}: {label} is not a method of this run (its methods: "
                    f"{', '.join(sorted(methods)) or 'none'}); {fix}")  # fmt: skip
        spec = methods[label]
        if key not in spec:
            from contamray.methods.base import get_method

            try:
                fields = sorted(f.name for f in dataclasses.fields(get_method(str(spec.get("method"))).Config))
            except KeyError:
                return None  # an unknown method: the plan names it
            if key in fields:
                continue  # a parameter its block leaves to the default: Hydra's "+" adds it, the plan reads it
            return (f"{where}: {key} is not a parameter of method {spec.get('method')} (methods.{label}); its "
                    f"parameters: {', '.join(fields)}")  # fmt: skip
    return None
