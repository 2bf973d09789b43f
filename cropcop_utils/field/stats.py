"""Bootstrap summaries for the field chapter: one shape everywhere, null with a reason when undefined."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import metrics


def interval_record(
    value: float | None, resampled: np.ndarray | None, level: float, n: int, reason: str | None = None
) -> dict[str, Any]:
    """``{value, lo, hi, n}``; ``value`` None with ``reason`` when it is undefined (never NaN in JSON)."""
    if value is None or not np.isfinite(value):
        return {
            "value": None,
            "lo": None,
            "hi": None,
            "n": int(n),
            "reason": reason or "no rows to estimate it from",
        }
    low = high = None
    if resampled is not None and np.isfinite(resampled).any():
        low, high = metrics.interval(resampled, level)
    return {"value": float(value), "lo": low, "hi": high, "n": int(n)}


def mean_with_interval(
    values: np.ndarray, n_boot: int, seed: int, level: float, what: str = "values"
) -> dict[str, Any]:
    """Mean of the finite values with a percentile-bootstrap interval over them; NaNs are counted apart."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    undefined = int(len(values) - len(finite))
    if len(finite) == 0:
        return {
            **interval_record(None, None, level, 0, f"no {what} with a defined value"),
            "undefined": undefined,
        }
    indices = metrics.bootstrap_indices(len(finite), n_boot, seed)
    return {
        **interval_record(float(finite.mean()), finite[indices].mean(1), level, len(finite)),
        "undefined": undefined,
    }


def resampled_means(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``values`` on ``n_boot`` resamples (the shared index matrix of a seed)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return np.full(n_boot, np.nan)
    return values[metrics.bootstrap_indices(len(values), n_boot, seed)].mean(1)
