"""The injection grid behind ``contamray validate``: duplication count x contamination type x benchmark.

The grid is declared under ``validate:`` in the composed config (``conf/exp/validate.yaml``)::

    validate:
      base: smollm2-135m                 # the model every grid model is fine-tuned from
      duplications: [1, 2, 5, 10]        # one injected model per count
      injected:                          # benchmark key -> how it is injected (form, content, order, ...)
        synthetic_facts: {form: verbatim, content: input_and_label, order: canonical}
        sf_paraphrased: {form: paraphrased}
      train: {background: {docs: 16}, lr: 3.0e-4, batch_size: 4}   # the rest of the inject spec
      corpus: injected                   # open-data methods scan each model's training stream

and every other benchmark of the run stays clean. One run per duplication count (``grid_runs``): its
single model is ``base`` with every ``injected`` benchmark at that count, and - with ``corpus:
injected`` - the run's corpus is that model's training stream (``contamray.inject.corpus``; the model
is prepared before the run, and the run finds it in the injection cache), so open- and closed-data
methods face the same truth. A run's finished cells are reused by the next ``contamray validate`` (``run.cells_uri``
under the output directory's parent), so re-rendering the table after adding a method computes only
the new method's cells.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

GRID_KEYS = ("base", "duplications", "injected", "train", "corpus", "model_name", "model")


@dataclass(frozen=True)
class GridRun:
    name: str  # e.g. dup5
    duplication: int
    model: dict[str, Any]  # the model spec, with its inject mapping
    injected_corpus: bool  # scan the model's training stream (else the config's own corpus)


def grid_runs(config: dict[str, Any]) -> list[GridRun]:
    """Expand ``validate:`` into one run per duplication count; errors name the config key."""
    grid = config.get("validate")
    if not isinstance(grid, dict):
        raise ValueError("validate: the config has no `validate:` grid; use +exp=validate or add one")
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise ValueError(f"validate: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(GRID_KEYS)}")
    dups = grid.get("duplications") or []
    if not isinstance(dups, list) or not dups or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                                        for d in dups):
        raise ValueError(f"validate.duplications: expected a non-empty list of integers >= 1, got {dups!r}")
    injected = grid.get("injected") or {}
    if not isinstance(injected, dict) or not injected:
        raise ValueError("validate.injected: expected a mapping benchmark key -> {form, content, order, ...}")
    benchmarks = set(config.get("benchmarks") or {})
    for key, how in injected.items():
        if key not in benchmarks:
            raise ValueError(
                f"validate.injected.{key}: not a benchmark of this run; choices: {', '.join(sorted(benchmarks))}"
            )
        if how is not None and not isinstance(how, dict):
            raise ValueError(f"validate.injected.{key}: expected a mapping (form, content, order, ...), got {how!r}")
    corpus_kind = grid.get("corpus", "injected")
    if corpus_kind not in ("injected", "config"):
        raise ValueError(f"validate.corpus: {corpus_kind!r} is not one of injected, config")
    model_template = dict(grid.get("model") or {})
    model_template.setdefault("source", grid.get("base", "smollm2-135m"))
    train = dict(grid.get("train") or {})
    runs = []
    for dup in dups:
        parts = [{"benchmark": key, **(how or {}), "duplication": dup} for key, how in injected.items()]
        model = copy.deepcopy(model_template)
        model["inject"] = {**copy.deepcopy(train), "partitions": parts}
        runs.append(GridRun(name=f"dup{dup}", duplication=dup, model=model, injected_corpus=corpus_kind == "injected"))
    return runs
