"""Background-swap composites: the same leaf pixels on another background, and the gap formula.

Five cells (the background-swap benchmark):

- ``lab_plain``     lab photos as they are;
- ``lab_field``     the lab leaf's pixels pasted on a field photograph (:func:`lab_field`);
- ``paste_control`` the lab leaf cut and pasted on a plain lab background taken from another lab photo
                    (:func:`paste_control`): the background stays lab-like, only the cut and paste
                    changes, so this cell isolates paste artefacts;
- ``field_field``   the field cohort as it is;
- ``field_plain``   field leaves on a plain lab background (:func:`field_plain`), only where the field
                    cohort has true leaf masks.

Every composite is drawn on the leaf photograph's own pixel grid and keeps the leaf pixels bit for bit
(``composite[mask] == leaf[mask]``); only the pixels outside the mask change.  A "plain lab background"
is a donor lab photo with its own leaf removed by OpenCV inpainting, so what remains is that photo's
backdrop (colour, gradient, grain) without a second leaf.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from PIL import Image

CELLS: tuple[str, ...] = ("lab_plain", "lab_field", "paste_control", "field_field", "field_plain")
COMPOSITE_CELLS: tuple[str, ...] = ("lab_field", "paste_control", "field_plain")
# Which cell each composite cell is paired with (same source rows): the changed-prediction rate.
PAIRED_WITH: dict[str, str] = {
    "lab_field": "lab_plain",
    "paste_control": "lab_plain",
    "field_plain": "field_field",
}


class CompositeError(ValueError):
    """A leaf image, mask and background that cannot be composited (shapes, empty mask)."""


def _check_leaf(rgb: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rgb = np.asarray(rgb)
    mask = np.asarray(mask, dtype=bool)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise CompositeError(f"a leaf image is an (H, W, 3) uint8 array, got {rgb.shape} {rgb.dtype}")
    if mask.shape != rgb.shape[:2]:
        raise CompositeError(f"leaf mask {mask.shape} does not match its image {rgb.shape[:2]}")
    if not mask.any():
        raise CompositeError("the leaf mask is empty: there is no leaf to paste")
    return rgb, mask


def fit_background(background: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale a background to cover height×width (aspect kept, bicubic), then centre-crop to it."""
    background = np.asarray(background, dtype=np.uint8)
    bg_h, bg_w = background.shape[:2]
    scale = max(height / bg_h, width / bg_w)
    new_w, new_h = max(width, round(bg_w * scale)), max(height, round(bg_h * scale))
    resized = np.asarray(Image.fromarray(background).resize((new_w, new_h), Image.Resampling.BICUBIC))
    top, left = (new_h - height) // 2, (new_w - width) // 2
    return resized[top : top + height, left : left + width].copy()


def composite(leaf_rgb: np.ndarray, leaf_mask: np.ndarray, background: np.ndarray) -> np.ndarray:
    """The leaf's pixels where the mask is set, the (fitted) background everywhere else."""
    leaf_rgb, leaf_mask = _check_leaf(leaf_rgb, leaf_mask)
    out = fit_background(background, *leaf_rgb.shape[:2])
    out[leaf_mask] = leaf_rgb[leaf_mask]
    return out


def plain_background(
    donor_rgb: np.ndarray, donor_mask: np.ndarray, dilate_px: int | None = None, radius_px: int = 5
) -> np.ndarray:
    """A lab photo with its leaf removed: the leaf (mask dilated by ``dilate_px``, default a tenth of the
    shorter side, to take its rim and the cast shadow beside it) is filled from the surrounding backdrop
    by OpenCV's Telea inpainting."""
    import cv2

    donor_rgb, donor_mask = _check_leaf(donor_rgb, donor_mask)
    if dilate_px is None:
        dilate_px = max(3, round(0.1 * min(donor_mask.shape)))
    hole = donor_mask.astype(np.uint8) * 255
    if dilate_px > 0:
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * dilate_px + 1, 2 * dilate_px + 1))
        hole = cv2.dilate(hole, kernel)
    if hole.all():
        raise CompositeError("the donor's leaf covers the whole photo: no backdrop to inpaint from")
    return cv2.inpaint(np.ascontiguousarray(donor_rgb), hole, radius_px, cv2.INPAINT_TELEA)


def lab_field(lab_rgb: np.ndarray, lab_mask: np.ndarray, field_rgb: np.ndarray) -> np.ndarray:
    """The lab leaf on a field photograph."""
    return composite(lab_rgb, lab_mask, field_rgb)


def paste_control(
    lab_rgb: np.ndarray, lab_mask: np.ndarray, donor_rgb: np.ndarray, donor_mask: np.ndarray
) -> np.ndarray:
    """The lab leaf cut and pasted on another lab photo's plain background."""
    return composite(lab_rgb, lab_mask, plain_background(donor_rgb, donor_mask))


def field_plain(
    field_rgb: np.ndarray, field_mask: np.ndarray, donor_rgb: np.ndarray, donor_mask: np.ndarray
) -> np.ndarray:
    """A field leaf (its true mask) on a plain lab background."""
    return composite(field_rgb, field_mask, plain_background(donor_rgb, donor_mask))


# --------------------------------------------------------------------------- the gap formula
def background_share(
    lab_plain: float, lab_field: float, field_field: float, min_gap: float
) -> tuple[float | None, str | None]:
    """(lab_plain − lab_field) / (lab_plain − field_field): the share of the lab-to-field gap that the
    background alone explains.  Returns (share, None), or (None, reason) when the gap is under
    ``min_gap`` (no gap to explain: the ratio would divide by ~0 or change sign)."""
    gap = lab_plain - field_field
    if not np.isfinite(gap) or not np.isfinite(lab_field):
        return None, "an accuracy the formula needs is undefined"
    if gap < min_gap:
        return None, (
            f"lab-to-field gap {gap:+.4f} is below field_transfer.min_gap {min_gap}: field accuracy is not "
            "clearly below lab accuracy, so there is no gap to apportion"
        )
    return float((lab_plain - lab_field) / gap), None


def background_share_resampled(
    lab_plain: np.ndarray, lab_field: np.ndarray, field_field: np.ndarray, min_gap: float
) -> np.ndarray:
    """The share on each bootstrap resample (arrays of resampled accuracies); NaN where undefined."""
    lab_plain, lab_field, field_field = (
        np.asarray(v, dtype=np.float64) for v in (lab_plain, lab_field, field_field)
    )
    gap = lab_plain - field_field
    out = np.full(gap.shape, np.nan)
    defined = np.isfinite(gap) & (gap >= min_gap)
    out[defined] = (lab_plain[defined] - lab_field[defined]) / gap[defined]
    return out


def pick_partner(cls: Any, pool_classes: np.ndarray, rng: np.random.Generator,
                 disallowed: Iterable[int] = ()) -> tuple[int, bool] | None:
    """One partner index into the pool and whether it is of class ``cls``: one of that class where the
    pool has one outside ``disallowed``, else any outside it; None when every pool photo is disallowed."""
    allowed = np.ones(len(pool_classes), dtype=bool)
    for k in disallowed:
        if 0 <= k < len(pool_classes):
            allowed[k] = False
    if not allowed.any():
        return None
    candidates = np.flatnonzero(allowed & (pool_classes == cls))
    same = len(candidates) > 0
    return int(rng.choice(candidates if same else np.flatnonzero(allowed))), same


def pick_partners(
    classes: np.ndarray, pool_classes: np.ndarray, rng: np.random.Generator, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For each row, a partner index into the pool: one of the same class where the pool has one (not the
    row itself, ``exclude``), else any.  Returns (indices, same_class flags).

    Why same class: a lab (or field) backdrop may carry class cues of its own; drawing it from the same
    class keeps those cues, so a cell differs from its partner cell only in what the cell changes.
    """
    classes, pool_classes = np.asarray(classes), np.asarray(pool_classes)
    if len(pool_classes) == 0:
        raise CompositeError("no photos to draw backgrounds from")
    picks, same = np.empty(len(classes), dtype=np.int64), np.zeros(len(classes), dtype=bool)
    for i, cls in enumerate(classes):
        got = pick_partner(cls, pool_classes, rng, () if exclude is None else (int(exclude[i]),))
        # a pool of one photo that is the row itself: that photo, as no other exists
        picks[i], same[i] = got if got is not None else (int(rng.choice(len(pool_classes))), False)
    return picks, same


def describe_cells() -> dict[str, Any]:
    """One line per cell, for the chapter JSON and the card."""
    return {
        "lab_plain": "lab photos as they are (each state's recorded test predictions)",
        "lab_field": "the lab leaf's pixels on a field photograph of the same class",
        "paste_control": "the lab leaf cut and pasted on the plain backdrop of another lab photo of the "
        "same class (isolates paste artefacts)",
        "field_field": "the field cohort as it is",
        "field_plain": "field leaves (true masks) on the plain backdrop of a lab photo of the same class",
    }
