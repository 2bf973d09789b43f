"""Scores of the field chapter: classification results with intervals, and the background-swap cells."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core import metrics
from ..core.evidence import Chapter, FingerprintMismatch
from ..core.model_states import states_for
from ..corpus.taxonomy import TaxonomyError, slug, split_name
from ..nets import states as state_models
from . import composites as comp
from .stats import interval_record, mean_with_interval, resampled_means


# --------------------------------------------------------------------------- scores
def classification(
    y: np.ndarray, pred: np.ndarray, class_names: list[str], params: dict[str, Any], per_class: bool = True
) -> dict[str, Any]:
    """Accuracy and macro-F1 (over the classes with rows) with intervals; per-class recall."""
    level, n = float(params["ci_level"]), len(y)
    if n == 0:
        return {
            "n": 0,
            "accuracy": interval_record(None, None, level, 0),
            "macro_f1": interval_record(None, None, level, 0),
        }
    scored = np.unique(y)
    indices = metrics.bootstrap_indices(n, int(params["bootstrap"]), int(params["seed"]))
    boot = metrics.bootstrap_metrics(y, pred, scored, len(class_names), indices)
    out: dict[str, Any] = {
        "n": n,
        **{m: interval_record(boot.point[m], boot.resampled[m], level, n) for m in ("accuracy", "macro_f1")},
    }
    if per_class:
        scores = metrics.per_class_scores(y, pred, len(class_names))
        out["per_class_recall"] = {
            class_names[k]: interval_record(
                float(scores["recall"][k]), boot.class_recall[:, k], level, int(scores["support"][k])
            )
            for k in scored
        }
    return out


def lab_test_records(ch: Chapter, states: dict[str, state_models.LoadedState],
                     regime: Any = None) -> dict[str, pd.DataFrame]:
    """Each state's recorded test predictions (of a regime; default the shipped one), proven to come
    from the file that was loaded."""
    records = {}
    for state in states_for(regime):
        frame = ch.read_parquet(state.path)
        if len(frame) and (frame["model_state"] != states[state.name].sha256).any():
            raise FingerprintMismatch(
                f"{state.path} was not written by the {state.label} now in the run "
                f"(model_state differs); rerun chapter '{state.chapter}'"
            )
        records[state.name] = frame
    return records


def labels_directly(source_label: str, class_name: str) -> bool:
    """Whether a source label names the lab class itself (``scab`` for ``Apple_scab``) rather than a
    condition filed under it by symptom (``frog_eye_leaf_spot`` under ``Apple_Black_rot``)."""
    if slug(str(source_label)) == slug(class_name):
        return True
    try:
        return slug(str(source_label)) == split_name(class_name)[1]
    except TaxonomyError:
        return False


def relative_effect(
    y: np.ndarray, pred: np.ndarray, related: np.ndarray, class_names: list[str], params: dict[str, Any]
) -> dict[str, Any]:
    """Scores on the cohort photos with no trusted relative in field-train, and how far the whole cohort's
    accuracy sits above them: the difference (whole − unrelated) with a bootstrap interval over cohort
    rows, each resample scoring both on the same rows (the unrelated photos are part of the whole)."""
    level, n_boot, seed = float(params["ci_level"]), int(params["bootstrap"]), int(params["seed"])
    unrelated = ~related
    out: dict[str, Any] = {
        "related": int(related.sum()),
        "unrelated": int(unrelated.sum()),
        "without_relative": classification(y[unrelated], pred[unrelated], class_names, params, False),
        "with_relative": classification(y[related], pred[related], class_names, params, False),
    }
    correct = (y == pred).astype(np.float64)
    if not unrelated.any() or not len(y):
        out["accuracy_gap"] = interval_record(None, None, level, len(y), "no cohort photo without a relative")
        return out
    indices = metrics.bootstrap_indices(len(y), n_boot, seed)
    picked, kept = correct[indices], unrelated[indices]
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = picked.mean(1) - (picked * kept).sum(1) / kept.sum(1)
    point = float(correct.mean() - correct[unrelated].mean())
    out["accuracy_gap"] = interval_record(point, gap, level, len(y))
    return out


def field_results(
    record: pd.DataFrame,
    cohort: pd.DataFrame,
    class_names: list[str],
    params: dict[str, Any],
    relatives: set[str] | None = None,
) -> dict[str, Any]:
    """Results on the cohort: all rows, rows labelled directly, each symptom-mapped source and, when the
    run has a field-train folder (``relatives``: the cohort row_ids with a trusted relative there, from
    chapter 2's cross-set audit), the photos without such a relative."""
    rows = cohort.set_index("row_id").loc[record["row_id"]]
    y, pred = record["label"].to_numpy(), record["pred"].to_numpy()
    out = classification(y, pred, class_names, params)
    if relatives is not None:
        related = record["row_id"].isin(relatives).to_numpy()
        out["field_train_relatives"] = relative_effect(y, pred, related, class_names, params)
    direct = np.array([labels_directly(source, name)
                       for source, name in zip(rows["source_label"], rows["class_name"], strict=True)])
    out["direct_labels"] = classification(y[direct], pred[direct], class_names, params, per_class=False)
    out["by_source_label"] = {}
    mapped = rows[~direct]
    for source, group in mapped.groupby("source_label"):
        keep = np.isin(record["row_id"].to_numpy(), group.index.to_numpy())
        correct = (pred[keep] == y[keep]).astype(float)
        out["by_source_label"][str(source)] = {
            "class_name": str(group["class_name"].iloc[0]),
            "mapping": "by symptom",
            "accuracy": mean_with_interval(
                correct, int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"]), "rows"
            ),
        }
    return out


def confusion_long(record: pd.DataFrame, class_names: list[str], state: str) -> pd.DataFrame:
    from sklearn.metrics import confusion_matrix

    matrix = confusion_matrix(record["label"], record["pred"], labels=list(range(len(class_names))))
    true, predicted = np.nonzero(matrix)
    return pd.DataFrame(
        {
            "state": state,
            "true": [class_names[i] for i in true],
            "predicted": [class_names[j] for j in predicted],
            "count": matrix[true, predicted],
        }
    )


# --------------------------------------------------------------------------- background swap
def cell_results(cells: dict[str, pd.DataFrame], params: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per cell, changed-prediction rates against the partner cell, and the background share."""
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    out: dict[str, Any] = {"cells": {}, "changed": {}}
    for cell in comp.CELLS:
        frame = cells.get(cell)
        if frame is None or len(frame) == 0:
            out["cells"][cell] = None
            continue
        correct = (frame["pred"] == frame["label"]).to_numpy(float)
        out["cells"][cell] = {"n": len(frame), "accuracy": mean_with_interval(correct, n_boot, seed, level)}
    for cell, partner in comp.PAIRED_WITH.items():
        if cells.get(cell) is None or cells.get(partner) is None or not len(cells[cell]):
            out["changed"][cell] = None
            continue
        joined = cells[cell].merge(cells[partner], on="source_row_id", suffixes=("", "_partner"))
        changed = (joined["pred"] != joined["pred_partner"]).to_numpy(float)
        out["changed"][cell] = {
            "against": partner,
            "n": len(joined),
            "rate": mean_with_interval(changed, n_boot, seed, level),
        }
    out["background_share"] = share_record(cells, params)
    return out


def share_record(cells: dict[str, pd.DataFrame], params: dict[str, Any]) -> dict[str, Any]:
    """(lab_plain − lab_field) / (lab_plain − field_field) with a bootstrap interval.

    lab_plain and lab_field are the same leaves: they are resampled together; field_field apart.
    """
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    min_gap = float(params["min_gap"])
    needed = [
        c for c in ("lab_plain", "lab_field", "field_field") if cells.get(c) is None or not len(cells[c])
    ]
    if needed:
        return {
            "value": None,
            "lo": None,
            "hi": None,
            "reason": f"cell(s) {needed} have no rows",
            "undefined_resamples": None,
        }
    paired = cells["lab_plain"].merge(cells["lab_field"], on="source_row_id", suffixes=("_plain", "_field"))
    plain = (paired["pred_plain"] == paired["label_plain"]).to_numpy(float)
    swapped = (paired["pred_field"] == paired["label_field"]).to_numpy(float)
    field = (cells["field_field"]["pred"] == cells["field_field"]["label"]).to_numpy(float)
    value, reason = comp.background_share(plain.mean(), swapped.mean(), field.mean(), min_gap)
    indices = metrics.bootstrap_indices(len(plain), n_boot, seed)
    resampled = comp.background_share_resampled(
        plain[indices].mean(1), swapped[indices].mean(1), resampled_means(field, n_boot, seed + 1), min_gap
    )
    undefined = int(np.isnan(resampled).sum())
    if value is None:
        return {"value": None, "lo": None, "hi": None, "reason": reason, "undefined_resamples": undefined}
    record = interval_record(value, resampled, level, len(plain))
    return {
        "value": record["value"],
        "lo": record["lo"],
        "hi": record["hi"],
        "reason": None,
        "undefined_resamples": undefined,
        "n_lab": len(plain),
        "n_field": len(field),
        "gap": float(plain.mean() - field.mean()),
    }
