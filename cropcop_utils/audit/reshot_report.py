"""What the re-shot verifier (:mod:`.reshot`) did on this corpus, in numbers and two galleries.

Chapter 2 shows the pairs only it trusted (nearest its threshold first: the ones a reader should check)
and the scored pairs it still rejected with the most inliers (what it leaves out), so a reader can judge
both its precision and what it misses by eye, as ``bench/reshot_labels.csv`` did on PlantVillage tomato.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import reshot

SHOWN = ["rel_path_a", "rel_path_b", "class_a", "class_b", "split_a", "split_b", "crosses_split",
         "reshot_matches", "reshot_inliers", "reshot_scale", "reshot_angle", "reshot_mirrored",
         "geometry_inliers", "leaf_ssim"]


def only_reshot(relationships: pd.DataFrame) -> pd.DataFrame:
    """Trusted near pairs no other verifier (nor a reviewer) confirmed: what the re-shot verifier adds."""
    near = relationships[(relationships["kind"] == "near") & relationships["trusted"]]
    return near[near["verified_by"].astype(str) == "reshot"]


def rejected_scored(relationships: pd.DataFrame) -> pd.DataFrame:
    """Rejected near pairs the re-shot verifier scored, most inliers first (its near misses)."""
    near = relationships[(relationships["kind"] == "near") & ~relationships["trusted"]]
    scored = near[near["reshot_inliers"].notna()]
    return scored.sort_values(["reshot_inliers", "reshot_matches"], ascending=False, kind="stable")


def added_sample(added: pd.DataFrame, n: int) -> pd.DataFrame:
    """The added pairs a reader should look at first: crossing the split, then fewest inliers."""
    return added.sort_values(["crosses_split", "reshot_inliers"], ascending=[False, True],
                             kind="stable").head(n).reset_index(drop=True)


def reshot_block(relationships: pd.DataFrame, cfg: dict[str, Any], candidates: Any,
                 seconds: float) -> dict[str, Any]:
    """The chapter's ``reshot`` figures: settings, pairs scored, trusted, added, crossing, and time."""
    added = only_reshot(relationships)
    near_trusted = relationships[(relationships["kind"] == "near") & relationships["trusted"]]
    confirmed = near_trusted["verified_by"].astype(str).str.split("+").map(lambda v: "reshot" in v)
    scored = relationships["reshot_inliers"].notna() & (relationships["kind"] == "near")
    return {
        "on": bool(cfg["reshot_verifier"]),
        "settings": {"screen_inliers": int(cfg["reshot_screen_inliers"]),
                     "screen_leaf_ssim": float(cfg["reshot_screen_leaf"]),
                     "min_inliers": int(cfg["reshot_min_inliers"]),
                     "support_inliers": int(cfg["reshot_support_inliers"]),
                     "min_share": float(cfg["reshot_min_share"]), "max_angle": float(cfg["reshot_max_angle"]),
                     "scale_range": list(reshot.SCALE_RANGE), "side": reshot.SIDE,
                     "features": reshot.FEATURES, "ransac_sides": reshot.RANSAC_SIDES},
        "scored_pairs": int(scored.sum()),
        "scored_candidates": int(np.asarray(candidates.reshot.done).sum()),
        "confirmed_pairs": int(confirmed.sum()),
        "added_pairs": int(len(added)),
        "added_mirrored": int(added["reshot_mirrored"].fillna(False).sum()),
        "added_crossing": int(added["crosses_split"].sum()),
        "added_label_conflicts": int(added["label_conflict"].sum()),
        "seconds": round(float(seconds), 2),
        "evidence": "audit/relationships.parquet (verified_by = reshot; reshot_matches, reshot_inliers, "
                    "reshot_scale, reshot_angle)",
    }


def reshot_text(block: dict[str, Any], groups: dict[str, Any]) -> str:
    """The re-shot verifier's paragraph: what it scored, what it alone trusted, and where the groups stand."""
    if not block["on"]:
        return "The re-shot verifier is off on this run (`audit.reshot_verifier: false`)."
    s = block["settings"]
    share = groups["rows_in_multi_row_groups"] / groups["rows"] if groups["rows"] else 0.0
    return (f"The re-shot verifier scored **{block['scored_pairs']:,}** open pairs (those with at least "
            f"{s['screen_inliers']} ORB inliers or a leaf-aligned SSIM of {s['screen_leaf_ssim']:.2f}) in "
            f"{block['seconds']:.0f} s. It trusts a pair whose leaf keypoints one similarity explains — "
            f"scale {s['scale_range'][0]:.2f}–{s['scale_range'][1]:.2f}, a turn of at most "
            f"{s['max_angle']:.0f}°, and {s['min_inliers']} inliers, or {s['support_inliers']} that are at "
            f"least {s['min_share']:.0%} of the matches. **{block['added_pairs']:,}** pairs are trusted by "
            f"it alone ({block['added_mirrored']:,} as a mirror image: a flipped copy, or the leaf's other "
            f"side), **{block['added_crossing']:,}** of them across the inherited split "
            f"({block['added_label_conflicts']:,} with two different labels). After it, "
            f"{groups['rows_in_multi_row_groups']:,} of {groups['rows']:,} images ({share:.1%}) sit in a "
            f"leakage group of more than one, the largest holding {groups['largest_group']:,}.")
