"""The learning curve's draws and rows: which field-train photos a point adds, and one scored row of
``field/curve.parquet`` (shared by the frozen-feature learner in :mod:`.curve`, the fine-tuned one in
:mod:`.curve_finetune` and the figure in :mod:`.curve_figures`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from .scores import classification

FROZEN = "frozen_logistic"
FINETUNE = "finetune_compact"
LEARNER_LABELS = {FROZEN: "logistic regression on frozen ImageNet Lite0 features",
                  FINETUNE: "compact model fine-tuned (training.compact recipe)"}
# each measure with its interval limits (``_lo``, ``_hi``)
MEASURES = [f"{m}{end}" for m in ("field_accuracy", "field_macro_f1", "lab_test_macro_f1",
                                    "field_accuracy_no_relative") for end in ("", "_lo", "_hi")]
COLUMNS = ["learner", "k", "draw", "n_field_per_class", "n_field", "n_lab", *MEASURES, "n_no_relative",
           "model_state", "seconds", "note"]


# --------------------------------------------------------------------------- draws
def draw_field_rows(pool: pd.DataFrame, k: int, seed: int, draw: int) -> pd.DataFrame:
    """Up to ``k`` rows per class of ``pool``: the first k of the class's permutation for (seed, draw).

    The permutation depends only on (seed, draw, class name) and the class's row ids (sorted first), so
    the same seed gives the same rows whatever the pool's order, and a larger k extends a smaller one."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    parts = []
    for name, rows in pool.sort_values("row_id").groupby("class_name", sort=True):
        key = [int(seed), int(draw), *np.frombuffer(str(name).encode(), dtype=np.uint8).tolist()]
        order = np.random.default_rng(np.random.SeedSequence(key)).permutation(len(rows))
        parts.append(rows.iloc[order[:k]])
    if not parts:
        return pool.iloc[:0]
    return pd.concat(parts).reset_index(drop=True)


def per_class_counts(rows: pd.DataFrame, class_names: list[str]) -> dict[str, int]:
    """Rows per class in class-map order (0 for a class without rows)."""
    counts = rows["class_name"].value_counts() if len(rows) else pd.Series(dtype=int)
    return {name: int(counts.get(name, 0)) for name in class_names}


# --------------------------------------------------------------------------- scores
def scored(y: np.ndarray, pred: np.ndarray, class_names: list[str], params: dict[str, Any]) -> dict[str, Any]:
    """Accuracy and macro-F1 with bootstrap intervals (:func:`.scores.classification`)."""
    return classification(np.asarray(y), np.asarray(pred), class_names, params, per_class=False)


def scored_cohort(cohort: pd.DataFrame, pred: np.ndarray, class_names: list[str], params: dict[str, Any]
                  ) -> dict[str, Any]:
    """:func:`scored` on the whole cohort, with ``no_relative``: the same on the photos whose
    ``no_relative`` column is true (no trusted relative among the field-train photos)."""
    y, pred = cohort["label"].to_numpy(), np.asarray(pred)
    keep = cohort["no_relative"].to_numpy(dtype=bool)
    return {**scored(y, pred, class_names, params),
            "no_relative": scored(y[keep], pred[keep], class_names, params)}


def curve_row(learner: str, k: int, draw: int, counts: dict[str, int], n_lab: int, field: dict[str, Any],
              lab: dict[str, Any], model_state: str, seconds: float | None, note: str | None = None
              ) -> dict[str, Any]:
    """One row of ``field/curve.parquet``."""
    return {"learner": learner, "k": int(k), "draw": int(draw), "n_field_per_class": json.dumps(counts),
            "n_field": int(sum(counts.values())), "n_lab": int(n_lab),
            **{f"field_{m}{end}": field[m][key] for m in ("accuracy", "macro_f1")
               for end, key in (("", "value"), ("_lo", "lo"), ("_hi", "hi"))},
            **{f"lab_test_macro_f1{end}": lab["macro_f1"][key] for end, key in
               (("", "value"), ("_lo", "lo"), ("_hi", "hi"))},
            **{f"field_accuracy_no_relative{end}": field["no_relative"]["accuracy"][key] for end, key in
               (("", "value"), ("_lo", "lo"), ("_hi", "hi"))},
            "n_no_relative": int(field["no_relative"]["n"]),
            "model_state": model_state, "seconds": seconds, "note": note}
