"""The geometric verifier: ORB + RANSAC finds turned, mirrored and cropped copies, not other pictures."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image, ImageOps
from scipy.ndimage import gaussian_filter

from cropcop_utils import audit
from cropcop_utils.audit import candidates, geometry, verifier
from cropcop_utils.core.config import load_profile


def _leafy(seed: int, side: int = 128) -> Image.Image:
    """Blobs and lines at several scales: enough corners for ORB, unlike a smooth texture."""
    rng = np.random.default_rng(seed)
    fine = gaussian_filter(rng.normal(size=(side, side)), 1.2)
    coarse = gaussian_filter(rng.normal(size=(side, side)), 6)
    field = 0.6 * fine / fine.std() + coarse / coarse.std()
    grey = np.clip(128 + 40 * field, 0, 255).astype(np.uint8)
    return Image.fromarray(np.stack([grey, np.roll(grey, 3, 0), 255 - grey], axis=-1))


# Measured (inliers, inlier ratio, aligned SSIM): turned 60 / 0.83 / 0.98, cropped 41 / 0.91 / 0.98,
# mirrored 150 / 1.00 / 1.00; the floors sit just below, all above what the shipped profile demands.
FLOORS = {"turned 35 degrees": (54, 0.8, 0.95), "cropped": (36, 0.85, 0.95), "mirrored": (140, 0.95, 0.99)}


@pytest.mark.parametrize("profile", ["default", "smoke"])
def test_copies_under_camera_changes_are_confirmed_at_the_profiles_settings(profile: str) -> None:
    cfg = audit.settings(load_profile(profile)["audit"])
    base = _leafy(1)
    copies = {"turned 35 degrees": base.rotate(35, resample=Image.Resampling.BICUBIC),
              "cropped": base.crop((20, 16, 120, 118)), "mirrored": ImageOps.mirror(base)}
    pictures = [base, *copies.values()]
    thumbs = [verifier.thumbnail(p) for p in pictures]
    hashes = SimpleNamespace(grey=np.stack([t[0] for t in thumbs]), weight=np.stack([t[1] for t in thumbs]))
    pairs = np.array([[0, k] for k in range(1, len(pictures))])
    scores = geometry.verify_pairs([geometry.keypoints(p) for p in pictures], pairs)
    aligned = candidates._aligned_ssim(hashes, pairs, scores, int(cfg["geometry_min_inliers"]))
    for k, name in enumerate(copies):
        inliers, ratio = scores.inliers[k], scores.ratio[k]
        # the geometric verifier's verdict (NearCandidates.geometry_ok) at the profile's thresholds
        assert inliers >= cfg["geometry_min_inliers"] and ratio >= cfg["geometry_min_ratio"], name
        assert aligned[k] >= cfg["geometry_min_ssim"], name
        floor_inliers, floor_ratio, floor_ssim = FLOORS[name]
        assert inliers >= floor_inliers and ratio >= floor_ratio and aligned[k] >= floor_ssim, name
        assert scores.mirrored[k] == (name == "mirrored"), name
        assert np.isfinite(scores.homography[k]).all()


def test_unrelated_pictures_fit_no_homography() -> None:
    points = [geometry.keypoints(_leafy(seed)) for seed in range(2, 6)]
    scores = geometry.verify_pairs(points, np.array([[0, 1], [1, 2], [2, 3], [0, 3]]))
    # measured: 5-8 inliers, ratio 0.29-0.42 (the profile demands 24 and 0.7)
    assert (scores.inliers < 12).all() and (scores.ratio < 0.5).all()


def test_align_with_identity_keeps_the_picture() -> None:
    grey = np.asarray(_leafy(7, 32).convert("L"))
    warped, inside = geometry.align(grey, np.eye(3, dtype=np.float32), mirrored=False)
    assert np.abs(warped - grey).max() < 1e-3 and inside.min() == 1


def test_pool_and_order_do_not_change_scores() -> None:
    points = [geometry.keypoints(_leafy(seed)) for seed in range(3)]
    pairs = np.array([[0, 1], [1, 2], [0, 2]])
    single = geometry.verify_pairs(points, pairs, workers=1, task=1)
    pooled = geometry.verify_pairs(points, pairs, workers=2, task=1)
    assert np.array_equal(single.inliers, pooled.inliers)
    assert geometry.verify_pairs(points, np.zeros((0, 2), int)).inliers.shape == (0,)
