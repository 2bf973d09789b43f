"""Loading and pairing the four model states' prediction records — what chapters 8 and 9 share.

The four states — float reference, float compact, converted INT8 graph, the .pte on its runtime —
were scored on the same locked test rows with the same frozen class order.  Every comparison of
chapters 8 and 9 is paired: :func:`pair_states` first proves the rows and labels are identical across
states; only then does a chapter draw one bootstrap index matrix and score every state on it (see
:mod:`cropcop_utils.core.metrics`).  The explorer reads the same records through this module.

Also here, because both chapters read them: the ``analysis`` section of the profile over its defaults,
the output folder, and the class table (taxonomy fields with train and test support).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core.config import RunContext
from ..core.evidence import Chapter
from ..core.model_states import (
    PREDICTION_COLUMNS,
    STATE_NAMES,
    STATES,
    ModelState,
    PairedStates,
)

FOLDER = "analysis"



DEFAULTS: dict[str, Any] = {
    "bootstrap": 1000, "seed": 0, "ci_level": 0.95, "min_test_support": 30,
    "support_bins": [100, 200, 500, 1000], "confusion_state": "pte", "gallery_state": "pte",
    "gallery_classes": 4, "gallery_per_class": 6, "thumb_px": 96,
    "slice": {"field": "fruit", "equals": True},
}


class MissingModelState(FileNotFoundError):
    """A model state's prediction file is absent (the chain stopped before the chapter that writes it)."""


class StateMismatch(ValueError):
    """Model states that do not cover identical test rows with identical labels cannot be compared."""


def pair_key(a: str, b: str) -> str:
    return f"{a}_to_{b}"


def analysis_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """The profile's ``analysis`` section over the defaults (older run folders may lack the section)."""
    params = {**DEFAULTS, **ctx.section("analysis"), **options}
    for key in ("confusion_state", "gallery_state"):
        if params[key] not in STATE_NAMES:
            raise ValueError(f"analysis.{key} = {params[key]!r}; choose one of {', '.join(STATE_NAMES)}")
    return params


# --------------------------------------------------------------------------- loading and pairing
def load_states(ch: Chapter, states: tuple[ModelState, ...] = STATES,
                required: bool = True) -> dict[str, pd.DataFrame]:
    """Verified reads of the prediction files; every absent one is named in one error."""
    missing = [s for s in states if not ch.path(s.path).exists()]
    if missing and required:
        named = "; ".join(f"{s.path} ({s.label}, written by chapter '{s.chapter}')" for s in missing)
        raise MissingModelState(
            f"chapter '{ch.name}' compares {len(states)} model states but {len(missing)} prediction "
            f"file(s) are missing from {ch.run_dir}: {named}. Run the chain through chapter 07 "
            "(runtime) first.")
    frames = {}
    for state in states:
        if state not in missing:
            frame = ch.read_parquet(state.path)
            absent = [c for c in PREDICTION_COLUMNS if c not in frame.columns]
            if absent:
                raise StateMismatch(f"{state.path} lacks column(s) {absent}; rerun chapter '{state.chapter}'")
            frames[state.name] = frame
    return frames


def pair_states(frames: dict[str, pd.DataFrame], split_rows: pd.DataFrame, n_classes: int) -> PairedStates:
    """Refuse unless every state covers the same test rows (row_id set) with the same label per row,
    and those are the frozen split's test rows and labels."""
    path_of = {s.name: s.path for s in STATES}
    first = next(iter(frames))
    base = frames[first].set_index("row_id")
    for name, frame in frames.items():
        duplicated = frame["row_id"].duplicated()
        if duplicated.any():
            raise StateMismatch(f"{path_of[name]} lists {int(duplicated.sum())} row_id(s) twice "
                                f"(e.g. {frame.loc[duplicated, 'row_id'].iloc[0]})")
        if frame["model_state"].nunique() > 1:
            raise StateMismatch(f"{path_of[name]} mixes {frame['model_state'].nunique()} model states")
        only_here = set(frame["row_id"]) - set(base.index)
        only_base = set(base.index) - set(frame["row_id"])
        if only_here or only_base:
            raise StateMismatch(
                f"{path_of[name]} and {path_of[first]} do not cover identical test rows: "
                f"{len(only_here)} row(s) only in {path_of[name]}, {len(only_base)} only in "
                f"{path_of[first]}; "
                "paired comparisons need every state scored on the same locked test.")
        labels = frame.set_index("row_id")["label"].reindex(base.index)
        differ = labels != base["label"]
        if differ.any():
            raise StateMismatch(f"{path_of[name]} and {path_of[first]} disagree on the label of "
                                f"{int(differ.sum())} row(s) (e.g. {differ[differ].index[0]}): the class "
                                "order differs between model states.")
        bad = (frame["pred"] < 0) | (frame["pred"] >= n_classes)
        if bad.any():
            raise StateMismatch(f"{path_of[name]} predicts class indices outside 0..{n_classes - 1}: it was "
                                "made with another class map than split/class_map.json.")
    test = split_rows[split_rows["split"] == "test"].set_index("row_id")
    foreign = set(base.index) - set(test.index)
    if foreign:
        raise StateMismatch(f"{len(foreign)} predicted row(s) are not test rows of the frozen split "
                            f"(e.g. {sorted(foreign)[0]}); the predictions were made on another split.")
    unscored = set(test.index) - set(base.index)
    if unscored:
        raise StateMismatch(f"{len(unscored)} test row(s) of the frozen split have no prediction "
                            f"(e.g. {sorted(unscored)[0]}); rerun the chapters that score the test.")
    order = sorted(base.index)
    split_label = test.loc[order, "label"].to_numpy()
    if not np.array_equal(split_label, base.loc[order, "label"].to_numpy()):
        raise StateMismatch("prediction labels disagree with split/split.parquet: the predictions "
                            "were made with another class order; rerun training and what follows.")
    rows = pd.DataFrame({"row_id": order, "label": split_label.astype(np.int64),
                         "rel_path": test.loc[order, "rel_path"].to_numpy()})
    indexed = {name: frame.set_index("row_id").loc[order] for name, frame in frames.items()}
    return PairedStates(
        rows=rows,
        preds={n: f["pred"].to_numpy().astype(np.int64) for n, f in indexed.items()},
        margins={n: f["margin"].to_numpy().astype(np.float64) for n, f in indexed.items()},
        model_states={n: str(f["model_state"].iloc[0]) if len(f) else "" for n, f in indexed.items()},
        n_classes=n_classes,
    )


def _test_access(paired: PairedStates, purpose: str) -> dict[str, Any]:
    # No model runs here: the test rows are read as recorded predictions (and, for the gallery, pixels).
    return {"count": len(paired.rows), "via": "prediction records + split.load_frozen", "purpose": purpose}


def class_table(class_map: dict[str, Any], split_rows: pd.DataFrame) -> pd.DataFrame:
    """One row per frozen class: taxonomy fields plus train and test support (counted)."""
    defaults = {"crop": "", "condition": "", "type": "", "fruit": False, "pest": False}
    entries = sorted(class_map["classes"], key=lambda c: c["index"])
    classes = pd.DataFrame([{**defaults, **c} for c in entries])
    counts = pd.crosstab(split_rows["label"], split_rows["split"])
    out = pd.DataFrame({
        "label": classes["index"].astype(int), "class_name": classes["name"],
        "crop": classes["crop"].fillna(""), "condition": classes["condition"].fillna(""),
        "type": classes["type"], "fruit": classes["fruit"].astype(bool),
        "pest": classes["pest"].astype(bool)})
    for split in ("train", "test"):
        column = counts[split] if split in counts else pd.Series(dtype=int)
        out[f"{split}_support"] = out["label"].map(column).fillna(0).astype(int)
    return out
