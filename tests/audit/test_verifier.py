"""The near-pair verifier: SSIM as skimage defines it, registration that undoes small warps."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy.ndimage import gaussian_filter
from skimage.metrics import structural_similarity

from cropcop_utils.audit import verifier


def _texture(seed: int, side: int = 96) -> np.ndarray:
    """A smooth random grey texture (what a leaf with veins and lesions looks like to a 32 px thumb)."""
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(side, side)), 3.0)
    field = (field - field.min()) / (field.max() - field.min())
    return (40 + 180 * field).astype(np.uint8)


def _leaf_photo(seed: int, angle: float = 0.0, scale: float = 1.0, shift: tuple[int, int] = (0, 0),
                side: int = 128) -> Image.Image:
    """A textured ellipse ("leaf") on a flat backdrop, optionally rotated / zoomed / shifted."""
    texture = Image.fromarray(_texture(seed, side)).convert("RGB")
    tint = Image.new("RGB", (side, side), (40, 140, 50))
    leaf = Image.blend(texture, tint, 0.5)
    mask = Image.new("L", (side, side), 0)
    ImageDraw.Draw(mask).ellipse((side * 0.2, side * 0.1, side * 0.8, side * 0.9), fill=255)
    canvas = Image.new("RGB", (side, side), (205, 200, 190))
    canvas.paste(leaf, (0, 0), mask)
    warped = canvas.rotate(angle, resample=Image.Resampling.BICUBIC, translate=shift,
                           fillcolor=(205, 200, 190))
    if scale != 1.0:
        big = round(side * scale)
        zoomed = warped.resize((big, big), Image.Resampling.BICUBIC)
        left = (big - side) // 2
        warped = zoomed.crop((left, left, left + side, left + side))
    return warped


def _thumbs(images: list[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [verifier.thumbnail(img) for img in images]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def test_ssim_map_matches_skimage() -> None:
    import torch

    rng = np.random.default_rng(0)
    for seed in range(3):
        a = _texture(seed, 32).astype(np.float64)
        b = np.clip(a + rng.normal(0, 12, a.shape), 0, 255)
        ours = verifier.ssim_map(torch.tensor(a[None]), torch.tensor(b[None])).mean().item()
        reference = structural_similarity(a, b, data_range=255, win_size=7)
        assert ours == pytest.approx(reference, abs=1e-6)


def test_subject_weight_is_high_on_the_leaf_and_zero_on_the_edge() -> None:
    grey, weight = verifier.thumbnail(_leaf_photo(1))
    assert grey.shape == weight.shape == (verifier.THUMB, verifier.THUMB)
    assert weight[0].max() == 0 and weight[:, -1].max() == 0
    centre = weight[12:20, 12:20].mean()
    backdrop = weight[3:6, 3:6].mean()
    assert centre > 200 and backdrop < 30


def test_registration_recovers_a_rotated_and_zoomed_copy() -> None:
    base = _leaf_photo(3)
    images = [base, _leaf_photo(3, angle=4.0, shift=(3, -2)), base, _leaf_photo(3, scale=1.06), base,
              _leaf_photo(9)]
    grey, weight = _thumbs(images)
    result = verifier.verify_pairs(grey, weight, np.array([[0, 1], [2, 3], [4, 5]]))
    rotated, zoomed, unrelated = result.score
    assert rotated > 0.9 and zoomed > 0.9
    assert unrelated < 0.8  # same silhouette, other texture: well below any sensible threshold
    assert abs(result.angle[0]) == pytest.approx(4.0)
    assert min(abs(result.scale[1] - 1.06), abs(result.scale[1] - 0.94)) < 1e-3  # a zoom was chosen
    # registration helps the warped copies: the registered score beats the plain one
    assert result.registered[0] > result.plain[0] and result.registered[1] > result.plain[1]


def test_identical_thumbnails_score_one() -> None:
    grey, weight = _thumbs([_leaf_photo(5), _leaf_photo(5)])
    assert verifier.verify_pairs(grey, weight, np.array([[0, 1]])).score[0] == pytest.approx(1.0, abs=1e-4)


def test_pool_and_batches_do_not_change_scores() -> None:
    grey, weight = _thumbs([_leaf_photo(s, angle=2.0 * (s % 3)) for s in range(6)])
    pairs = np.array([[i, j] for i in range(6) for j in range(i + 1, 6)])
    single = verifier.verify_pairs(grey, weight, pairs, batch=4, workers=1)
    pooled = verifier.verify_pairs(grey, weight, pairs, batch=2, workers=2)
    np.testing.assert_allclose(single.score, pooled.score, atol=1e-5)
    assert verifier.verify_pairs(grey, weight, np.zeros((0, 2), dtype=int)).score.shape == (0,)


def test_bad_input_is_refused() -> None:
    grey, weight = _thumbs([_leaf_photo(1), _leaf_photo(2)])
    with pytest.raises(verifier.VerifierInputError, match="pair indices"):
        verifier.verify_pairs(grey, weight, np.array([[0, 2]]))
    with pytest.raises(verifier.VerifierInputError, match="thumbnails"):
        verifier.verify_pairs(grey, weight[:, :8], np.array([[0, 1]]))
