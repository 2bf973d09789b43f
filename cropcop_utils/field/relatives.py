"""Which photos of a scored field cohort the model may have seen in another shot: the cohort photos
related to a labelled field-train photo in chapter 2's cross-set audit (``audit/cross_groups.parquet``,
``audit/cross_sets.parquet``).  Chapter 10's scores and the learning curve leave them out of their "no
relative" figures."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..core.config import RunContext
from ..core.evidence import Chapter
from ..core.sources import FIELD_TRAIN

CROSS_GROUPS = "audit/cross_groups.parquet"   # chapter 2's leakage groups over every source of the run
CROSS_PAIRS = "audit/cross_sets.parquet"      # ... and every pair it proposed across sources, with scores


def field_train_relatives(ch: Chapter, ctx: RunContext,
                          cohort: str | None = None) -> dict[str, set[str]] | None:
    """The photos of a cohort (its short name; default the primary one) related to a labelled field-train
    photo (:func:`relatives_in_audit` of chapter 2's cross-set tables); None when the run has no
    field-train folder."""
    from ..audit.config import settings
    from ..audit.cross_sets import cohort_set_name

    if ctx.field_train is None:
        return None
    name = cohort if cohort is not None else ctx.field_cohorts[0].name
    return relatives_in_audit(ch.read_parquet(CROSS_GROUPS), ch.read_parquet(CROSS_PAIRS), settings(ctx),
                              cohort_set_name(name))


def relatives_in_audit(groups: pd.DataFrame, pairs: pd.DataFrame, cfg: dict[str, Any],
                       cohort_set: str | None = None) -> dict[str, set[str]]:
    """Cohort row_ids related to a field-train photo in the cross-set audit's groups and pairs.

    ``trusted``: in one leakage group with a field-train photo (a copy, the same leaf shot again).
    ``near_miss``: on the audit's review list with one (rejected, but close by leaf-aligned SSIM or RANSAC
    inliers: on the orchard photos the verifiers, calibrated on lab leaves, reject re-shots a person sees
    as one leaf).  The "no relative" scores leave out both, so they err towards too few photos, not
    towards photos the model may have seen.  ``cohort_set`` (``cohort:<name>``) keeps one cohort's rows
    (row ids repeat across cohorts); None keeps every cohort's."""
    from ..audit.figures import review_pairs

    in_field_train = set(groups.loc[groups["set"] == FIELD_TRAIN, "group_id"])
    def is_cohort(sets: pd.Series) -> pd.Series:
        sets = sets.astype(str)
        return sets == cohort_set if cohort_set is not None else sets.str.startswith("cohort:")

    cohort = is_cohort(groups["set"])
    trusted = set(groups.loc[cohort & groups["group_id"].isin(in_field_train), "row_id"])
    field_a, field_b = pairs["set_a"] == FIELD_TRAIN, pairs["set_b"] == FIELD_TRAIN
    cohort_a, cohort_b = is_cohort(pairs["set_a"]), is_cohort(pairs["set_b"])
    across = pairs[(field_a & cohort_b) | (cohort_a & field_b)]
    review = review_pairs(across, float(cfg["leaf_review_ssim"]), int(cfg["geometry_review_inliers"]),
                          float(cfg["geometry_min_ratio"]))
    near = {rb if a == FIELD_TRAIN else ra
            for a, ra, rb in zip(review["set_a"], review["row_id_a"], review["row_id_b"], strict=True)}
    return {"trusted": trusted, "near_miss": near - trusted}
