"""The geometric verifier: ORB + RANSAC finds turned, mirrored and cropped copies, not other pictures."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps
from scipy.ndimage import gaussian_filter

from cropcop_utils.audit import geometry


def _leafy(seed: int, side: int = 128) -> Image.Image:
    """Blobs and lines at several scales: enough corners for ORB, unlike a smooth texture."""
    rng = np.random.default_rng(seed)
    fine = gaussian_filter(rng.normal(size=(side, side)), 1.2)
    coarse = gaussian_filter(rng.normal(size=(side, side)), 6)
    field = 0.6 * fine / fine.std() + coarse / coarse.std()
    grey = np.clip(128 + 40 * field, 0, 255).astype(np.uint8)
    return Image.fromarray(np.stack([grey, np.roll(grey, 3, 0), 255 - grey], axis=-1))


def test_copies_under_camera_changes_are_matched() -> None:
    base = _leafy(1)
    points = geometry.keypoints(base)
    for name, copy in {"turned 35 degrees": base.rotate(35, resample=Image.Resampling.BICUBIC),
                       "cropped": base.crop((20, 16, 120, 118)),
                       "mirrored": ImageOps.mirror(base)}.items():
        matches, inliers, ratio, mirrored, homography = geometry.match_pair(points, geometry.keypoints(copy))
        assert inliers >= 20 and ratio >= 0.5, name
        assert mirrored == (name == "mirrored"), name
        assert np.isfinite(homography).all()


def test_unrelated_pictures_fit_no_homography() -> None:
    points = [geometry.keypoints(_leafy(seed)) for seed in range(2, 6)]
    scores = geometry.verify_pairs(points, np.array([[0, 1], [1, 2], [2, 3], [0, 3]]))
    assert (scores.inliers < 12).all()


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
