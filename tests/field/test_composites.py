"""Background-swap composites keep the leaf pixels identical; the gap formula and its undefined case."""

from __future__ import annotations

import numpy as np
import pytest

from cropcop_utils.field import composites as comp


def _leaf_photo(rng: np.random.Generator, shape=(40, 30), backdrop=(200, 200, 205)):
    rgb = np.empty((*shape, 3), dtype=np.uint8)
    rgb[:] = backdrop
    mask = np.zeros(shape, dtype=bool)
    mask[8:30, 6:22] = True
    rgb[mask] = rng.integers(0, 256, size=(int(mask.sum()), 3), dtype=np.uint8)
    return rgb, mask


def test_every_composite_keeps_the_leaf_pixels_bit_for_bit():
    rng = np.random.default_rng(0)
    lab, lab_mask = _leaf_photo(rng)
    donor, donor_mask = _leaf_photo(rng, shape=(50, 50), backdrop=(180, 190, 200))
    field_photo = rng.integers(0, 256, size=(120, 90, 3), dtype=np.uint8)
    field_leaf, field_mask = _leaf_photo(rng, shape=(60, 80), backdrop=(20, 90, 30))
    made = {
        "lab_field": (comp.lab_field(lab, lab_mask, field_photo), lab, lab_mask),
        "paste_control": (comp.paste_control(lab, lab_mask, donor, donor_mask), lab, lab_mask),
        "field_plain": (comp.field_plain(field_leaf, field_mask, donor, donor_mask), field_leaf, field_mask),
    }
    for cell, (image, source, mask) in made.items():
        assert image.shape == source.shape and image.dtype == np.uint8, cell
        assert np.array_equal(image[mask], source[mask]), cell
        assert not np.array_equal(image[~mask], source[~mask]), cell  # the background did change


def test_plain_background_removes_the_donors_leaf():
    rng = np.random.default_rng(1)
    donor, donor_mask = _leaf_photo(rng, backdrop=(180, 190, 200))
    plain = comp.plain_background(donor, donor_mask)
    # the leaf held random colours (errors ~100); Telea fills it with the backdrop to within a few levels
    assert np.abs(plain[donor_mask].astype(int) - [180, 190, 200]).max() <= 5
    assert np.array_equal(plain[0, 0], [180, 190, 200])


def test_background_is_fitted_by_cover_and_centre_crop():
    wide = np.zeros((10, 40, 3), dtype=np.uint8)
    wide[:, 18:22] = 255  # a white band in the middle (scaled ×2: columns 36..43)
    fitted = comp.fit_background(wide, 20, 20)
    assert fitted.shape == (20, 20, 3)
    assert fitted[:, 8:12].min() > 200 and fitted[:, 0].max() < 50


def test_bad_leaf_input_is_refused_clearly():
    rgb = np.zeros((8, 8, 3), dtype=np.uint8)
    with pytest.raises(comp.CompositeError, match="empty"):
        comp.composite(rgb, np.zeros((8, 8), dtype=bool), rgb)
    with pytest.raises(comp.CompositeError, match="does not match"):
        comp.composite(rgb, np.ones((4, 4), dtype=bool), rgb)
    with pytest.raises(comp.CompositeError, match="whole photo"):
        comp.plain_background(rgb, np.ones((8, 8), dtype=bool))


def test_gap_formula():
    share, reason = comp.background_share(0.90, 0.60, 0.30, min_gap=0.01)
    assert share == pytest.approx(0.5) and reason is None
    share, _ = comp.background_share(0.90, 0.95, 0.30, min_gap=0.01)  # background helps: negative share
    assert share == pytest.approx(-1 / 12)
    for field in (0.90, 0.895, 0.95):  # gap ~0 or negative: undefined
        share, reason = comp.background_share(0.90, 0.70, field, min_gap=0.01)
        assert share is None and "gap" in reason
    resampled = comp.background_share_resampled([0.9, 0.9, 0.9], [0.6, 0.8, 0.7], [0.3, 0.9, 0.5], 0.01)
    assert (
        resampled[0] == pytest.approx(0.5) and np.isnan(resampled[1]) and resampled[2] == pytest.approx(0.5)
    )


def test_one_partner_skips_every_disallowed_photo_and_says_when_none_is_left():
    rng = np.random.default_rng(0)
    pool = np.array([0, 0, 1])
    assert comp.pick_partner(0, pool, rng, [0, 7, -1]) == (1, True)
    assert comp.pick_partner(0, pool, rng, [0, 1]) == (2, False)   # no class-0 photo left: any other
    assert comp.pick_partner(0, pool, rng, [0, 1, 2]) is None


def test_partners_come_from_the_same_class_and_never_the_row_itself():
    rng = np.random.default_rng(0)
    pool = np.array([0, 0, 1, 1, 2])
    picks, same = comp.pick_partners(np.array([0, 1, 2, 3]), pool, rng, exclude=np.array([0, -1, 4, -1]))
    assert picks[0] == 1 and pool[picks[1]] == 1
    assert list(same) == [True, True, False, False]  # class 2's only photo is the row itself
    assert picks[2] != 4
