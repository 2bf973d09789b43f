"""Chapter 11's split conformal sets: coverage near nominal on exchangeable data."""

from __future__ import annotations

import pytest
from abstention.abstention_fixtures import sampled
from scipy import special

from cropcop_utils.abstention.conformal import conformal_sets, per_class_coverage, set_summary


# --------------------------------------------------------------------------- conformal prediction
@pytest.mark.parametrize("conditional", [False, True])
def test_conformal_coverage_on_exchangeable_data_is_near_nominal(conditional):
    logits, y = sampled(6000, 5, 1.0, seed=7, spread=1.5)
    prob = special.softmax(logits, axis=1)
    cal, test = slice(0, 2000), slice(2000, None)
    for level in (0.90, 0.95):
        sets = conformal_sets(prob[cal], y[cal], prob[test], level, seed=0, class_conditional=conditional)
        summary = set_summary(sets, y[test])
        assert abs(summary["coverage"]["value"] - level) <= 0.02, (level, summary)
        assert 1.0 <= summary["mean_set_size"] <= 5.0
        if conditional:
            per_class = per_class_coverage(sets, y[test], 5)
            assert (per_class["coverage"] - level).abs().max() <= 0.05
