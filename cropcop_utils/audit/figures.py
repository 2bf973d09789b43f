"""Figures of the audit chapter: a gallery of found pairs, group sizes, the threshold evidence, recall per
planted kind and candidate source."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core import imaging


def gallery_sample(relationships: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    """Near pairs closest to the verifier's decision: the weakest confirmed and strongest rejected.

    Half confirmed (lowest scores first), half rejected (highest first), so a reader sees both sides of
    the threshold; when one side is short, the other fills in.
    """
    near = relationships[relationships["kind"] == "near"]
    confirmed = near[near["trusted"]].sort_values(["verify_score", "phash_distance"], ascending=[True, False])
    rejected = near[~near["trusted"]].sort_values(["verify_score", "phash_distance"], ascending=[False, True])
    take_c = min(len(confirmed), max(n // 2, n - len(rejected)))
    take_r = min(len(rejected), n - take_c)
    return pd.concat([confirmed.head(take_c), rejected.head(take_r)]).reset_index(drop=True)


def review_pairs(relationships: pd.DataFrame, min_leaf_ssim: float, min_inliers: int,
                 min_ratio: float) -> pd.DataFrame:
    """Rejected near pairs worth a human look (the chapter's review list), flagged by reason
    (``review_leaf``, ``review_geometry``; ``review_reason`` names them, ``leaf+geometry`` for both).

    ``leaf``: the leaf-aligned SSIM reaches ``min_leaf_ssim``; ``geometry``: the homography has at least
    ``min_inliers`` RANSAC inliers at an inlier ratio of at least ``min_ratio``, below the geometric
    verifier's own inlier count.
    """
    rejected = relationships[(relationships["kind"] == "near") & ~relationships["trusted"]]
    leaf = rejected["leaf_ssim"].astype(float).fillna(-1.0).to_numpy() >= min_leaf_ssim
    geometry = ((rejected["geometry_inliers"].astype(float).fillna(-1.0).to_numpy() >= min_inliers)
                & (rejected["geometry_ratio"].astype(float).fillna(-1.0).to_numpy() >= min_ratio))
    reason = np.where(leaf & geometry, "leaf+geometry", np.where(leaf, "leaf", "geometry"))
    flagged = rejected.assign(review_leaf=leaf, review_geometry=geometry, review_reason=reason)
    return flagged[leaf | geometry]


def review_sample(review: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    """The review list's first ``n`` pairs: those crossing the inherited split first, then the highest
    leaf-aligned SSIM, then the most inliers."""
    order = ["crosses_split", "leaf_ssim", "geometry_inliers"]
    return review.sort_values(order, ascending=[False] * 3, na_position="last").head(n).reset_index(drop=True)


def plot_pair_gallery(sample: pd.DataFrame, corpus_root: str | os.PathLike, threshold: float,
                      columns: int = 2) -> Figure:
    """Both images of each sampled pair side by side with distances, verifier score, labels, splits."""
    import matplotlib.pyplot as plt

    n = max(1, len(sample))
    rows = math.ceil(n / columns)
    fig, axes = plt.subplots(rows, 2 * columns, figsize=(3.2 * columns * 2, 3.3 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    if sample.empty:
        axes[0, 0].text(0, 0.5, "no near candidates to show", fontsize=12)
        return fig
    for k, pair in enumerate(sample.itertuples(index=False)):
        r, c = divmod(k, columns)
        for side, (rel, cls, split) in enumerate(((pair.rel_path_a, pair.class_a, pair.split_a),
                                                  (pair.rel_path_b, pair.class_b, pair.split_b))):
            ax = axes[r, 2 * c + side]
            ax.imshow(imaging.open_rgb(Path(corpus_root) / rel))
            ax.set_title(f"{cls[:28]}\n{split}: {Path(rel).name[:26]}", fontsize=7)
        sources = getattr(pair, "proposed_by", "phash") or "-"
        score = "n/a" if pd.isna(pair.verify_score) else f"{pair.verify_score:.3f}"
        decided = f"confirmed by {getattr(pair, 'verified_by', '') or 'ssim'}" if pair.trusted else \
            "rejected by every verifier"
        inliers = getattr(pair, "geometry_inliers", None)
        ratio = getattr(pair, "geometry_ratio", None)
        geometry = f"  inliers {inliers:.0f}" if inliers is not None and not pd.isna(inliers) else ""
        geometry += f" ({ratio:.2f})" if geometry and ratio is not None and not pd.isna(ratio) else ""
        leaf = getattr(pair, "leaf_ssim", None)
        geometry += f"  leaf {leaf:.3f}" if leaf is not None and not pd.isna(leaf) else ""
        shot = getattr(pair, "reshot_inliers", None)
        if shot is not None and not pd.isna(shot):
            flipped = " of the mirror image" if bool(getattr(pair, "reshot_mirrored", False)) else ""
            geometry += (f"\nre-shot: {shot:.0f}/{pair.reshot_matches:.0f} leaf matches fit one move"
                         f"{flipped} (turn {pair.reshot_angle:.0f}°, scale {pair.reshot_scale:.2f})")
        axes[r, 2 * c].text(
            0.0, -0.08, f"{sources}: pHash {pair.phash_distance}  SSIM {score}{geometry}\n({decided}; "
            f"SSIM threshold {threshold:.2f})",
            transform=axes[r, 2 * c].transAxes, fontsize=7.5, va="top",
            color="tab:green" if pair.trusted else "tab:red")
    fig.tight_layout()
    return fig


def plot_group_sizes(groups: pd.DataFrame) -> Figure:
    """Number of leakage groups of each size (log scale): singletons, pairs, families."""
    import matplotlib.pyplot as plt

    sizes = groups.drop_duplicates("group_id")["group_size"].value_counts().sort_index()
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.bar(sizes.index.astype(str), sizes.to_numpy(), color="tab:blue")
    ax.set_yscale("log")
    ax.set_xlabel("group size (images)")
    ax.set_ylabel("groups")
    ax.set_title("Trusted leakage groups by size")
    for x, y in zip(range(len(sizes)), sizes.to_numpy(), strict=True):
        ax.annotate(f"{y:,}", (x, y), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    return fig


def plot_threshold_evidence(table: pd.DataFrame, radius: int) -> Figure:
    """Candidate / capped / confirmed pairs per pHash radius; with truth, recall and precision too."""
    import matplotlib.pyplot as plt

    has_truth = "recall_near_duplicate" in table
    fig, axes = plt.subplots(1, 2 if has_truth else 1, figsize=(12 if has_truth else 6.5, 3.6), squeeze=False)
    ax = axes[0, 0]
    for column, label in (("candidate_pairs", "within radius"), ("capped_pairs", "after per-image cap"),
                          ("confirmed_pairs", "confirmed by verifier")):
        ax.plot(table["radius"], table[column].clip(lower=0.8), marker="o", ms=3, label=label)
    ax.set_yscale("log")
    ax.axvline(radius, color="grey", ls="--", lw=1)
    ax.set_xlabel("pHash radius (bits)")
    ax.set_ylabel("near pairs")
    ax.legend(fontsize=8)
    ax.set_title("Near candidates by pHash radius")
    if has_truth:
        ax = axes[0, 1]
        for column, label in (("recall_near_duplicate", "recall: near duplicates"),
                              ("recall_crop", "recall: crops"), ("recall_reshot", "recall: re-shots"),
                              ("precision_near", "precision: trusted near pairs")):
            ax.plot(table["radius"], table[column], marker="o", ms=3, label=label)
        ax.axvline(radius, color="grey", ls="--", lw=1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("pHash radius (bits)")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title("Against the planted truth")
    fig.tight_layout()
    return fig


def plot_verifier_calibration(calibration: pd.DataFrame, threshold: float) -> Figure:
    """Precision-recall of the verifier threshold on the planted truth (near duplicates and re-shots)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    ax.plot(calibration["recall_near_duplicate"], calibration["precision_near"], marker=".",
            label="near duplicates")
    ax.plot(calibration["recall_reshot"], calibration["precision_near"], marker=".", label="re-shots")
    chosen = calibration.iloc[(calibration["threshold"] - threshold).abs().argmin()]
    ax.scatter([chosen["recall_near_duplicate"]], [chosen["precision_near"]], color="black", zorder=3,
               label=f"threshold {threshold:.2f}")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision of trusted near pairs")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("Verifier precision-recall (planted truth)")
    ax = axes[1]
    for column in ("recall_near_duplicate", "recall_crop", "recall_reshot", "precision_near"):
        ax.plot(calibration["threshold"], calibration[column], label=column.replace("_", " "))
    ax.axvline(threshold, color="grey", ls="--", lw=1)
    ax.set_xlabel("verifier threshold")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("By threshold")
    fig.tight_layout()
    return fig


def plot_recall_by_source(by_source: pd.DataFrame) -> Figure:
    """Per planted kind: recall of the trusted relationships, and what each candidate source proposed."""
    import matplotlib.pyplot as plt

    kinds = by_source["kind"].tolist()
    columns = [("recall", "trusted (all sources)", "black")] + [
        (c, c.replace("proposed_", "proposed: "), colour)
        for c, colour in (("proposed_phash", "tab:blue"), ("proposed_dihedral", "tab:orange"),
                          ("proposed_embedding", "tab:green"), ("proposed_rings", "tab:purple"))
        if c in by_source]
    fig, ax = plt.subplots(figsize=(12, 3.8))
    x = np.arange(len(kinds))
    width = 0.8 / len(columns)
    for k, (column, label, colour) in enumerate(columns):
        values = by_source[column].astype(float).fillna(0).to_numpy()
        ax.bar(x + (k - (len(columns) - 1) / 2) * width, values, width, label=label, color=colour)
    ax.set_xticks(x, [f"{k}\n({n})" for k, n in zip(kinds, by_source["planted_pairs"], strict=True)],
                  rotation=60, fontsize=7, ha="right")
    ax.set_ylim(0, 1.05)
    ax.axhline(0.95, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("share of planted pairs")
    ax.set_title("Recall per planted kind (planted pairs) and candidate source")
    ax.legend(fontsize=7, ncol=4, loc="lower left")
    fig.tight_layout()
    return fig
