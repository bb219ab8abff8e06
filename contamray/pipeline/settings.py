"""The run-wide settings (``run.*``, ``data.*``, ``serve.*``, ``ray.*``) checked by type and range in the plan.

Hydra composes what the YAML and the command line say, untyped: ``run.force=maybe`` arrives as the string "maybe",
which ``if run.force`` reads as true, and ``ray.request_batch_size=0`` or ``=abc`` failed only when the first engine
batch was cut, after the benchmarks were loaded and Ray was up. ``check_settings`` reads each key the code uses
against the type it takes (``methods.param_types``, as method parameters) and its least value, and names the key.
A key left out of a config keeps its default (the code's); keys not listed here are checked where they are read
(``run.sample``, ``run.limit`` per benchmark, ``ray.corpus_read``, ``corpus.*``, ``report.*``).
"""

from __future__ import annotations

from typing import Any

from contamray.methods.param_types import describe, fits

# key -> (type, least value for numbers or None, most value or None)
SETTINGS: dict[str, tuple[Any, float | None, float | None]] = {
    "run.seed": (int, 0, None),  # every randomness of the run derives from it; numpy refuses a negative one
    "run.force": (bool, None, None),
    "run.reuse_earlier": (bool, None, None),
    "run.dry_run": (bool, None, None),
    "run.name": (str, None, None),
    "data.strict": (bool, None, None),
    "data.mirror_dir": (str | None, None, None),
    "serve.reuse": (bool, None, None),
    "serve.keep": (bool, None, None),
    "serve.deploy_timeout_s": (float, 1, None),
    "ray.address": (str | None, None, None),
    "ray.num_cpus": (int | None, 1, None),
    "ray.scoring_concurrency": (int, 1, None),
    "ray.match_concurrency": (int, 1, None),
    "ray.match_concurrency_max": (int | None, 1, None),
    "ray.request_batch_size": (int, 1, None),
    "ray.request_batch_tokens": (int, 1, None),
    "ray.batches_in_flight": (int, 1, None),
    "ray.corpus_batch_size": (int, 1, None),
    "ray.corpus_batch_bytes": (int, 1, None),
    "ray.corpus_files_per_pass": (int, 1, None),
    "ray.match_gpu_share": (float, 0, 1),
}


def check_settings(config: dict[str, Any]) -> None:
    """Raise ValueError naming the first key of ``SETTINGS`` whose value in ``config`` (the composed run config, a
    plain mapping) is not of its type or out of its range, with what it takes."""
    for key, (hint, low, high) in SETTINGS.items():
        section, name = key.split(".", 1)
        block = config.get(section)
        if not isinstance(block, dict) or name not in block:
            continue
        value = block[name]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        in_range = not number or ((low is None or value >= low) and (high is None or value <= high))
        if not (fits(value, hint) and in_range):
            raise ValueError(f"{key}: expected {_wanted(hint, low, high)}, got {value!r}")


def _wanted(hint: Any, low: float | None, high: float | None) -> str:
    """What a key takes, in words: "an integer >= 1", "a number in [0, 1]", "an integer >= 1, or null"."""
    optional = fits(None, hint)
    arms = [arm for arm in getattr(hint, "__args__", (hint,)) if arm is not type(None)]
    text = " or ".join(describe(arm) for arm in arms)
    if low is not None and high is not None:
        text += f" in [{low:g}, {high:g}]"
    elif low is not None:
        text += f" >= {low:g}"
    return text + (", or null" if optional else "")
