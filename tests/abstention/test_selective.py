"""Chapter 11's selective prediction: threshold choice on validation, risk–coverage, AURC, scores."""

from __future__ import annotations

import numpy as np
import pytest
from abstention.abstention_fixtures import PARAMS, sampled

from cropcop_utils.abstention.selective import (
    SCORES,
    apply_threshold,
    aurc,
    choose_threshold,
    confidence_scores,
    risk_coverage,
    selective_block,
)


# --------------------------------------------------------------------------- selective prediction
def test_threshold_is_the_lowest_that_meets_the_target_on_validation():
    score = np.array([0.9, 0.8, 0.7, 0.6])
    correct = np.array([True, True, False, True])
    assert choose_threshold(score, correct, 0.0)["threshold"] == 0.8
    wide = choose_threshold(score, correct, 0.3)
    assert wide["threshold"] == 0.6 and wide["val_coverage"] == 1.0 and wide["val_selective_risk"] == 0.25


def test_threshold_accepts_or_rejects_a_tie_as_a_whole():
    choice = choose_threshold(np.array([0.9, 0.8, 0.8]), np.array([True, True, False]), 0.0)
    assert choice["threshold"] == 0.9 and choice["val_coverage"] == pytest.approx(1 / 3)


def test_unreachable_target_abstains_on_everything_and_says_so():
    choice = choose_threshold(np.array([0.9, 0.5]), np.array([False, True]), 0.01)
    assert not choice["target_met_on_val"] and choice["threshold"] > 0.9 and choice["reason"]
    applied = apply_threshold(np.array([0.9, 0.5]), np.array([False, True]), choice["threshold"])
    assert applied["coverage"]["value"] == 0.0
    risk = applied["selective_risk"]
    assert risk["value"] is None and "no accepted rows" in risk["reason"]


def test_threshold_choice_uses_validation_only():
    val = sampled(600, 4, 1.0, seed=3)
    test_a, test_b = sampled(500, 4, 1.0, seed=4), sampled(300, 4, 2.0, seed=5)
    first, _ = selective_block(val, test_a, 1.3, PARAMS)
    second, _ = selective_block(val, test_b, 1.3, PARAMS)
    for name in SCORES:
        assert first[name]["choice"] == second[name]["choice"]
        assert first[name]["test"]["n"] == 500 and second[name]["test"]["n"] == 300
    changed_val, _ = selective_block(sampled(600, 4, 1.0, seed=6), test_a, 1.3, PARAMS)
    assert any(changed_val[n]["choice"] != first[n]["choice"] for n in SCORES)


def test_risk_coverage_and_aurc_of_a_perfect_ranking():
    score = np.array([0.9, 0.8, 0.3, 0.2])
    correct = np.array([True, True, False, False])
    coverage, risk = risk_coverage(score, correct)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 0, 1 / 3, 0.5])
    assert aurc(score, correct) == pytest.approx((1 / 3 + 0.5) / 4)


def test_confidence_scores_rank_a_confident_row_first():
    logits = np.array([[5.0, 0.0, 0.0], [1.0, 0.9, 0.0]])
    for name, values in confidence_scores(logits, 1.5).items():
        assert values[0] > values[1], name
