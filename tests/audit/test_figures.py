"""The audit chapter's figures and the gallery's choice of pairs, from small hand-made tables."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cropcop_utils.audit import figures as audit_figures


def _near_pairs(scores: list[float], trusted: list[bool]) -> pd.DataFrame:
    n = len(scores)
    return pd.DataFrame({
        "rel_path_a": [f"leaf/a{i}.png" for i in range(n)],
        "rel_path_b": [f"leaf/b{i}.png" for i in range(n)],
        "class_a": ["leaf"] * n, "class_b": ["leaf"] * n, "split_a": ["train"] * n, "split_b": ["test"] * n,
        "kind": ["near"] * n, "phash_distance": np.arange(n), "dhash_distance": np.arange(n),
        "verify_score": scores, "trusted": trusted,
    })


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_gallery_takes_the_weakest_confirmed_and_strongest_rejected_pairs():
    pairs = _near_pairs([0.99, 0.90, 0.88, 0.86, 0.50, 0.80], [True, True, True, False, False, False])
    sample = audit_figures.gallery_sample(pairs, n=4)
    assert sample["verify_score"].tolist() == [0.88, 0.90, 0.86, 0.80]
    # one side short: the other fills the gallery
    only_confirmed = audit_figures.gallery_sample(pairs[pairs["trusted"]], n=4)
    assert len(only_confirmed) == 3
    exact = pairs.assign(kind="exact_bytes")
    assert audit_figures.gallery_sample(exact, n=4).empty


def test_review_lists_rejected_pairs_above_either_level_crossing_ones_first():
    pairs = _near_pairs([0.5] * 8, [False, False, False, False, True, False, False, False])
    pairs["leaf_ssim"] = pd.array([0.85, 0.95, 0.81, None, 0.99, 0.70, None, 0.60], dtype="Float64")
    pairs["geometry_inliers"] = pd.array([5, 30, 9, None, 40, 12, 24, 22], dtype="Float64")
    pairs["geometry_ratio"] = pd.array([0.5, 0.9, 0.4, None, 0.9, 0.9, 0.8, 0.5], dtype="Float64")
    pairs["crosses_split"] = [False, False, True, True, True, True, False, True]
    review = audit_figures.review_pairs(pairs, 0.80, 20, 0.7)
    # out: trusted (0.99), unscored (None), below both levels (0.70, 12 inliers), a low ratio (22 at 0.5)
    assert sorted(review.index.tolist()) == [0, 1, 2, 6]
    assert review["review_reason"].to_dict() == {0: "leaf", 1: "leaf+geometry", 2: "leaf", 6: "geometry"}
    sample = audit_figures.review_sample(review, n=10)
    assert sample["leaf_ssim"].tolist()[:3] == [0.81, 0.95, 0.85] and sample["geometry_inliers"].iloc[3] == 24
    assert audit_figures.review_sample(review, n=1)["leaf_ssim"].tolist() == [0.81]
    assert audit_figures.review_pairs(pairs, 2.0, 1000, 0.7).empty  # both levels off: nothing to review


def test_pair_gallery_draws_both_images_of_each_pair(tmp_path):
    pairs = _near_pairs([0.9, 0.5, None], [True, False, True])
    pairs["verify_score"] = pairs["verify_score"].astype("Float64")  # None: SSIM not asked (geometry only)
    pairs["proposed_by"], pairs["verified_by"] = ["phash", "phash", "embedding"], ["ssim", "", "geometry"]
    for rel in [*pairs["rel_path_a"], *pairs["rel_path_b"]]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (40, 160, 60)).save(tmp_path / rel)
    fig = audit_figures.plot_pair_gallery(pairs, tmp_path, threshold=0.87, columns=2)
    assert sum(1 for ax in fig.axes if ax.images) == 6
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("confirmed by ssim" in t for t in texts) and any("rejected" in t for t in texts)
    assert any("embedding" in t and "SSIM n/a" in t and "confirmed by geometry" in t for t in texts)
    empty = audit_figures.plot_pair_gallery(pairs.iloc[:0], tmp_path, threshold=0.87)
    assert "no near candidates" in empty.axes[0].texts[0].get_text()


def test_group_sizes_count_groups_not_rows():
    groups = pd.DataFrame({"group_id": [0, 1, 1, 2, 2, 2], "group_size": [1, 2, 2, 3, 3, 3]})
    fig = audit_figures.plot_group_sizes(groups)
    heights = [patch.get_height() for patch in fig.axes[0].patches]
    assert heights == [1, 1, 1]


def test_threshold_evidence_adds_the_truth_panel_only_with_truth():
    table = pd.DataFrame({"radius": [0, 4, 8], "candidate_pairs": [1, 5, 40], "capped_pairs": [1, 5, 30],
                          "confirmed_pairs": [1, 4, 6]})
    assert len(audit_figures.plot_threshold_evidence(table, 4).axes) == 1
    truth = table.assign(recall_near_duplicate=[0.1, 0.8, 0.9], recall_crop=[0.0, 0.5, 0.7],
                         recall_reshot=[0.0, 0.2, 0.4], precision_near=[1.0, 1.0, 0.9])
    assert len(audit_figures.plot_threshold_evidence(truth, 4).axes) == 2


def test_verifier_calibration_marks_the_chosen_threshold():
    calibration = pd.DataFrame({"threshold": [0.80, 0.85, 0.90], "recall_near_duplicate": [1.0, 0.9, 0.6],
                                "recall_crop": [0.9, 0.8, 0.5], "recall_reshot": [0.7, 0.5, 0.2],
                                "precision_near": [0.8, 0.95, 1.0]})
    fig = audit_figures.plot_verifier_calibration(calibration, 0.86)
    marked = fig.axes[0].collections[0].get_offsets()[0]
    assert tuple(marked) == (0.9, 0.95)
