"""What a score allows, read in hindsight: could *any* pair of thresholds on it meet every target of the
profile on the held-back sets themselves?

The recipe's thresholds are fitted on validation only (:mod:`.protection`).  When it misses a target, a
reader must know whether a better rule could have done it or whether the score itself cannot: this
module sweeps a grid of outlier thresholds (validation quantiles from the median to the largest value, and
one answering every input) × confidence thresholds (validation max-softmax quantiles up to the median,
and none), and measures each pair on the evaluated sets.  Its thresholds are read off the evaluated sets,
which no recipe may do, so nothing here ever reaches the recipe: it is a diagnosis.  A score with no pair
meeting every target cannot meet them under any validation-only rule either.

A grid sweep, not a library call: the detectors and metrics libraries (pytorch-ood, crepes) give one
operating point or a one-score curve, not the joint feasibility of two thresholds against several sets'
targets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

STEPS = 201  # grid points per threshold: 0.25 % of validation apart


def _answered(score: np.ndarray, msp: np.ndarray, thresholds: np.ndarray, confidences: np.ndarray,
              weight: np.ndarray) -> np.ndarray:
    """(thresholds × confidences) the weighted count of rows answered: outlier score within the threshold
    and calibrated max softmax at least the confidence threshold."""
    within = (score[None, :] <= thresholds[:, None]).astype(np.float64)
    confident = (msp[None, :] >= confidences[:, None]).astype(np.float64)
    return within @ (confident * weight[None, :]).T


def frontier(val_score: np.ndarray, val_msp: np.ndarray, sets: dict[str, dict[str, Any]],
             targets: dict[str, float], near_kinds: list[str], steps: int = STEPS) -> dict[str, Any]:
    """The best pair of thresholds for one score in hindsight, and how many grid pairs meet every target.

    ``sets``: name → {"kind": "in_scope" | "far" | "near", "score", "msp", "correct" (in scope)}; the lab
    test is the in-scope set named ``lab_test``, every other in-scope set a field cohort.  Targets: each far
    kind and each of ``near_kinds`` rejected, each field cohort answered and right among those answered, the
    lab test answered and its error among those answered (``targets`` as in ``protection.TARGET_DEFAULTS``).
    The best pair maximises the *slack*: the smallest margin over every target (a share minus its target;
    the lab's risk target minus its risk).  Returns the grid's size, the pairs meeting every target, the
    best slack with the target that binds there, that pair's validation share kept and confidence
    threshold, and every set's figures at it."""
    val_score, val_msp = np.asarray(val_score, dtype=np.float64), np.asarray(val_msp, dtype=np.float64)
    everything = max(float(np.max(v)) for v in [val_score, *(s["score"] for s in sets.values())] if len(v))
    thresholds = np.r_[np.quantile(val_score, np.linspace(0.5, 1.0, steps)), everything]
    confidences = np.r_[0.0, np.quantile(val_msp, np.linspace(0.0, 0.5, steps))]
    margins: dict[str, np.ndarray] = {}
    shares: dict[str, dict[str, np.ndarray]] = {}
    for name, s in sets.items():
        score, msp = np.asarray(s["score"], dtype=np.float64), np.asarray(s["msp"], dtype=np.float64)
        n = len(score)
        if n == 0:
            continue
        answered = _answered(score, msp, thresholds, confidences, np.ones(n)) / n
        if s["kind"] == "in_scope":
            right = _answered(score, msp, thresholds, confidences, np.asarray(s["correct"], dtype=np.float64))
            accuracy = right / np.maximum(answered * n, 1)  # nothing answered: 0 right, a missed target
            shares[name] = {"answered": answered, "right": accuracy}
            if name == "lab_test":
                margins[f"{name} answered"] = answered - targets["lab_coverage"]
                margins[f"{name} risk"] = targets["lab_selective_risk"] - (1.0 - accuracy)
            else:
                margins[f"{name} answered"] = answered - targets["field_coverage"]
                margins[f"{name} right"] = accuracy - targets["field_selective_accuracy"]
        else:
            shares[name] = {"rejected": 1.0 - answered}
            if s["kind"] == "far" or name in near_kinds:
                goal = targets["far_rejection" if s["kind"] == "far" else "near_rejection"]
                margins[f"{name} rejected"] = 1.0 - answered - goal
    if not margins:
        return {"pairs": int(thresholds.size * confidences.size), "pairs_meeting_all": None,
                "best_slack": None, "shortfall": None, "binding": None, "figures": {}}
    stacked = np.stack(list(margins.values()))
    slack = stacked.min(axis=0)
    a, b = np.unravel_index(int(np.argmax(slack)), slack.shape)
    return {
        "pairs": int(slack.size),
        "pairs_meeting_all": int((slack >= 0).sum()),
        "best_slack": float(slack[a, b]),
        "shortfall": float(max(0.0, -slack[a, b])),  # how far the best pair falls short (0: it meets all)
        "binding": list(margins)[int(np.argmin(stacked[:, a, b]))],
        "val_kept": float((val_score <= thresholds[a]).mean()),
        "confidence_threshold": float(confidences[b]),
        "figures": {name: {k: float(v[a, b]) for k, v in fig.items()} for name, fig in shares.items()},
    }


def frontiers(val_scores: dict[str, np.ndarray], val_msp: np.ndarray, sets: dict[str, dict[str, Any]],
              targets: dict[str, float], near_kinds: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`frontier` for every candidate score (``sets[name]["scores"]``: candidate → outlier score, as
    chapter 11 keeps them)."""
    return {name: frontier(val_scores[name], val_msp,
                           {set_name: {**s, "score": s["scores"][name]} for set_name, s in sets.items()},
                           targets, near_kinds)
            for name in val_scores}
