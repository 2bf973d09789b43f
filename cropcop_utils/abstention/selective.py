"""Selective prediction: the confidence scores, risk–coverage curves and AURC, the abstention threshold
chosen on validation and applied once to test, and :func:`proportion` (a share with its Wilson
interval) — and :func:`selective_block`, which measures one state for every score.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import special, stats

from .calibration import probabilities
from .records import AbstentionInputError

SCORES = ("msp", "margin", "energy")
SCORE_LABELS = {"msp": "max softmax (calibrated)", "margin": "top-1 − top-2 probability (calibrated)",
                "energy": "negative energy T·logsumexp(z/T)"}


def proportion(successes: int, n: int, level: float = 0.95, what: str = "rows") -> dict[str, Any]:
    """A share with its Wilson interval (scipy); ``None`` with a reason when there are no rows."""
    if n == 0:
        return {"value": None, "ci": None, "n": 0, "reason": f"no {what}: the share is undefined"}
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return {"value": successes / n, "ci": [float(ci.low), float(ci.high)], "n": int(n)}


def confidence_scores(logits: np.ndarray, temperature: float) -> dict[str, np.ndarray]:
    """Higher = more confident, for each score of :data:`SCORES` (all on the calibrated logits)."""
    prob = probabilities(logits, temperature)
    top2 = -np.sort(-prob, axis=1)[:, :2] if prob.shape[1] > 1 else np.c_[prob, np.zeros(len(prob))]
    energy = temperature * special.logsumexp(np.asarray(logits, dtype=np.float64) / temperature, axis=1)
    return {"msp": top2[:, 0], "margin": top2[:, 0] - top2[:, 1], "energy": energy}


def risk_coverage(score: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, selective risk) accepting the k most confident rows, k = 1..N (ties in row order)."""
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")
    errors = np.cumsum(~np.asarray(correct, dtype=bool)[order])
    k = np.arange(1, len(order) + 1)
    return k / len(order), errors / k


def aurc(score: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk–coverage curve: the mean selective risk over k = 1..N accepted rows."""
    if len(score) == 0:
        raise AbstentionInputError("AURC needs rows")
    return float(risk_coverage(score, correct)[1].mean())


def choose_threshold(val_score: np.ndarray, val_correct: np.ndarray, target_risk: float) -> dict[str, Any]:
    """The lowest threshold whose accepted validation rows (score ≥ threshold) have risk ≤ target.

    Takes validation rows only: the test split cannot move it.  Thresholds sit at distinct score
    values, so a tie is accepted or rejected as a whole.  When no threshold meets the target, the
    threshold is just above the highest validation score (abstain on everything) and that is said.
    """
    score = np.asarray(val_score, dtype=np.float64)
    if score.size == 0:
        raise AbstentionInputError("the abstention threshold is chosen on validation rows; there are none")
    order = np.argsort(-score, kind="stable")
    ranked = score[order]
    risk = np.cumsum(~np.asarray(val_correct, dtype=bool)[order]) / np.arange(1, len(ranked) + 1)
    ends = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])  # last row of each tie group
    meets = ends[risk[ends] <= target_risk]
    if meets.size == 0:
        return {"threshold": float(np.nextafter(ranked[0], np.inf)), "target_met_on_val": False,
                "val_coverage": 0.0, "val_selective_risk": None,
                "reason": f"no threshold keeps the validation risk at or below {target_risk}: "
                          "the recipe abstains on every input"}
    k = int(meets.max())
    return {"threshold": float(ranked[k]), "target_met_on_val": True,
            "val_coverage": (k + 1) / len(ranked), "val_selective_risk": float(risk[k])}


def apply_threshold(score: np.ndarray, correct: np.ndarray | None, threshold: float,
                    level: float = 0.95) -> dict[str, Any]:
    """Coverage and selective risk (Wilson intervals) of rows accepted at ``score ≥ threshold``."""
    accepted = np.asarray(score, dtype=np.float64) >= threshold
    out = {"n": int(accepted.size), "accepted": int(accepted.sum()),
           "coverage": proportion(int(accepted.sum()), accepted.size, level, "rows")}
    if correct is not None:
        wrong = ~np.asarray(correct, dtype=bool)
        out["selective_risk"] = proportion(int(wrong[accepted].sum()), int(accepted.sum()), level,
                                           "accepted rows")
        out["risk_all"] = proportion(int(wrong.sum()), accepted.size, level, "rows")
    return out


def selective_block(val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                    temperature: float, params: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """AURC on test and the validation-chosen threshold applied once to test, for every score."""
    level, target = float(params["ci_level"]), float(params["target_risk"])
    val_scores = confidence_scores(val[0], temperature)
    test_scores = confidence_scores(test[0], temperature)
    val_ok, test_ok = val[0].argmax(axis=1) == val[1], test[0].argmax(axis=1) == test[1]
    out, curves = {}, []
    for name in SCORES:
        chosen = choose_threshold(val_scores[name], val_ok, target)
        coverage, risk = risk_coverage(test_scores[name], test_ok)
        keep = np.unique(np.linspace(0, len(coverage) - 1, int(params["curve_points"])).astype(int))
        curves.append(pd.DataFrame({"score": name, "coverage": coverage[keep], "risk": risk[keep]}))
        out[name] = {"aurc": aurc(test_scores[name], test_ok), "choice": chosen,
                     "test": apply_threshold(test_scores[name], test_ok, chosen["threshold"], level)}
    return out, pd.concat(curves, ignore_index=True)
