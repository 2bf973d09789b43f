"""The split-membership probe: can a classifier tell the test rows from the train rows?

Out-of-fold ROC AUC over StratifiedGroupKFold folds of the leakage groups, with a percentile-bootstrap
interval from :func:`auc_resamples` (the Mann–Whitney AUC of every resample at once).  Near 0.5 means the
split is coherent.  Its own module: a different question (train vs test, not the class) and its own
cross-validation and AUC code.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import metrics
from .classifiers import _entry, _n_features, _take, make_classifier
from .errors import ProbeInputError


# --------------------------------------------------------------------------- membership
def auc_resamples(target: np.ndarray, score: np.ndarray, indices: np.ndarray, chunk: int = 128) -> np.ndarray:
    """ROC AUC on each bootstrap resample (Mann–Whitney form: rank-sum of positives, ties averaged).

    Hand-rolled because ``roc_auc_score`` takes one sample per call; on the full rows it equals
    scikit-learn's value (the tests check that).  NaN for a resample that drew one class only.
    """
    from scipy.stats import rankdata

    target = np.asarray(target, dtype=bool)
    score = np.asarray(score, dtype=np.float64)
    out = []
    for start in range(0, indices.shape[0], chunk):
        block = indices[start:start + chunk]
        positive = target[block]
        ranks = rankdata(score[block], axis=1)
        n_pos = positive.sum(axis=1).astype(np.float64)
        n_neg = positive.shape[1] - n_pos
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(((ranks * positive).sum(axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return np.concatenate(out) if out else np.zeros(0)


def membership_probe(x: Any, split: np.ndarray, groups: np.ndarray, classifier: str, params: dict[str, Any],
                     categorical: Sequence[str] = (), labels: np.ndarray | None = None) -> dict[str, Any]:
    """Train-vs-test membership: out-of-fold ROC AUC of telling a test row from a train row.

    Folds are StratifiedGroupKFold over the leakage groups, so near-duplicates never sit on both sides
    of a fold (a memorised twin would inflate the AUC without any split incoherence).  With ``labels``
    the folds are stratified on class × side: every fold then keeps each class's train/test mix, so a
    representation that encodes the class cannot *anti*-learn membership from the small shifts in
    class mix between folds (which drives a held-out AUC below 0.5 on small data).
    """
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

    rows = np.flatnonzero(np.isin(split, ("train", "test")))
    target = (split[rows] == "test").astype(np.int64)
    n_test = int(target.sum())
    folds = min(int(params["membership_folds"]), n_test, int((1 - target).sum()))
    if folds < 2:
        raise ProbeInputError(f"membership probe needs at least 2 train and 2 test rows, got "
                              f"{len(rows) - n_test} train and {n_test} test")
    strata = target if labels is None else np.asarray(labels)[rows] * 2 + target
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=int(params["seed"]))
    model = make_classifier(classifier, params, categorical)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)  # "least populated class" on tiny data
        from sklearn.exceptions import ConvergenceWarning

        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        cv = list(splitter.split(rows, strata, np.asarray(groups)[rows]))
        proba = cross_val_predict(model, _take(x, rows), target, cv=cv, method="predict_proba")[:, 1]
    value = float(roc_auc_score(target, proba))
    indices = metrics.bootstrap_indices(len(rows), int(params["bootstrap"]), int(params["seed"]) + 7)
    low, high = metrics.interval(auc_resamples(target, proba, indices), float(params["confidence"]))
    return {"classifier": classifier, "n_features": _n_features(x), "n_train": int(len(rows) - n_test),
            "n_test": n_test, "folds": folds,
            "cv": "StratifiedGroupKFold(groups=leakage group, strata=" + ("side)" if labels is None else
                                                                          "class x side)"),
            "roc_auc": _entry(value, low, high, 0.5)}
