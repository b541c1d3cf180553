"""Allocation-quality regression on the real SmolLM2 (slow): alignment must cost about no quality.

``gac`` and ``knapsack`` run the same allocator on the same plan (same calibration, objective,
window and budget); ``gac`` is restricted to aligned ranks. If a change makes alignment costly
(a candidate bug, a broken fill pass, a window that excludes good dims), gac's perplexity drifts
above knapsack's and this fails.
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.slow


def test_gac_within_two_percent_of_the_unaligned_knapsack():
    from gac.api import CompressConfig, apply_, plan
    from gac.compressors.calibration import CalibrationConfig, calibration_batches
    from gac.data import load_text, tokenize
    from gac.eval.ppl import perplexity_of_ids
    from gac.hardware.profile import default_profile
    from gac.models import load_model

    lm = load_model("smollm2")
    batches = calibration_batches(lm.tokenizer, CalibrationConfig("britannica", 16, 256, batch_size=4))
    cfg = CompressConfig(compressor="svd-llm", param_ratio=0.9, options={"svd_dtype": "float32"})
    p = plan(lm.model, cfg, calib_batches=batches, profile=default_profile())  # one calibration
    ids = tokenize(lm.tokenizer, load_text("britannica", "test"))
    # The default objective only: with ``objective="curve"`` this run measured gac 51.09 vs knapsack
    # 44.96 (alignment is not free when the whole loss curve is trusted; see docs/allocation.md).
    for objective in ("paper",):
        ppl, allocs = {}, {}
        for align in ("knapsack", "gac"):
            m = copy.deepcopy(lm.model)
            allocs[align] = p.allocation(align, objective=objective)
            apply_(m, p, allocs[align])
            ppl[align] = perplexity_of_ids(m, ids, seq_len=512, max_windows=4)["ppl"]
        assert allocs["gac"].pct_aligned == 100.0 and allocs["knapsack"].pct_aligned < 100.0
        assert allocs["gac"].cost <= p.budget and allocs["knapsack"].cost <= p.budget
        assert ppl["gac"] <= 1.02 * ppl["knapsack"], (objective, ppl)
