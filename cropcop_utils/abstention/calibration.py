"""Calibration: softmax probabilities at a temperature, NLL, the temperature fit on validation, Brier,
expected calibration error and its equal-mass reliability bins — and :func:`calibration_block`, which
measures one state before and after scaling.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, special
from sklearn.metrics import brier_score_loss

from ..core import metrics
from .records import AbstentionInputError

TEMPERATURE_BOUNDS = (0.05, 20.0)


# --------------------------------------------------------------------------- statistics
def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return special.softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=1)


def nll(logits: np.ndarray, y: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true class (natural log)."""
    log_prob = special.log_softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=1)
    return float(-log_prob[np.arange(len(y)), y].mean())


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """The temperature T minimising the NLL of softmax(z / T) on these (validation) rows.

    scipy's bounded scalar minimiser over log T: one parameter, a convex objective in 1/T, so a library
    calibrator (netcal) would add a dependency for the same number.
    """
    if len(y) == 0:
        raise AbstentionInputError("temperature scaling needs validation rows; the record has none")
    low, high = np.log(TEMPERATURE_BOUNDS)
    result = optimize.minimize_scalar(lambda log_t: nll(logits, y, float(np.exp(log_t))),
                                      bounds=(low, high), method="bounded", options={"xatol": 1e-5})
    return float(np.exp(result.x))


def brier(prob: np.ndarray, y: np.ndarray) -> float:
    """Multiclass Brier score: mean over rows of the squared distance to the one-hot label (scikit-learn)."""
    return float(brier_score_loss(y, prob, labels=np.arange(prob.shape[1])))


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    """ECE over ``n_bins`` equal-mass bins of the top-1 confidence: Σ (n_b / N) · |accuracy_b − confidence_b|.

    Written here because netcal (and scikit-learn's ``calibration_curve``) bin by equal width or need
    one class; equal-mass bins over the top-1 confidence are a few lines.  Rows are sorted by
    confidence (stable) and split into bins whose sizes differ by at most one.
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        raise AbstentionInputError("ECE needs rows")
    order = np.argsort(confidence, kind="stable")
    gap = sum(len(b) * abs(correct[b].mean() - confidence[b].mean())
              for b in np.array_split(order, min(n_bins, len(order))))
    return float(gap / len(order))


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> pd.DataFrame:
    """The equal-mass bins of :func:`expected_calibration_error`: rows, mean confidence, accuracy."""
    order = np.argsort(np.asarray(confidence, dtype=np.float64), kind="stable")
    parts = np.array_split(order, min(n_bins, len(order)))
    return pd.DataFrame({"bin": np.arange(len(parts)), "rows": [len(b) for b in parts],
                         "confidence": [float(np.mean(confidence[b])) for b in parts],
                         "accuracy": [float(np.mean(correct[b])) for b in parts]})


# --------------------------------------------------------------------------- one state
def calibration_block(logits: np.ndarray, y: np.ndarray, temperature: float, params: dict[str, Any],
                      indices: np.ndarray) -> tuple[dict[str, Any], pd.DataFrame]:
    """NLL, Brier and ECE (bootstrap interval over ``indices``) before (T = 1) and after scaling."""
    out, bins = {}, []
    level, n_bins = float(params["ci_level"]), int(params["ece_bins"])
    for stage, t in (("before", 1.0), ("after", temperature)):
        prob = probabilities(logits, t)
        confidence, correct = prob.max(axis=1), prob.argmax(axis=1) == y
        resampled = np.array([expected_calibration_error(confidence[i], correct[i], n_bins) for i in indices])
        low, high = metrics.interval(resampled, level)
        out[stage] = {"temperature": t, "nll": nll(logits, y, t), "brier": brier(prob, y),
                      "ece": expected_calibration_error(confidence, correct, n_bins), "ece_ci": [low, high],
                      "accuracy": float(correct.mean())}
        bins.append(reliability_bins(confidence, correct, n_bins).assign(stage=stage))
    return out, pd.concat(bins, ignore_index=True)
