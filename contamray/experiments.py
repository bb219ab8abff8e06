"""Which experiment a run composes: ``+exp=NAME`` / ``exp=NAME``, or the canary when none is named.

``conf/config.yaml`` holds the base settings every experiment starts from and lists no ``exp``, so an
experiment is appended (``+exp=llama2_openllm``, the spelling Hydra expects). Two conveniences sit on
top, for every entry point (``python -m contamray.run``, ``contamray inject``, ``contamray validate``):

- with no experiment named, the canary runs (``conf/exp/canary.yaml``: fully offline, the embedded
  model fine-tuned on known partitions, every method, ending with the verdicts against the truth) -
  the default a newcomer should see first;
- ``exp=NAME`` (without ``+``) means the same as ``+exp=NAME`` instead of Hydra's "no match in the
  defaults list" error.
"""

from __future__ import annotations

from pathlib import Path

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
