"""Field-train photos into train / val by the cross-set leakage groups (``--field-train``).

Input: chapter 1's admitted field-train rows (``corpus/field_train.parquet``) and chapter 2's groups over
every set (``audit/cross_groups.parquet``: row_id, set, rel_path, group_id; set ``lab``, ``field_train``
or ``cohort:<folder>``).  The lab split is made first and never changes; field-train rows follow it
(the read-back check, :func:`check_field_train`, is in :mod:`.frozen` with the lab's):

1. A field-train row whose class did not survive the lab split has no label to train on: excluded
   (``class_not_in_split``).
2. A group that holds split lab rows: its field-train rows join those rows' split — lab train -> field
   train, lab val -> field val; a lab test relative excludes them (``lab_test_relative``: the model would
   train or be selected on a copy of a locked test photo).  A group whose lab rows sit in both train and
   val (a field photo that ties two lab groups together) is excluded too
   (``lab_relatives_across_splits``): either side would put a relative across the cut.
3. The other groups are cut into train / val whole, stratified by each group's majority class, with the
   lab split's machinery (:func:`cropcop_utils.split.plan.fold_counts`, ``StratifiedGroupKFold``) at
   ``split.field_train_fractions``.

There is no field-train test split: the scored field cohorts (``--field``) are the field test, and
chapter 10 reports them with and without the photos that have a relative in field-train.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..core.sources import FIELD_TRAIN, LAB
from .frozen import (
    CORPUS_FIELD_TRAIN,
    CROSS_GROUPS,
    FIELD_SPLITS,
    FIELD_TRAIN_EXCLUDED,
    FIELD_TRAIN_FILES,
    FIELD_TRAIN_SPLIT,
    check_field_train,
)
from .plan import SplitInputError, _best_folds, fold_counts, folds_for, require_groups

__all__ = ["CORPUS_FIELD_TRAIN", "CROSS_GROUPS", "EXCLUDED_COLUMNS", "FIELD_COLUMNS", "FIELD_SPLITS",
           "FIELD_TRAIN_EXCLUDED", "FIELD_TRAIN_FILES", "FIELD_TRAIN_SPLIT", "FieldTrainPlan",
           "check_field_train", "field_train_block", "plan_field_train"]

FIELD_COLUMNS = ["row_id", "rel_path", "class_name", "label", "group_id", "split", "source"]
EXCLUDED_COLUMNS = ["row_id", "rel_path", "class_name", "group_id", "reason"]
EXCLUSION_REASONS = ("class_not_in_split", "lab_test_relative", "lab_relatives_across_splits")
DEFAULT_FRACTIONS = {"train": 0.85, "val": 0.15}


@dataclass
class FieldTrainPlan:
    rows: pd.DataFrame       # FIELD_COLUMNS
    excluded: pd.DataFrame   # EXCLUDED_COLUMNS
    fractions: dict[str, float]
    n_folds: int
    val_folds: list[int]
    groups: dict[str, int]


def parse_field_fractions(fractions: dict[str, float] | None) -> dict[str, float]:
    """``split.field_train_fractions`` as {train, val}, each > 0, summing to 1."""
    fractions = DEFAULT_FRACTIONS if fractions is None else fractions
    if not isinstance(fractions, dict) or set(fractions) != set(FIELD_SPLITS) or any(
            not isinstance(v, (int, float)) or float(v) <= 0 for v in fractions.values()):
        raise SplitInputError(f"split.field_train_fractions must give train and val, each > 0 (field-train "
                              f"has no test split); got {fractions!r}")
    total = sum(float(v) for v in fractions.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise SplitInputError(f"split.field_train_fractions must sum to 1; {fractions} sums to {total:.6f}")
    return {name: float(fractions[name]) for name in FIELD_SPLITS}


def field_train_groups(field_rows: pd.DataFrame, cross_groups: pd.DataFrame) -> pd.DataFrame:
    """The admitted field-train rows with their cross-set group; refuses when chapters 1 and 2 disagree."""
    required = {"row_id", "set", "group_id"}
    if not required <= set(cross_groups.columns):
        lacking = sorted(required - set(cross_groups.columns))
        raise SplitInputError(f"{CROSS_GROUPS} lacks column(s) {lacking}; rerun chapter 'audit' (02_audit).")
    ours = cross_groups[cross_groups["set"] == FIELD_TRAIN]
    require_groups(field_rows["row_id"], ours, CROSS_GROUPS, f"the field-train rows of {CORPUS_FIELD_TRAIN}")
    return field_rows[["row_id", "rel_path", "class_name"]].merge(
        ours[["row_id", "group_id"]], on="row_id", how="left", validate="one_to_one")


def lab_splits_of_groups(cross_groups: pd.DataFrame, lab_rows: pd.DataFrame) -> pd.Series:
    """group_id -> the sorted tuple of lab splits its split lab rows sit in (groups with none absent)."""
    lab = cross_groups.loc[cross_groups["set"] == LAB, ["row_id", "group_id"]]
    lab = lab.merge(lab_rows[["row_id", "split"]], on="row_id", how="inner")
    return lab.groupby("group_id")["split"].agg(lambda s: tuple(sorted(set(s))))


def plan_field_train(field_rows: pd.DataFrame, cross_groups: pd.DataFrame, lab_rows: pd.DataFrame,
                     class_names: list[str], fractions: dict[str, float] | None, seed: int) -> FieldTrainPlan:
    """Assign every admitted field-train row to train, val or an exclusion (see the module docstring).

    ``lab_rows`` is the frozen lab split (row_id, split); ``class_names`` the frozen class map in label
    order.  Deterministic: rows are sorted by row_id first.
    """
    fractions = parse_field_fractions(fractions)
    rows = field_train_groups(field_rows, cross_groups).sort_values("row_id", kind="stable")
    rows = rows.reset_index(drop=True)
    lab_of_group = lab_splits_of_groups(cross_groups, lab_rows)
    reason = pd.Series(None, index=rows.index, dtype=object)
    split = pd.Series(None, index=rows.index, dtype=object)
    reason[~rows["class_name"].isin(class_names)] = "class_not_in_split"
    followed = rows["group_id"].map(lab_of_group)
    has_lab = followed.notna()
    for i in rows.index[has_lab & reason.isna()]:
        splits = followed[i]
        if "test" in splits:
            reason[i] = "lab_test_relative"
        elif len(splits) > 1:
            reason[i] = "lab_relatives_across_splits"
        else:
            split[i] = splits[0]
    free = rows[~has_lab & reason.isna()]
    n_folds, per_split = folds_for(fractions)
    val_folds: list[int] = []
    if len(free):
        n_groups = free["group_id"].nunique()
        if n_groups < n_folds:
            raise SplitInputError(
                f"only {n_groups} field-train leakage group(s) without a lab relative for a {n_folds}-fold "
                f"grouped train/val cut (split.field_train_fractions {fractions}); give more field-train "
                "photos or a coarser fraction.")
        fold, counts = fold_counts(free, n_folds, seed)
        val_folds = sorted(_best_folds(counts, list(range(n_folds)), per_split["val"], fractions["val"],
                                       min_per_split=1, rest_need=1))
        split[free.index] = np.where(fold.isin(val_folds), "val", "train")
    label_of = {name: i for i, name in enumerate(class_names)}
    kept = rows[reason.isna()].assign(split=split[reason.isna()], source=FIELD_TRAIN)
    kept = kept.assign(label=kept["class_name"].map(label_of).astype("int64"))[FIELD_COLUMNS]
    excluded = rows[reason.notna()].assign(reason=reason[reason.notna()])[EXCLUDED_COLUMNS]
    groups = {
        "total": int(rows["group_id"].nunique()),
        "with_lab_relative": int(rows.loc[has_lab, "group_id"].nunique()),
        "cut": int(free["group_id"].nunique()),
        "multi_row": int((rows["group_id"].value_counts() > 1).sum()),
    }
    return FieldTrainPlan(rows=kept.sort_values("rel_path", kind="stable").reset_index(drop=True),
                          excluded=excluded.sort_values("rel_path", kind="stable").reset_index(drop=True),
                          fractions=fractions, n_folds=n_folds, val_folds=val_folds, groups=groups)


def field_train_block(plan: FieldTrainPlan, check: dict[str, Any], class_names: list[str],
                      seed: int) -> dict[str, Any]:
    """The ``field_train`` block of ``split/split.json``."""
    rows = plan.rows
    table = pd.crosstab(rows["class_name"], rows["split"]).reindex(
        index=[c for c in class_names if c in set(rows["class_name"])], columns=list(FIELD_SPLITS),
        fill_value=0)
    excluded = plan.excluded
    totals = {name: int((rows["split"] == name).sum()) for name in FIELD_SPLITS}
    return {
        "rows": FIELD_TRAIN_SPLIT, "excluded_rows": FIELD_TRAIN_EXCLUDED,
        "rows_split": len(rows), "rows_excluded": len(excluded),
        "totals": totals,
        "fractions": {k: round(v / max(1, len(rows)), 6) for k, v in totals.items()},
        "target_fractions": plan.fractions,
        "per_class": {c: {s: int(n) for s, n in r.items()} for c, r in table.iterrows()},
        "classes_without_val": [c for c in table.index if table.at[c, "val"] == 0],
        "excluded_by_reason": {r: int((excluded["reason"] == r).sum()) for r in EXCLUSION_REASONS},
        "excluded_per_class": {c: int(n)
                               for c, n in excluded["class_name"].value_counts().sort_index().items()},
        "groups": plan.groups,
        "method": {"splitter": "sklearn.model_selection.StratifiedGroupKFold", "shuffle": True, "seed": seed,
                   "n_folds": plan.n_folds, "val_folds": plan.val_folds,
                   "stratify_by": "majority class of each leakage group",
                   "groups_from": CROSS_GROUPS,
                   "follows_lab": "a group with a split lab row takes its split; lab test excludes it"},
        "crossings": {**check, "checked_from": [FIELD_TRAIN_SPLIT, FIELD_TRAIN_EXCLUDED, CORPUS_FIELD_TRAIN,
                                                 CROSS_GROUPS, "split/split.parquet"]},
    }
