"""``benchmarks.<key>.heldout``: a benchmark's held-out partition, named once for every held-out test of a run.

The held-out tests (the membership scores, the held-out accuracy gap, TS-Guessing, CDD, DCQ, name cloze) compare
a partition with a partition of the same benchmark *known unseen*: each method's ``reference`` (a mapping
benchmark key -> key of its held-out). That the held-out is unseen is the user's assertion - no run can know it
(a held-out drawn from a split the model trained on whole is as contaminated as the partition, and the test would
answer "clean") - so it is never drawn automatically; but it is one fact about the benchmark, not about each
method, and a run testing a benchmark with eight held-out methods would otherwise state it eight times::

    benchmarks:
      arc_challenge: {heldout: arc_challenge_heldout}
      arc_challenge_heldout: {adapter: arc_challenge, split: test, offset: 20, limit: 20, sample: first}

``resolve_heldouts`` completes each held-out method's ``reference`` from these keys before the plan reads it: a
method's own mapping wins for the benchmarks it names, and a method whose ``reference`` is one key (the same
reference for every benchmark) keeps it. The key leaves the benchmark's spec, so a run that names its held-outs
either way plans - and hashes - the same cells. The plan checks the held-out as it checks a method's reference
(the same benchmark, rows that cannot overlap), naming this key in its errors. An experiment's ``heldout`` left for a
benchmark the command line deselected (``benchmark=[...]``: the block holds nothing else) is ignored, with the held-out
it names when nothing else reads that, and ``corpus.clean`` forgets both - each with a warning.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from contamray.methods.base import get_method

log = logging.getLogger(__name__)

KEY = "heldout"


def has_reference(spec: Any) -> bool:
    """Whether the method a ``methods.<label>`` block selects compares with a reference partition
    (``Method.uses_reference``)."""
    if not isinstance(spec, dict):
        return False
    try:
        return get_method(str(spec.get("method"))).uses_reference
    except KeyError:
        return False  # an unknown method: the plan names it


def benchmark_heldouts(benchmarks: dict[str, Any]) -> dict[str, str]:
    """Benchmark key -> its held-out's key, from ``benchmarks.<key>.heldout``. Raises ValueError naming the key
    when the value is not another benchmark of the run reading the same dataset."""
    out: dict[str, str] = {}
    for name, spec in benchmarks.items():
        if not isinstance(spec, dict) or spec.get(KEY) in (None, ""):
            continue
        value, where = spec[KEY], f"benchmarks.{name}.{KEY}"
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected the key of another benchmark of this run, got {value!r}")
        if value == name:
            raise ValueError(f"{where}: a partition is not held out from itself; name another benchmark key, e.g. "
                             f"{name}_heldout with adapter: {spec.get('adapter')} and rows the test does not read "
                             "(offset with sample: first)")  # fmt: skip
        if value not in benchmarks:
            raise ValueError(f"{where}: {value!r} is not a benchmark of this run; add it under benchmarks: (another "
                             f"split, draw or block of {spec.get('adapter')}), or choose one of "
                             f"{', '.join(k for k in benchmarks if k != name)}")  # fmt: skip
        other = benchmarks[value] if isinstance(benchmarks[value], dict) else {}
        if other.get("adapter") != spec.get("adapter"):
            raise ValueError(
                f"{where}: {value} is {other.get('adapter')}, not {spec.get('adapter')}: a held-out is a partition "
                f"of the same benchmark known unseen (a score difference between benchmarks says one is easier or "
                "more web-like, not that it leaked); for a cross-benchmark comparison set a method's reference with "
                "mode: distribution instead"
            )
        out[name] = value
    return out


def resolve_heldouts(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``config`` (a plain mapping, as composed) with ``benchmarks.<key>.heldout`` moved into the ``reference`` of
    each method that has one (``has_reference``), and the held-outs found. Raises ValueError naming the key
    (``benchmark_heldouts``).

    A benchmark the command line deselected (``benchmark=[...]``) leaves, in an experiment that named its
    held-out, a block that holds only ``heldout``: it goes, with its held-out when nothing else of the run names
    that one (another benchmark's ``heldout``, a method's ``reference``) - a held-out is a yardstick, and tested
    alone it would only answer "inconclusive, no reference" under every held-out method - and ``corpus.clean``
    forgets both keys. Each is said in a warning."""
    benchmarks = config.get("benchmarks") or {}
    if not any(isinstance(s, dict) and KEY in s for s in benchmarks.values()):
        return config, {}
    out = copy.deepcopy(config)
    dropped = _drop_deselected(out)
    heldouts = benchmark_heldouts(out["benchmarks"])
    for spec in out["benchmarks"].values():
        if isinstance(spec, dict):
            spec.pop(KEY, None)
    for spec in (out.get("methods") or {}).values():
        if not heldouts or not has_reference(spec):
            continue
        own = spec.get("reference")
        if isinstance(own, str) and own:
            continue  # one reference for every benchmark: the method's own choice
        spec["reference"] = {**heldouts, **(own if isinstance(own, dict) else {})}
    _forget_in_corpus(out, dropped)
    return out, heldouts


def _drop_deselected(config: dict[str, Any]) -> set[str]:
    """Remove the blocks an experiment left for deselected benchmarks (only ``heldout``), and their held-outs
    that nothing else of the run names; returns the keys removed."""
    benchmarks = config["benchmarks"]
    stubs = {name: spec[KEY] for name, spec in benchmarks.items() if isinstance(spec, dict) and set(spec) == {KEY}}
    for name in stubs:
        del benchmarks[name]
    named = {spec.get(KEY) for spec in benchmarks.values() if isinstance(spec, dict)}
    for spec in (config.get("methods") or {}).values():
        ref = spec.get("reference") if isinstance(spec, dict) else None
        named |= set(ref.values()) if isinstance(ref, dict) else {ref}
    dropped = set(stubs)
    for name, heldout in stubs.items():
        orphan = isinstance(heldout, str) and heldout in benchmarks and heldout not in named
        if orphan:
            del benchmarks[heldout]
            dropped.add(heldout)
        log.warning("benchmarks.%s: heldout set (%s) but the benchmark is not selected (benchmark=[...]); ignored%s",
                    name, heldout, f", and {heldout} (its held-out, nothing else of the run reads it) with it"
                    if orphan else "")  # fmt: skip
    return dropped


def _forget_in_corpus(config: dict[str, Any], dropped: set[str]) -> None:
    """``corpus.clean`` without the benchmark keys the deselection removed (it names benchmarks of the run)."""
    corpus = config.get("corpus")
    clean = corpus.get("clean") if isinstance(corpus, dict) else None
    if not dropped or not clean:
        return
    clean = [clean] if isinstance(clean, str) else list(clean)
    gone = [name for name in clean if name in dropped]
    if gone:
        log.warning("corpus.clean: %s not selected (benchmark=[...]); ignored", ", ".join(gone))
        corpus["clean"] = [name for name in clean if name not in dropped]
