"""Guided prompting holds its null on the clean slices of ``test_null_calibration`` (issue #13).

Its own module only so that pytest-xdist can run it beside the membership and sharded tests (a module is
one worker's unit of work): same model, same 20 clean slices. Its engine generates in batches of 48 (the
scoring tests' 16 would split a slice's 40 prompts into four short batches: a decoding step of 7 or 13 rows
costs most of one of 48 on a CPU, measured 2026-11-28: the 20 slices in 0.73 of the time of batches of 16).
"""

from __future__ import annotations

import pytest

from contamray.engines.hf import HFEngine
from contamray.methods.base import get_method
from contamray.validate.calibrate import SharedEngines, decide
from tests import test_null_calibration as calibration
from tests.test_null_calibration import MAX_FLAGS, N_SLICES, _decisions

pytestmark = pytest.mark.slow
clean_slices = calibration.clean_slices  # the fixture, shared


@pytest.fixture(scope="module")
def engines(contaminated_model) -> SharedEngines:
    return SharedEngines({"target": HFEngine(contaminated_model.path, dtype="float32", batch_size=48)})


def test_guided_prompting_holds_its_null_on_clean_slices(engines, clean_slices):
    """Algorithm 1 (exact sign flip on ROUGE-L guided - general) on the 20 slices of 20 instances.

    Measured (2026-11-28, batches of 48): 0 flagged, 19 clean, 1 inconclusive (fewer than 5 instances whose
    guided and general completions differ); in batches of 16 (2026-11-24) 0 flagged, 16 clean, 4 inconclusive -
    greedy completions at near-ties follow a forward pass's last bits, which follow its batch. On the paper's 10
    instances per slice it flagged 2 and left 14 inconclusive."""
    method = get_method("guided_prompting")
    cfg = method.make_config({"max_tokens": 12, "seed": 0})
    parts = [part for adapter_parts in clean_slices.values() for part in adapter_parts]
    verdicts = [decide(method, cfg, engines.run(method, part, cfg)) for part in parts]
    count = _decisions(verdicts)
    print("guided prompting (Algorithm 1) on 20 clean slices:", count, [(v.decision, v.p_value) for v in verdicts])
    assert count["contaminated"] <= MAX_FLAGS, count
    assert count["clean"] >= N_SLICES, count  # most slices decide
