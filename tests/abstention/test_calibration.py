"""Chapter 11's calibration: temperature fit, NLL, Brier, ECE and its bins."""

from __future__ import annotations

import numpy as np
import pytest
from abstention.abstention_fixtures import sampled

from cropcop_utils.abstention.calibration import (
    brier,
    expected_calibration_error,
    fit_temperature,
    nll,
    probabilities,
    reliability_bins,
)


# --------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_temperature_fit_recovers_a_known_temperature(true_t):
    logits, y = sampled(20000, 6, true_t, seed=1)
    assert fit_temperature(logits, y) == pytest.approx(true_t, rel=0.05)


def test_temperature_scaling_lowers_nll_of_overconfident_logits():
    logits, y = sampled(4000, 5, 3.0, seed=2)
    t = fit_temperature(logits, y)
    assert nll(logits, y, t) < nll(logits, y)
    assert brier(probabilities(logits, t), y) < brier(probabilities(logits), y)


def test_ece_matches_a_hand_computed_case():
    # sorted by confidence: bin 1 = {0.4 right, 0.6 wrong}: accuracy 0.5, confidence 0.5 -> gap 0;
    # bin 2 = {0.8 right, 0.9 right}: accuracy 1, confidence 0.85 -> gap 0.15; ECE = 2/4 * 0.15
    confidence = np.array([0.9, 0.8, 0.6, 0.4])
    correct = np.array([True, True, False, True])
    assert expected_calibration_error(confidence, correct, n_bins=2) == pytest.approx(0.075)
    # one bin: |3/4 - 0.675|
    assert expected_calibration_error(confidence, correct, n_bins=1) == pytest.approx(0.075)
    # as many bins as rows: mean |correct - confidence| = (0.1 + 0.2 + 0.6 + 0.6) / 4
    assert expected_calibration_error(confidence, correct, n_bins=15) == pytest.approx(0.375)


def test_ece_bins_have_equal_mass():
    rng = np.random.default_rng(0)
    bins = reliability_bins(rng.random(47), rng.random(47) < 0.5, n_bins=15)
    assert len(bins) == 15 and bins["rows"].sum() == 47 and bins["rows"].max() - bins["rows"].min() <= 1
    assert bins["confidence"].is_monotonic_increasing


def test_brier_is_the_mean_squared_distance_to_the_one_hot_label():
    prob = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    assert brier(prob, np.array([0, 2])) == pytest.approx((0.09 + 0.04 + 0.01 + 0.01 + 0.64 + 0.81) / 2)
