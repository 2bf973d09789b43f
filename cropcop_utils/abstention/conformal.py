"""Split conformal prediction (``crepes``): prediction sets calibrated on validation, marginal and
class-conditional (Mondrian by label), their coverage and size, per-class coverage — and
:func:`conformal_block`, which measures one state at every nominal level.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .selective import proportion


# --------------------------------------------------------------------------- conformal prediction
def conformal_sets(cal_prob: np.ndarray, cal_y: np.ndarray, prob: np.ndarray, confidence: float,
                   seed: int = 0, class_conditional: bool = False) -> np.ndarray:
    """Split conformal prediction sets (rows × classes, bool) with ``crepes``, hinge non-conformity.

    Calibrated on (``cal_prob``, ``cal_y``) — validation rows.  ``class_conditional`` makes it Mondrian
    by label (each candidate class is judged against the calibration rows of that class), which keeps
    the coverage of small classes near nominal where a marginal set under-covers them.
    """
    from crepes import ConformalClassifier
    from crepes.extras import hinge

    classes = np.arange(prob.shape[1])
    cal_alphas = hinge(cal_prob, classes, np.asarray(cal_y))
    alphas = hinge(prob)
    if not class_conditional:
        return ConformalClassifier().fit(cal_alphas).predict_set(alphas, confidence=confidence,
                                                                 seed=seed).astype(bool)
    mondrian = ConformalClassifier().fit(cal_alphas, bins=np.asarray(cal_y))
    # crepes' WrapClassifier(class_cond=True) does the same: one p-value column per candidate class.
    p_values = np.column_stack([mondrian.predict_p(alphas[:, c], bins=np.full(len(prob), c), seed=seed + c)
                                for c in classes]) if len(prob) else np.zeros(prob.shape)
    return p_values >= 1.0 - confidence


def set_summary(sets: np.ndarray, y: np.ndarray, level: float = 0.95) -> dict[str, Any]:
    """Coverage (with Wilson interval), mean set size and the shares of singleton and empty sets."""
    sizes = sets.sum(axis=1)
    if len(y) == 0:
        return {"n": 0, "coverage": proportion(0, 0, level), "mean_set_size": None, "singleton_share": None,
                "empty_share": None, "reason": "no rows"}
    covered = sets[np.arange(len(y)), y]
    return {"n": int(len(y)), "coverage": proportion(int(covered.sum()), len(y), level),
            "mean_set_size": float(sizes.mean()), "singleton_share": float(np.mean(sizes == 1)),
            "empty_share": float(np.mean(sizes == 0))}


def per_class_coverage(sets: np.ndarray, y: np.ndarray, n_classes: int) -> pd.DataFrame:
    covered = sets[np.arange(len(y)), y] if len(y) else np.zeros(0, dtype=bool)
    rows = []
    for label in range(n_classes):
        member = y == label
        n = int(member.sum())
        rows.append({"label": label, "rows": n, "coverage": float(covered[member].mean()) if n else None,
                     "mean_set_size": float(sets[member].sum(axis=1).mean()) if n else None})
    return pd.DataFrame(rows)


def conformal_block(val_prob: np.ndarray, val_y: np.ndarray, prob: np.ndarray, y: np.ndarray,
                    params: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """Marginal and class-conditional split conformal sets at each nominal level: summary, per class."""
    out, per_class = {}, []
    for level in params["conformal_levels"]:
        key = f"{round(100 * float(level))}"
        out[key] = {}
        for method, conditional in (("marginal", False), ("class_conditional", True)):
            sets = conformal_sets(val_prob, val_y, prob, float(level), int(params["seed"]), conditional)
            out[key][method] = {"nominal": float(level), **set_summary(sets, y, float(params["ci_level"]))}
            per_class.append(per_class_coverage(sets, y, prob.shape[1]).assign(level=float(level),
                                                                                method=method))
    return out, pd.concat(per_class, ignore_index=True)
