"""A training regime against the baseline, on the same rows: every change with its paired interval.

Each comparison resamples the rows once and applies the same resample to both regimes (a paired
bootstrap), so the interval is that of the *change*, not of two independent scores:

* classification (lab test, field cohort): accuracy and macro-F1 via :func:`.metrics.paired_bootstrap`;
* the background-swap cells: accuracy per cell, rows joined on the source photo;
* the background share of the gap: lab rows (plain and swapped together) and field rows resampled
  apart, the share of each regime computed on the same resample, then differenced;
* off-leaf attribution mass: the same images under both regimes, mean of the per-image differences.

A change whose value is undefined (a share without a gap, no rows) is ``null`` with a reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core import metrics
from . import composites as comp
from .stats import interval_record


def _params(params: dict[str, Any]) -> tuple[int, int, float]:
    return int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])


def classification_change(
    a: pd.DataFrame, b: pd.DataFrame, n_classes: int, params: dict[str, Any]
) -> dict[str, Any]:
    """Accuracy and macro-F1 of record ``b`` minus record ``a`` (prediction records on the same rows)."""
    n_boot, seed, level = _params(params)
    joined = a[["row_id", "label", "pred"]].merge(
        b[["row_id", "label", "pred"]], on="row_id", suffixes=("_a", "_b"), validate="1:1"
    )
    if not len(joined):
        return {
            m: interval_record(None, None, level, 0, "no rows in common") for m in ("accuracy", "macro_f1")
        }
    if (joined["label_a"] != joined["label_b"]).any():
        raise ValueError("the two records label the same rows differently: not the same rows")
    y = joined["label_a"].to_numpy()
    paired = metrics.paired_bootstrap(
        y,
        joined["pred_a"].to_numpy(),
        joined["pred_b"].to_numpy(),
        np.unique(y),
        n_classes,
        n_boot=n_boot,
        seed=seed,
        level=level,
    )
    out = {}
    for metric in ("accuracy", "macro_f1"):
        deltas = paired.b.resampled[metric] - paired.a.resampled[metric]
        point = paired.b.point[metric] - paired.a.point[metric]
        out[metric] = {
            **interval_record(point, deltas, level, len(y)),
            "baseline": float(paired.a.point[metric]),
            "regime": float(paired.b.point[metric]),
        }
    return out


def mean_change(a: np.ndarray, b: np.ndarray, params: dict[str, Any], what: str = "rows") -> dict[str, Any]:
    """Mean of b − a over the items where both are defined, with a bootstrap interval of that mean."""
    n_boot, seed, level = _params(params)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    if not both.any():
        return {
            **interval_record(None, None, level, 0, f"no {what} defined under both regimes"),
            "baseline": None,
            "regime": None,
        }
    diff = b[both] - a[both]
    indices = metrics.bootstrap_indices(len(diff), n_boot, seed)
    return {
        **interval_record(float(diff.mean()), diff[indices].mean(1), level, len(diff)),
        "baseline": float(a[both].mean()),
        "regime": float(b[both].mean()),
    }


def _correct(frame: pd.DataFrame) -> pd.Series:
    return pd.Series((frame["pred"] == frame["label"]).to_numpy(float), index=frame["source_row_id"])


def cells_change(
    a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame], params: dict[str, Any]
) -> dict[str, Any]:
    """Accuracy change per background-swap cell (cell frames of :func:`.bench.cell_frames`)."""
    out: dict[str, Any] = {}
    for cell in comp.CELLS:
        if a.get(cell) is None or b.get(cell) is None or not len(a[cell]):
            out[cell] = None
            continue
        joined = pd.concat(
            [_correct(a[cell]).rename("a"), _correct(b[cell]).rename("b")], axis=1, join="inner"
        )
        out[cell] = mean_change(joined["a"].to_numpy(), joined["b"].to_numpy(), params)
    return out


def _share_parts(
    cells: dict[str, pd.DataFrame], lab_ids: np.ndarray, field_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    plain = _correct(cells["lab_plain"]).loc[lab_ids].to_numpy()
    swapped = _correct(cells["lab_field"]).loc[lab_ids].to_numpy()
    field = _correct(cells["field_field"]).loc[field_ids].to_numpy()
    return plain, swapped, field


def share_change(
    a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame], params: dict[str, Any]
) -> dict[str, Any]:
    """Change of the background share of the lab-to-field gap, resampling the same rows for both."""
    n_boot, seed, level = _params(params)
    min_gap = float(params["min_gap"])
    missing = [
        c
        for c in ("lab_plain", "lab_field", "field_field")
        if any(x.get(c) is None or not len(x[c]) for x in (a, b))
    ]
    if missing:
        return {
            **interval_record(None, None, level, 0, f"cell(s) {missing} have no rows"),
            "baseline": None,
            "regime": None,
        }
    lab_ids = np.intersect1d(
        *(np.intersect1d(x["lab_plain"]["source_row_id"], x["lab_field"]["source_row_id"]) for x in (a, b))
    )
    field_ids = np.intersect1d(a["field_field"]["source_row_id"], b["field_field"]["source_row_id"])
    lab_index = metrics.bootstrap_indices(len(lab_ids), n_boot, seed)
    field_index = metrics.bootstrap_indices(len(field_ids), n_boot, seed + 1)
    shares, resampled = [], []
    for cells in (a, b):
        plain, swapped, field = _share_parts(cells, lab_ids, field_ids)
        value, reason = comp.background_share(plain.mean(), swapped.mean(), field.mean(), min_gap)
        shares.append((value, reason))
        resampled.append(
            comp.background_share_resampled(
                plain[lab_index].mean(1), swapped[lab_index].mean(1), field[field_index].mean(1), min_gap
            )
        )
    (base, base_reason), (regime, regime_reason) = shares
    if base is None or regime is None:
        reason = "; ".join(
            f"{who}: {why}" for who, why in (("baseline", base_reason), ("regime", regime_reason)) if why
        )
        return {
            **interval_record(None, None, level, len(lab_ids), reason),
            "baseline": base,
            "regime": regime,
        }
    deltas = resampled[1] - resampled[0]
    return {
        **interval_record(regime - base, deltas, level, len(lab_ids)),
        "baseline": base,
        "regime": regime,
        "undefined_resamples": int(np.isnan(deltas).sum()),
        "n_field": len(field_ids),
    }


def attribution_change(
    a: dict[tuple[str, str, str], np.ndarray],
    b: dict[tuple[str, str, str], np.ndarray],
    params: dict[str, Any],
) -> dict[str, Any]:
    """Off-leaf mass change per method, state and cell, over the images both regimes were measured on."""
    out: dict[str, Any] = {}
    for key in sorted(set(a) & set(b)):
        method, state, cell = key
        n = min(len(a[key]), len(b[key]))
        out.setdefault(method, {}).setdefault(state, {})[cell] = mean_change(
            a[key][:n], b[key][:n], params, "maps"
        )
    return out
