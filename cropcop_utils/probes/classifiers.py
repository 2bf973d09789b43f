"""The class probe: a small scikit-learn classifier fitted on train, scored on val and test against chance.

The classifiers (standardised logistic regression, extra trees, random forest), the chance levels, the
bootstrap scoring of a prediction and :func:`class_probe` itself.  Separate from the chapter because the
frozen-feature probe, every acquisition-cue probe, the planted check and the membership probe all fit
these same classifiers.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier

from ..core import metrics
from .errors import ProbeInputError

EVAL_SPLITS = ("val", "test")
CLASS_METRICS = ("accuracy", "macro_f1", "balanced_accuracy", "accuracy_minus_macro_f1")


# --------------------------------------------------------------------------- classifiers
def make_classifier(kind: str, params: dict[str, Any], categorical: Sequence[str] = ()) -> Any:
    """A fresh scikit-learn pipeline: ``logistic`` (standardised multinomial LR), ``extra_trees`` or
    ``random_forest``.

    ``extra_trees`` (extremely randomised trees, the random-forest variant that draws split thresholds
    at random) is the cue default: on the tomato corpus it matched or beat a random forest on every cue
    at a third of the fitting time, and, unlike the linear model, it finds non-linear cues such as
    "one of two frame colours".  ``categorical`` columns (metadata frames) are one-hot encoded, fitted
    on the training rows only.
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    steps: list[Any] = []
    if categorical:
        steps.append(ColumnTransformer(
            [("onehot", OneHotEncoder(handle_unknown="ignore", sparse_output=False), list(categorical))],
            remainder="passthrough"))
    if kind == "logistic":
        steps += [StandardScaler(), LogisticRegression(C=float(params["logistic_c"]),
                                                       max_iter=int(params["logistic_max_iter"]))]
    elif kind in FORESTS:
        leaf = params.get("forest_min_leaf", 1)
        steps.append(FORESTS[kind](n_estimators=int(params["forest_trees"]),
                                   min_samples_leaf=int(leaf if not isinstance(leaf, dict) else 1),
                                   n_jobs=max(1, int(params["workers"])), random_state=int(params["seed"])))
    else:
        raise ProbeInputError(f"probes classifier {kind!r}: expected 'logistic', 'extra_trees' or "
                              "'random_forest'")
    return make_pipeline(*steps)


FORESTS = {"extra_trees": ExtraTreesClassifier, "random_forest": RandomForestClassifier}


def _fit(model: Any, x: Any, y: np.ndarray) -> bool:
    """Fit; returns False when the solver reported that it did not converge (recorded, not hidden)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(x, y)
    return not any(issubclass(w.category, ConvergenceWarning) for w in caught)


def _take(x: Any, index: np.ndarray) -> Any:
    return x.iloc[index].reset_index(drop=True) if isinstance(x, pd.DataFrame) else x[index]


def _n_features(x: Any) -> int:
    return int(x.shape[1])


# --------------------------------------------------------------------------- chance levels
def chance_levels(y_eval: np.ndarray, n_classes: int) -> dict[str, float]:
    """What a classifier that ignores its input scores, per metric.

    accuracy and balanced accuracy: 1/K.  macro-F1: the expected per-class F1 of uniform random
    guessing, 2·p_k·(1/K) / (p_k + 1/K) for class share p_k, averaged over the classes present.
    """
    shares = np.bincount(y_eval, minlength=n_classes) / max(1, len(y_eval))
    present = shares[shares > 0]
    guess = 1.0 / n_classes
    return {"accuracy": guess, "balanced_accuracy": guess,
            "macro_f1": float(np.mean(2 * present * guess / (present + guess))) if present.size else np.nan,
            "accuracy_minus_macro_f1": np.nan}


def _entry(value: float, low: float, high: float, chance: float | None, majority: float | None = None
           ) -> dict[str, Any]:
    def clean(v: float | None) -> float | None:
        return None if v is None or not np.isfinite(v) else round(float(v), 6)

    entry = {"value": clean(value), "ci_low": clean(low), "ci_high": clean(high), "chance": clean(chance)}
    if majority is not None:
        entry["majority"] = clean(majority)
    return entry


def score_classes(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int, majority_class: int,
                  n_boot: int, seed: int, level: float) -> dict[str, Any]:
    """Accuracy, macro-F1, balanced accuracy and their gap with percentile-bootstrap intervals.

    One resample-index matrix serves every metric, so the gap's interval is paired.  The macro
    averages run over the classes present in ``y_true`` — in each resample, over the classes that
    resample drew (a tail class with two test rows is often absent from a resample; scoring it F1 = 0
    there would drag the interval below the point estimate).  ``majority`` is the same metric for
    always predicting the training set's most frequent class.
    """
    labels = np.unique(y_true)
    indices = metrics.bootstrap_indices(len(y_true), n_boot, seed)
    scored = metrics.bootstrap_metrics(y_true, y_pred, labels, n_classes, indices)
    point = dict(scored.point)
    resampled = dict(scored.resampled)
    drawn = scored.support[:, labels] > 0
    with np.errstate(invalid="ignore"):
        resampled["macro_f1"] = np.nanmean(np.where(drawn, scored.class_f1[:, labels], np.nan), axis=1)
    point["accuracy_minus_macro_f1"] = point["accuracy"] - point["macro_f1"]
    resampled["accuracy_minus_macro_f1"] = resampled["accuracy"] - resampled["macro_f1"]
    baseline = metrics.state_metrics(y_true, np.full_like(y_true, majority_class), labels)
    baseline["accuracy_minus_macro_f1"] = baseline["accuracy"] - baseline["macro_f1"]
    chance = chance_levels(y_true, n_classes)
    result: dict[str, Any] = {"n": int(len(y_true)), "classes_present": int(labels.size)}
    for name in CLASS_METRICS:
        low, high = metrics.interval(resampled[name], level)
        result[name] = _entry(point[name], low, high, chance[name], baseline[name])
    return result


def class_probe(x: Any, y: np.ndarray, split: np.ndarray, n_classes: int, classifier: str,
                params: dict[str, Any], categorical: Sequence[str] = ()) -> dict[str, Any]:
    """Fit on the train rows, score val and test (see :func:`score_classes`)."""
    train = np.flatnonzero(split == "train")
    if train.size == 0:
        raise ProbeInputError("the frozen split has no train rows to fit a probe on")
    model = make_classifier(classifier, params, categorical)
    converged = _fit(model, _take(x, train), y[train])
    majority = int(np.bincount(y[train], minlength=n_classes).argmax())
    out: dict[str, Any] = {"classifier": classifier, "n_features": _n_features(x), "n_train": int(train.size),
                           "converged": converged, "majority_class": majority}
    for offset, name in enumerate(EVAL_SPLITS):
        rows = np.flatnonzero(split == name)
        if rows.size == 0:
            continue
        predicted = np.asarray(model.predict(_take(x, rows)), dtype=np.int64)
        out[name] = score_classes(y[rows], predicted, n_classes, majority, int(params["bootstrap"]),
                                  int(params["seed"]) + offset, float(params["confidence"]))
    return out
