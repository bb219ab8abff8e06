"""The presets of ``conf/`` read outside Hydra: ``conf/<group>/<name>.yaml`` as a plain mapping.

A run composes ``methods.<label>`` from ``conf/method/<label>.yaml``; a method's ``Config`` defaults are a library
caller's (the papers' settings where the two differ: ``chat: false`` of the membership scores, whose preset asks both
prompt forms). Entry points that describe or measure what a run does start from the preset: the method catalog of
the API and of ``contamray methods`` (``serve/catalog.py``) and ``contamray calibrate`` (``validate/calibrate.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from contamray.experiments import CONF_DIR


def preset_names(group: str) -> list[str]:
    """The names of a group's presets (``conf/<group>/*.yaml``): what ``<group>=[...]`` of a run takes."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def preset(group: str, name: str) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` as a mapping (empty for an empty file)."""
    return yaml.safe_load((Path(CONF_DIR) / group / f"{name}.yaml").read_text()) or {}


def interpolated(value: Any) -> bool:
    """A value a composed run resolves (``${run.seed}``), which a preset read alone cannot."""
    return isinstance(value, str) and "${" in value


def method_params(values: dict[str, Any], config: type) -> dict[str, Any]:
    """The values a method preset (``preset("method", label)``) sets for the fields of ``config`` (the method's
    ``Config``), without interpolations."""
    return {f.name: values[f.name] for f in dataclasses.fields(config)
            if f.name in values and not interpolated(values[f.name])}  # fmt: skip
