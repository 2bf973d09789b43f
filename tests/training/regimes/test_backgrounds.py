"""The background-robust regime's pool and paste step: deterministic, train-only, every choice checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cropcop_utils.training.regimes import backgrounds as bg

SIDE = 32


def _leaf(side: int = SIDE) -> tuple[np.ndarray, np.ndarray]:
    """A green ellipse leaf on a grey card, and its mask."""
    yy, xx = np.mgrid[0:side, 0:side]
    mask = ((yy - side / 2) / (side / 3)) ** 2 + ((xx - side / 2) / (side / 4)) ** 2 <= 1
    square = np.full((side, side, 3), 150, np.uint8)
    square[mask] = (40, 140, 30)
    return square, mask


def _small() -> bg.RobustParams:
    return bg.RobustParams(clutter=2, texture=2, leaf_blur=2, solid=1, gradient=1)


def test_unknown_keys_and_bad_shares_are_refused():
    with pytest.raises(bg.BackgroundConfigError, match="unknown"):
        bg.RobustParams.from_dict({"pastes": 0.5})
    with pytest.raises(bg.BackgroundConfigError, match="paste_p"):
        bg.RobustParams.from_dict({"paste_p": 1.5})
    with pytest.raises(bg.BackgroundConfigError, match="empty"):
        bg.RobustParams.from_dict({k: 0 for k in bg.KINDS})
    assert bg.RobustParams.from_dict({"light": [0.5, 1.0]}).light == (0.5, 1.0)


def test_pool_is_a_pure_function_of_seed_photos_and_masks():
    square, mask = _leaf()
    leaves = [("a", square, mask)]
    images, kinds, origins = bg.build_pool(_small(), SIDE, leaves)
    again = bg.build_pool(_small(), SIDE, leaves)[0]
    assert images.shape == (8, SIDE, SIDE, 3) and images.dtype == np.uint8
    assert np.array_equal(images, again)
    assert {k: kinds.count(k) for k in bg.KINDS} == {"clutter": 2, "texture": 2, "leaf_blur": 2, "solid": 1,
                                                     "gradient": 1}
    assert [o for o, k in zip(origins, kinds, strict=True) if k == "leaf_blur"] == ["a", "a"]
    other = bg.build_pool(dataclasses.replace(_small(), pool_seed=1), SIDE, leaves)[0]
    assert not np.array_equal(images, other)
    data = bg.pool_bytes(images, kinds, origins, spec_sha256="x")
    assert data == bg.pool_bytes(images, kinds, origins, spec_sha256="x")
    loaded, loaded_kinds = bg.load_pool(data)
    assert np.array_equal(loaded, images) and loaded_kinds == kinds


def test_no_leaf_blur_without_a_usable_mask():
    square, _ = _leaf()
    _, kinds, _ = bg.build_pool(_small(), SIDE, [("a", square, np.zeros((SIDE, SIDE), bool))])
    assert "leaf_blur" not in kinds and len(kinds) == 6


def test_paste_keeps_the_leaf_and_changes_the_background():
    square, mask = _leaf()
    pool = np.zeros((1, SIDE, SIDE, 3), np.uint8)  # one black background
    params = dataclasses.replace(_small(), paste_p=1.0, photometric_p=0.0, leaf_scale=(1.0, 1.0), feather=0.0)
    out = bg.BackgroundPaste(params, pool, [mask])(square, 0, torch.Generator().manual_seed(0))
    # the leaf keeps its size and colour (only its rim is blended by the sub-pixel shift); what was the
    # grey card is now the black pool background
    pixels = out.reshape(-1, 3)
    assert 0.8 * mask.sum() <= (pixels == (40, 140, 30)).all(1).sum() <= mask.sum()
    assert (pixels == 0).all(1).sum() >= 0.8 * (~mask).sum()
    assert not (pixels == 150).all(1).any()


def test_paste_is_deterministic_per_seed_and_can_be_switched_off():
    square, mask = _leaf()
    pool = bg.build_pool(_small(), SIDE, [("a", square, mask)])[0]
    paste = bg.BackgroundPaste(_small(), pool, [mask])
    first = paste(square, 0, torch.Generator().manual_seed(3))
    assert np.array_equal(first, paste(square, 0, torch.Generator().manual_seed(3)))
    off = bg.BackgroundPaste(dataclasses.replace(_small(), paste_p=0.0), pool, [mask])
    assert np.array_equal(off(square, 0, torch.Generator().manual_seed(3)), square)
    tiny = np.zeros_like(mask)
    tiny[0, 0] = True  # a failed mask is not pasted
    assert np.array_equal(bg.BackgroundPaste(_small(), pool, [tiny])(square, 0, torch.Generator()), square)


def test_placement_keeps_a_scaled_leaf_inside_the_frame():
    _, mask = _leaf()
    for u in (0.0, 0.5, 1.0):
        matrix = bg.placement(mask, 0.5, u, 1 - u)
        ys, xs = np.nonzero(mask)
        corners = np.array([[xs.min(), ys.min(), 1], [xs.max() + 1, ys.max() + 1, 1]], np.float32)
        moved = corners @ matrix.T
        assert (moved >= -1e-3).all() and (moved <= SIDE + 1e-3).all()


def test_field_look_changes_light_and_white_balance():
    image = np.full((8, 8, 3), 128.0, np.float32)
    p = dataclasses.replace(bg.RobustParams(), white_balance=0.2, light=(0.5, 0.5), gamma=(1.0, 1.0),
                            blur_p=0.0)
    out = bg.field_look(image, p, [1.0, 0.5, 0.0, 0.0, 0.0, 0.9], 8)
    assert out[0, 0, 0] == pytest.approx(128 * 1.2 * 0.5) and out[0, 0, 2] == pytest.approx(128 * 0.8 * 0.5)
