"""Compose the run config outside ``@hydra.main`` (for ``contamray inject`` / ``contamray validate``).

The same ``conf/`` tree and the same override syntax as ``python -m contamray.run``; ``run.output_dir``
(normally Hydra's run directory) is set here, since no Hydra run directory exists.

The experiment is chosen as for a run (``contamray.experiments``: ``+exp=NAME`` or ``exp=NAME``, the
canary when none is named).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict


def compose_config(overrides: list[str], output_dir: str | Path) -> DictConfig:
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR, with_experiment

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=with_experiment(list(overrides)))
    with open_dict(cfg):
        cfg.run.output_dir = str(output_dir)
    return cfg


def to_dict(cfg: DictConfig) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container
