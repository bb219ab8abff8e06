"""The API server's settings: ``conf/api/server.yaml`` plus command-line overrides, checked once at start.

``load_settings(overrides)`` composes the YAML with ``key=value`` overrides (OmegaConf dot-list syntax,
``allow.models=[a,b]``), resolves it and validates every allow-list against the config tree
(``conf/model``, ``conf/benchmark``, ``conf/method``, ``conf/exp``), so a typo stops the server at start
with the key and the choices, not a request later. The result is a plain, picklable ``ServerSettings``
handed to every API replica.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contamray.experiments import CONF_DIR
from contamray.presets import preset, preset_names

SERVER_YAML = Path(CONF_DIR) / "api" / "server.yaml"


class SettingsError(ValueError):
    """A server setting is wrong; the message names the key and the fix."""


@dataclass(frozen=True)
class Allow:
    models: tuple[str, ...]
    benchmarks: tuple[str, ...]
    methods: tuple[str, ...]
    experiments: tuple[str, ...]
    job_keys: tuple[str, ...]
    check_keys: tuple[str, ...]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 262144
    max_items: int = 32
    max_text_chars: int = 8000
    max_reference_rows: int = 50
    default_reference_rows: int = 20
    max_job_limit: int = 500
    requests_per_minute: float = 120.0
    burst: int = 30


@dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int
    insecure_local: bool
    allow: Allow
    limits: Limits
    mirror_dir: str | None
    ray: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    jobs: dict[str, Any] = field(default_factory=dict)
    # SHA-256 hex digests of the API tokens (``security.token_digests``): the tokens themselves never
    # leave the process that read them
    token_digests: tuple[str, ...] = ()

    def replace(self, **changes: Any) -> ServerSettings:
        return dataclasses.replace(self, **changes)


def load_settings(overrides: list[str] | None = None, path: Path = SERVER_YAML,
                  values: dict[str, Any] | None = None) -> ServerSettings:
    """The server's settings from ``path`` with ``values`` (a nested or dotted mapping, e.g. a Serve config's
    ``args``) and ``overrides`` (``key=value``) on top; raises SettingsError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = OmegaConf.load(path)
    bad = [o for o in overrides or [] if "=" not in o or o.startswith(("+", "~"))]
    if bad:
        raise SettingsError(f"server overrides must be key=value (e.g. port=8001 limits.max_items=8), got {bad}")
    try:
        given = OmegaConf.create({})
        for key, value in (values or {}).items():  # "jobs.output_root" or {"jobs": {"output_root": ...}}
            OmegaConf.update(given, str(key), value, merge=True, force_add=True)
        merged = OmegaConf.merge(base, given, OmegaConf.from_dotlist(list(overrides or [])))
        raw = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as err:
        raise SettingsError(f"server config: {err}") from None
    assert isinstance(raw, dict)
    known = set(yaml.safe_load(path.read_text()))
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SettingsError(f"server config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return settings_from_dict(raw)


def settings_from_dict(raw: dict[str, Any]) -> ServerSettings:
    allow_raw = dict(raw.get("allow") or {})
    allow = Allow(**{f.name: tuple(str(v) for v in allow_raw.get(f.name) or ()) for f in dataclasses.fields(Allow)})
    limits_raw = dict(raw.get("limits") or {})
    known_limits = {f.name for f in dataclasses.fields(Limits)}
    unknown = sorted(set(limits_raw) - known_limits)
    if unknown:
        raise SettingsError(f"limits: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known_limits))}")
    limits = Limits(**{k: type(getattr(Limits, k))(v) for k, v in limits_raw.items()})
    for name in known_limits:
        if getattr(limits, name) <= 0:
            raise SettingsError(f"limits.{name}: must be > 0, got {getattr(limits, name)}")
    _check_allow(allow)
    jobs = dict(raw.get("jobs") or {})
    root = Path(str(jobs.get("output_root") or "outputs/api")).expanduser()
    jobs["output_root"] = str(root if "://" in str(root) else root.resolve())
    jobs["cells_uri"] = jobs.get("cells_uri") or f"{jobs['output_root']}/cells"
    mirror = (raw.get("data") or {}).get("mirror_dir") or None
    if mirror and "://" not in str(mirror):
        mirror = str(Path(str(mirror)).expanduser().resolve())  # the replicas and job drivers have other cwds
    port = int(raw.get("port", 8000))
    if not 0 < port < 65536:
        raise SettingsError(f"port: {port} is not a TCP port (1-65535)")
    return ServerSettings(
        host=str(raw.get("host", "127.0.0.1")),
        port=port,
        insecure_local=_as_bool(raw.get("insecure_local", False), "insecure_local"),
        allow=allow,
        limits=limits,
        mirror_dir=mirror,
        ray=dict(raw.get("ray") or {}),
        deployment=dict(raw.get("deployment") or {}),
        jobs=jobs,
        token_digests=tuple(raw.get("token_digests") or ()),
    )


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise SettingsError(f"{key}: {value!r} is not true or false")


def _check_allow(allow: Allow) -> None:
    """Every allow-listed name must exist in the run config tree; models must not need a fine-tune."""
    for key, group in (("models", "model"), ("benchmarks", "benchmark"), ("methods", "method"),
                       ("experiments", "exp")):
        names = getattr(allow, key)
        choices = preset_names(group)
        missing = [n for n in names if n not in choices]
        if missing:
            raise SettingsError(
                f"allow.{key}: {', '.join(missing)} not in conf/{group}/; choices: {', '.join(choices)}"
            )
    if not allow.models:
        raise SettingsError("allow.models: empty; list at least one conf/model name, e.g. [smollm2_135m_fp32]")
    for name in allow.models:
        spec = preset("model", name)
        if spec.get("inject"):
            raise SettingsError(
                f"allow.models: {name} is fine-tuned at run time (inject), so it is batch-only; remove it from "
                "allow.models"
            )
