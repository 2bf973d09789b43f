"""Chapter 10's field cohorts under the recipe: the primary one's records (:func:`field_inputs`, None when
the run has no field cohort), every further one's (:func:`further_cohort_inputs`) and, per state, the
share abstained at the threshold, accuracy on the accepted and on
all field images, and conformal coverage on the cohort (:func:`field_block`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core.evidence import Chapter, read_registry
from ..core.model_states import STATE_NAMES
from .calibration import probabilities
from .conformal import conformal_sets, set_summary
from .records import aligned
from .selective import confidence_scores, proportion

FIELD_RECORD = "field/field.json"


def field_inputs(ch: Chapter, n_classes: int) -> dict[str, Any] | None:
    """Chapter 10's cohort and per-state field predictions, or None when the run has no field cohort
    (no chapter 10, or a chapter 10 that recorded ``status: no_field_cohort``, or an empty cohort)."""
    registry = read_registry(ch.run_dir)
    if FIELD_RECORD not in registry:
        return None
    record = ch.read_json(FIELD_RECORD)
    scored = [f"field/predictions_{state}.parquet" for state in STATE_NAMES]
    if record.get("status") != "measured" or not all(path in registry for path in scored):
        return None
    cohort = ch.read_parquet("field/cohort.parquet").sort_values("row_id").reset_index(drop=True)
    logits = {}
    for state in STATE_NAMES:
        path = f"field/predictions_{state}.parquet"
        logits[state] = aligned(ch.read_parquet(path), cohort, n_classes, path)[0]
    return {"cohort": cohort, "logits": logits}


def further_cohort_inputs(ch: Chapter, n_classes: int) -> dict[str, dict[str, Any]]:
    """Every cohort after chapter 10's primary one (``--field`` given again): ``{name: {"cohort", "logits",
    "relation"}}`` from the shipped regime's records under ``field/cohorts/<name>/``; empty when none."""
    registry = read_registry(ch.run_dir)
    if FIELD_RECORD not in registry:
        return {}
    out = {}
    for entry in (ch.read_json(FIELD_RECORD).get("cohorts") or [])[1:]:
        scored = [f"{entry['files']}predictions_{state}.parquet" for state in STATE_NAMES]
        if not entry["n"] or not all(path in registry for path in scored):
            continue
        cohort = (ch.read_parquet(f"{entry['files']}cohort.parquet").sort_values("row_id")
                  .reset_index(drop=True))
        logits = {state: aligned(ch.read_parquet(path), cohort, n_classes, path)[0]
                  for state, path in zip(STATE_NAMES, scored, strict=True)}
        out[entry["name"]] = {"cohort": cohort, "logits": logits, "relation": entry["relation"]}
    return out


def field_block(field_logits: np.ndarray, cohort: pd.DataFrame, temperature: float, threshold: float,
                val_prob: np.ndarray, val_y: np.ndarray, params: dict[str, Any],
                field_val: np.ndarray | None = None) -> dict[str, Any]:
    """Share abstained, accuracy on accepted vs all field images, conformal coverage on the cohort
    (sets calibrated on the validation rows ``field_val`` marks, all of them when None)."""
    level, n_classes = float(params["ci_level"]), val_prob.shape[1]
    y = cohort["label"].to_numpy().astype(np.int64)
    labelled = (y >= 0) & (y < n_classes)
    score = confidence_scores(field_logits, temperature)[params["score"]]
    accepted = score >= threshold
    prob = probabilities(field_logits, temperature)
    correct = prob.argmax(axis=1) == np.where(labelled, y, -1)
    # calibrated on the field val rows where the regime has them: field photos are exchangeable with
    # field val, not with lab val (pooled, the lab's confident rows shrink every set)
    field_val = np.ones(len(val_y), dtype=bool) if field_val is None else np.asarray(field_val, dtype=bool)
    conformal = {}
    for nominal in params["conformal_levels"]:
        sets = conformal_sets(val_prob[field_val], val_y[field_val], prob[labelled], float(nominal),
                              int(params["seed"]))
        conformal[f"{round(100 * float(nominal))}"] = {
            "nominal": float(nominal), "calibrated_on": "field val" if not field_val.all() else "val",
            "calibration_rows": int(field_val.sum()), **set_summary(sets, y[labelled], level)}
    out = {"n": int(len(y)), "labelled": int(labelled.sum()),
           **_field_shares(accepted, correct, labelled, level), "conformal": conformal}
    # a source label mapped to a lab class by symptom (frogeye leaf spot -> black rot) is reported apart
    sources = cohort["source_label"].astype(str).to_numpy() if "source_label" in cohort else None
    out["by_source_label"] = {} if sources is None else {
        source: {"n": int((sources == source).sum()),
                 **_field_shares(accepted[sources == source], correct[sources == source],
                                 labelled[sources == source], level)}
        for source in sorted(set(sources))}
    return out


def _field_shares(accepted: np.ndarray, correct: np.ndarray, labelled: np.ndarray,
                  level: float) -> dict[str, Any]:
    return {"abstained_share": proportion(int((~accepted).sum()), len(accepted), level, "field images"),
            "accuracy_accepted": proportion(int((correct & accepted & labelled).sum()),
                                            int((accepted & labelled).sum()), level,
                                            "accepted labelled field images"),
            "accuracy_all": proportion(int((correct & labelled).sum()), int(labelled.sum()), level,
                                       "labelled field images")}
