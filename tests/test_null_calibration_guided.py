"""Guided prompting holds its null on the clean slices of ``test_null_calibration`` (issue #13).

Its own module only so that pytest-xdist can run it beside the membership and sharded tests (a module is
one worker's unit of work): same model, same 20 clean slices, same fixtures.
"""

from __future__ import annotations

import pytest

from contamray.methods.base import get_method
from contamray.validate.calibrate import decide
from tests import test_null_calibration as calibration
from tests.test_null_calibration import MAX_FLAGS, N_SLICES, _decisions

pytestmark = pytest.mark.slow
engines, clean_slices = calibration.engines, calibration.clean_slices  # the fixtures, shared


def test_guided_prompting_holds_its_null_on_clean_slices(engines, clean_slices):
    """Algorithm 1 (exact sign flip on ROUGE-L guided - general) on the 20 slices of 20 instances.

    Measured (2026-11-24): 0 flagged, 16 clean, 4 inconclusive. On the paper's 10 instances per slice it
    flagged 2 and left 14 inconclusive (fewer than 5 instances whose guided and general completions differ)."""
    method = get_method("guided_prompting")
    cfg = method.make_config({"max_tokens": 12, "seed": 0})
    parts = [part for adapter_parts in clean_slices.values() for part in adapter_parts]
    verdicts = [decide(method, cfg, engines.run(method, part, cfg)) for part in parts]
    count = _decisions(verdicts)
    print("guided prompting (Algorithm 1) on 20 clean slices:", count, [(v.decision, v.p_value) for v in verdicts])
    assert count["contaminated"] <= MAX_FLAGS, count
    assert count["clean"] >= N_SLICES, count  # most slices decide
