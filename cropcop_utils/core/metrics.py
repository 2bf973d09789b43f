"""Classification metrics for paired comparisons of model states on the same test rows.

Point estimates come straight from scikit-learn.  The bootstrap is hand-rolled for one reason: the
chapter needs thousands of resamples of four states, and calling scikit-learn once per resample and
state is slow.  Every metric here is a function of three per-class counts (true positives, true
support, predicted count), so one resample-count matrix ``W`` (resamples × rows) turns each state's
counts into ``W @ one_hot`` — one matrix product for all resamples.  The tests check these counts
against scikit-learn on the resampled rows.

Pairing: one index matrix is drawn once and applied to every state, so a delta's interval reflects
the uncertainty of the *difference* on identical rows, not of two independent samples.

Metrics are fractions in [0, 1]; the book reports them (and deltas) in points (× 100).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    f1_score,
    precision_recall_fscore_support,
)

METRICS: tuple[str, ...] = ("accuracy", "macro_f1", "balanced_accuracy", "weighted_f1")
METRIC_LABELS = {"accuracy": "accuracy", "macro_f1": "macro-F1", "balanced_accuracy": "balanced accuracy",
                 "weighted_f1": "weighted F1"}
# The paired comparisons use the three metrics the study reports deltas for.
PAIRED_METRICS: tuple[str, ...] = ("accuracy", "macro_f1", "balanced_accuracy")
_CHUNK = 256  # resamples per matrix product: bounds memory at chunk × rows floats


class MetricInputError(ValueError):
    """Labels / predictions that cannot be scored (shape mismatch, out-of-range class index)."""


def _as_labels(values: Sequence[int] | np.ndarray, n_classes: int, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise MetricInputError(f"{what} must be one-dimensional, got shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() >= n_classes):
        raise MetricInputError(f"{what} holds class indices outside 0..{n_classes - 1}")
    return array.astype(np.int64)


# --------------------------------------------------------------------------- point estimates
def state_metrics(y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """Accuracy, macro-F1, balanced accuracy and weighted F1 on all rows (scikit-learn).

    ``labels`` fixes the class set F1 averages over (the classes with test rows), so every model
    state is scored over the same classes whatever it predicts.
    """
    labels = list(labels)
    with warnings.catch_warnings():
        # balanced accuracy averages recall over the classes with rows, as intended; sklearn warns when a
        # model predicts a class the rows lack, or when the rows hold one class (a field cohort, a slice, a
        # subset of either), and in a notebook those warnings land on the book's page
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        warnings.filterwarnings("ignore", message="A single label was found in 'y_true' and 'y_pred'")
        balanced = float(balanced_accuracy_score(y_true, y_pred))
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "balanced_accuracy": balanced,
        "weighted_f1": float(f1_score(y_true, y_pred, labels=labels, average="weighted", zero_division=0)),
    }


def per_class_scores(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int) -> pd.DataFrame:
    """Precision, recall, F1 and support of every class index 0..n_classes-1 (scikit-learn)."""
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=list(range(n_classes)), zero_division=0)
    return pd.DataFrame({"label": np.arange(n_classes), "precision": precision, "recall": recall,
                         "f1": f1, "support": support.astype(int)})


# --------------------------------------------------------------------------- counts
def class_counts(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int,
                 weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class true positives, true support and predicted count.

    With ``weights`` (resamples × rows, how often each row is drawn) every output gains a leading
    resample axis: ``(B, n_classes)``.
    """
    y_true = _as_labels(y_true, n_classes, "y_true")
    y_pred = _as_labels(y_pred, n_classes, "y_pred")
    if y_true.shape != y_pred.shape:
        raise MetricInputError(f"y_true has {y_true.size} rows but y_pred has {y_pred.size}")
    hots = _one_hots(y_true, y_pred, n_classes)
    if weights is None:
        return tuple(hot.sum(0) for hot in hots)  # type: ignore[return-value]
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[1] != y_true.size:
        raise MetricInputError(f"weights must be (resamples, {y_true.size}), got {weights.shape}")
    return tuple(weights @ hot for hot in hots)  # type: ignore[return-value]


def _one_hots(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> tuple[np.ndarray, ...]:
    # rows × classes indicators of "correct and of class k", "of class k", "predicted k"
    eye = np.eye(n_classes)
    true_hot = eye[y_true]
    return true_hot * (y_true == y_pred)[:, None], true_hot, eye[y_pred]


def _ratio(numerator: np.ndarray, denominator: np.ndarray, empty: float) -> np.ndarray:
    out = np.full(np.broadcast(numerator, denominator).shape, empty, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def f1_from_counts(tp: np.ndarray, support: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    # 2TP / (2TP + FP + FN) = 2TP / (support + predicted); 0 when the class is neither true nor predicted,
    # which is scikit-learn's zero_division=0.
    return _ratio(2 * tp, support + predicted, 0.0)


def recall_from_counts(tp: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Recall per class; NaN where the class has no true rows (undefined, left out of means)."""
    return _ratio(tp, support, np.nan)


def metrics_from_counts(tp: np.ndarray, support: np.ndarray, predicted: np.ndarray,
                        labels: Sequence[int]) -> dict[str, np.ndarray]:
    """The four state metrics from per-class counts, restricted to ``labels`` (last axis = class)."""
    labels = np.asarray(labels, dtype=np.int64)
    tp, support, predicted = tp[..., labels], support[..., labels], predicted[..., labels]
    f1 = f1_from_counts(tp, support, predicted)
    recall = recall_from_counts(tp, support)
    total = support.sum(-1)
    with np.errstate(invalid="ignore"):
        balanced = np.nanmean(recall, axis=-1) if recall.shape[-1] else np.full(total.shape, np.nan)
    return {
        "accuracy": _ratio(tp.sum(-1), total, np.nan),
        "macro_f1": f1.mean(-1),
        "balanced_accuracy": balanced,
        "weighted_f1": _ratio((support * f1).sum(-1), total, np.nan),
    }


# --------------------------------------------------------------------------- bootstrap
def bootstrap_indices(n_rows: int, n_boot: int, seed: int) -> np.ndarray:
    """The one resample-index matrix (n_boot × n_rows) every state of a comparison is scored on."""
    if n_rows < 1 or n_boot < 1:
        raise MetricInputError(f"bootstrap needs rows and resamples, got {n_rows} rows, {n_boot} resamples")
    dtype = np.int32 if n_rows < 2**31 else np.int64
    return np.random.default_rng(seed).integers(0, n_rows, size=(n_boot, n_rows), dtype=dtype)


def resample_weights(indices: np.ndarray) -> np.ndarray:
    """How often each row appears in each resample: (B, n) counts from a (B, n) index matrix."""
    n_boot, n_rows = indices.shape
    flat = indices.astype(np.int64) + (np.arange(n_boot, dtype=np.int64) * n_rows)[:, None]
    return np.bincount(flat.ravel(), minlength=n_boot * n_rows).reshape(n_boot, n_rows)


@dataclass
class BootstrapMetrics:
    """One model state scored on the full rows and on every resample of a shared index matrix."""

    point: dict[str, float]
    resampled: dict[str, np.ndarray]   # metric -> (B,)
    class_f1: np.ndarray               # (B, n_classes)
    class_recall: np.ndarray           # (B, n_classes), NaN where a class drew no rows
    support: np.ndarray = field(repr=False)  # (B, n_classes) true support per resample


def bootstrap_metrics(y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[int], n_classes: int,
                      indices: np.ndarray) -> BootstrapMetrics:
    """Score one state on all rows (scikit-learn) and on each resample row of ``indices``."""
    y_true = _as_labels(y_true, n_classes, "y_true")
    y_pred = _as_labels(y_pred, n_classes, "y_pred")
    if indices.ndim != 2 or (indices.size and indices.max() >= y_true.size):
        raise MetricInputError(f"indices must be (resamples, rows) over {y_true.size} rows")
    if y_true.shape != y_pred.shape:
        raise MetricInputError(f"y_true has {y_true.size} rows but y_pred has {y_pred.size}")
    hots = _one_hots(y_true, y_pred, n_classes)
    parts = []
    for start in range(0, indices.shape[0], _CHUNK):
        weights = resample_weights(indices[start:start + _CHUNK]).astype(np.float64)
        parts.append([weights @ hot for hot in hots])
    tp, support, predicted = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return BootstrapMetrics(
        point=state_metrics(y_true, y_pred, labels),
        resampled=metrics_from_counts(tp, support, predicted, labels),
        class_f1=f1_from_counts(tp, support, predicted),
        class_recall=recall_from_counts(tp, support),
        support=support,
    )


def interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval; NaN resamples (an undefined metric) are left out."""
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).any():
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.nanpercentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def paired_delta_table(a: BootstrapMetrics, b: BootstrapMetrics, metrics: Sequence[str] = PAIRED_METRICS,
                       level: float = 0.95) -> pd.DataFrame:
    """b − a for each metric with its paired interval (both states scored on the same resamples)."""
    if a.support.shape != b.support.shape or not np.array_equal(a.support, b.support):
        raise MetricInputError("paired delta needs both states scored on the same labels and resamples")
    rows = []
    for metric in metrics:
        deltas = b.resampled[metric] - a.resampled[metric]
        low, high = interval(deltas, level)
        rows.append({"metric": metric, "value_a": a.point[metric], "value_b": b.point[metric],
                     "delta": b.point[metric] - a.point[metric], "lo": low, "hi": high,
                     "excludes_zero": bool(low > 0 or high < 0)})
    return pd.DataFrame(rows)


@dataclass
class PairedBootstrap:
    table: pd.DataFrame
    indices: np.ndarray
    a: BootstrapMetrics
    b: BootstrapMetrics


def paired_bootstrap(y_true: Sequence[int], pred_a: Sequence[int], pred_b: Sequence[int],
                     labels: Sequence[int], n_classes: int, *, n_boot: int = 1000, seed: int = 0,
                     level: float = 0.95, indices: np.ndarray | None = None) -> PairedBootstrap:
    """Paired bootstrap of two states: one index matrix drawn once and applied to both."""
    if indices is None:
        indices = bootstrap_indices(len(y_true), n_boot, seed)
    a = bootstrap_metrics(y_true, pred_a, labels, n_classes, indices)
    b = bootstrap_metrics(y_true, pred_b, labels, n_classes, indices)
    return PairedBootstrap(paired_delta_table(a, b, level=level), indices, a, b)


# --------------------------------------------------------------------------- McNemar
def mcnemar_exact(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict[str, float | int]:
    """Exact McNemar test on paired top-1 correctness: a two-sided binomial test on the discordant pairs.

    (statsmodels' ``mcnemar(exact=True)`` is the same test; it is not a dependency here, so scipy's
    ``binomtest`` does it directly.)
    """
    correct_a = np.asarray(correct_a, dtype=bool)
    correct_b = np.asarray(correct_b, dtype=bool)
    if correct_a.shape != correct_b.shape:
        raise MetricInputError("McNemar needs the same rows for both states")
    only_a = int(np.sum(correct_a & ~correct_b))
    only_b = int(np.sum(~correct_a & correct_b))
    discordant = only_a + only_b
    p_value = 1.0 if discordant == 0 else float(stats.binomtest(only_a, discordant, 0.5).pvalue)
    return {"only_a_correct": only_a, "only_b_correct": only_b, "discordant": discordant,
            "p_value": p_value}


# --------------------------------------------------------------------------- support bins
def support_bin_labels(edges: Sequence[int]) -> list[str]:
    """Labels of the bins cut at ``edges``: e.g. [100, 200] → ['<100', '100–199', '≥200']."""
    edges = _check_edges(edges)
    labels = [f"<{edges[0]}"]
    labels += [f"{low}–{high - 1}" for low, high in zip(edges[:-1], edges[1:], strict=True)]
    return labels + [f"≥{edges[-1]}"]


def assign_support_bins(train_support: Sequence[int], edges: Sequence[int]) -> pd.Categorical:
    """Bin each class by its training support; a bin includes its lower edge (100 → '100–199')."""
    edges = _check_edges(edges)
    cuts = [-np.inf, *edges, np.inf]
    return pd.cut(np.asarray(train_support, dtype=np.float64), bins=cuts, right=False,
                  labels=support_bin_labels(edges))


def _check_edges(edges: Sequence[int]) -> list[int]:
    edges = [int(e) for e in edges]
    if not edges or any(e <= 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise MetricInputError(f"support bin edges must be positive and strictly increasing, got {edges}")
    return edges


@contextmanager
def quiet_empty_slices() -> Iterator[None]:
    """Silence numpy/sklearn warnings about empty slices."""
    # empty rows / classes are expected here (a resample without slice rows, a class without test rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield
