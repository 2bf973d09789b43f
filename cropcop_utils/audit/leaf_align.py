"""The audit's third verifier: the two leaves laid on each other by their silhouettes, then compared.

A copy turned by an arbitrary angle, a large crop and a leaf re-shot after being turned on the card
defeat the other two verifiers on small, smooth leaves: the SSIM verifier only searches turns of a few
degrees, and ORB finds too few corners on a plain leaf at the audit's resolution for a homography (the
turned synthetic copy it missed had 8 inliers).  The leaf itself, cut out, fixes the similarity
transform between the two pictures without any search:

1. :func:`leaf_thumbnail` — each image becomes a ``SIDE``×``SIDE`` grey thumbnail (squashed, as the SSIM
   verifier's) and a leaf weight: the classical leaf mask of chapter 10 (:func:`..field.masks.leaf_mask`,
   plant-colour score + Otsu, without GrabCut: ~2.5 ms an image here against ~20 ms with it), blurred
   to soft edges, with a floor so the backdrop still counts a little.
2. :func:`align_pairs` — the mask's centroid, principal axis and area give where b's leaf sits, which
   way it points and how large it is; b is warped so its leaf lands on a's (translation, rotation and
   scale from the moments), both ways round the axis (a leaf's axis has two ends), and the leaf-weighted
   SSIM of the :mod:`.verifier` scores the better of the two.  Mirrors are left to the dihedral source and
   the geometric verifier's mirrored pass.

Silhouettes alone do not separate two leaves of one variety (same outline, other lesions: on the
default synthetic corpus their mask IoU after alignment is as high as a copy's); the SSIM of the aligned
interiors does, at a threshold calibrated on the synthetic truth (``audit.leaf_min_ssim``;
``audit/leaf_calibration.parquet``).  Hand-written: image moments and ``torch``'s ``affine_grid``
are library calls, but no library aligns two masks by their moments and scores the result.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from . import verifier
from .pools import clean_pool

SIDE = 64             # thumbnail side: lesions and veins survive, a batch of pairs stays cheap
MASK_BLUR = 1.0       # px of Gaussian blur on the mask edge (a hard edge makes SSIM windows jump)
WEIGHT_FLOOR = verifier.SUBJECT_FLOOR  # the backdrop's weight, as the SSIM verifier's
HU_SCREEN = 0.35      # L1 distance of the log Hu moments beyond which a pair is not scored: it keeps
                      # 801 of the 802 PlantVillage tomato candidates (and every synthetic one) whose leaf
                      # SSIM reaches 0.80 while sparing 60 % of the tomato candidates' warps
MIN_LEAF_SHARE = 0.01  # a mask smaller than this share of the thumbnail is no leaf: the pair is not scored
BATCH = 1024


def leaf_thumbnail(rgb: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """(grey, weight), both ``uint8`` ``SIDE``×``SIDE``: the squashed grey picture and its leaf weight
    (255 on the leaf, the floor on the backdrop; all floor when no leaf is found)."""
    import cv2

    from ..core.masks import leaf_mask

    small = rgb.convert("RGB").resize((SIDE, SIDE), Image.Resampling.BILINEAR)
    colour = np.asarray(small, dtype=np.uint8)
    mask = leaf_mask(colour, grabcut=False).astype(np.float32)
    mask = cv2.GaussianBlur(mask, (0, 0), MASK_BLUR)
    weight = np.maximum(mask, WEIGHT_FLOOR)
    return np.asarray(small.convert("L"), dtype=np.uint8), np.round(weight * 255).astype(np.uint8)


def _raw_moments(weight: np.ndarray) -> np.ndarray:
    """(N, 6) float64: moments 1, x, y, x², xy, y² of each leaf weight above its floor, by one matrix
    product over the batch (a Python loop of ``cv2.moments`` costs ~0.15 ms an image)."""
    w = np.asarray(weight, dtype=np.float32).reshape(len(weight), -1) / 255.0
    m = np.clip((w - WEIGHT_FLOOR) / (1.0 - WEIGHT_FLOOR), 0.0, 1.0)
    side = np.asarray(weight).shape[-1]
    ys, xs = np.mgrid[0:side, 0:side].reshape(2, -1).astype(np.float64)
    basis = np.stack([np.ones_like(xs), xs, ys, xs * xs, xs * ys, ys * ys], axis=1)
    return m.astype(np.float64) @ basis


def _central(raw: np.ndarray) -> tuple[np.ndarray, ...]:
    """Area, centroid and second central moments (per unit area) from :func:`_raw_moments`."""
    area = raw[:, 0]
    safe = np.maximum(area, 1e-9)
    cx, cy = raw[:, 1] / safe, raw[:, 2] / safe
    return area, cx, cy, raw[:, 3] / safe - cx * cx, raw[:, 4] / safe - cx * cy, raw[:, 5] / safe - cy * cy


def _moments_and_signature(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`leaf_moments` and :func:`silhouette_signature` from one pass over the weights."""
    area, cx, cy, mxx, mxy, myy = _central(_raw_moments(weight))
    angle = 0.5 * np.arctan2(2 * mxy, mxx - myy)
    pixels = np.asarray(weight).shape[-1] * np.asarray(weight).shape[-2]
    leaf_area = np.where(area >= MIN_LEAF_SHARE * pixels, area, 0.0)
    scale = np.maximum(area, 1e-9)  # eta_pq = mu_pq / mu00^2 for second order; mu here is per unit area
    e20, e11, e02 = mxx / scale, mxy / scale, myy / scale
    hu = np.stack([e20 + e02, (e20 - e02) ** 2 + 4 * e11 ** 2], axis=1)
    return np.stack([cx, cy, angle, leaf_area], axis=1), -np.sign(hu) * np.log10(np.abs(hu) + 1e-30)


def leaf_moments(weight: np.ndarray) -> np.ndarray:
    """(N, 4) float64 per thumbnail: centroid x, y (px), principal-axis angle (radians) and leaf area
    (px) of the weight above its floor; area 0 where there is no leaf."""
    return _moments_and_signature(weight)[0]


def silhouette_signature(weight: np.ndarray) -> np.ndarray:
    """(N, 2) float64: the first two Hu moments of each leaf weight above its floor, on a log scale (as
    ``cv2.HuMoments`` defines them): unchanged by the turn, shift and zoom the alignment undoes."""
    return _moments_and_signature(weight)[1]


def _sampling_grid(moment_a: np.ndarray, moment_b: np.ndarray, turn: float, side: int):
    """``affine_grid`` matrices sending each output pixel of a's frame to where b shows that point:
    x_b = c_b + R(-phi) (x_a - c_a) / s, phi the turn from b's axis to a's, s the scale."""
    import torch

    phi = moment_a[:, 2] - moment_b[:, 2] + turn
    scale = np.sqrt(moment_a[:, 3] / moment_b[:, 3])
    cos, sin = np.cos(-phi) / scale, np.sin(-phi) / scale
    rot = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)  # (n, 2, 2), pixels
    shift = moment_b[:, :2] - (rot @ moment_a[:, :2, None])[:, :, 0]
    # pixel p = (u + 1) * side / 2 - 0.5 (align_corners=False): rewrite in normalised coordinates
    k = side / 2.0
    shift_n = ((rot @ np.full((len(rot), 2, 1), k - 0.5))[:, :, 0] + shift + 0.5) / k - 1.0
    return torch.from_numpy(np.concatenate([rot, shift_n[:, :, None]], axis=-1).astype(np.float32))


def _score_batch(grey_a: np.ndarray, weight_a: np.ndarray, grey_b: np.ndarray, weight_b: np.ndarray,
                 moment_a: np.ndarray, moment_b: np.ndarray) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    n, side = len(grey_a), grey_a.shape[1]
    # grey, weight and a plane of ones (where b has pixels) ride one warp
    b = torch.from_numpy(np.stack([grey_b, weight_b, np.ones_like(grey_b)], axis=1).astype(np.float32))
    best = np.full(n, -1.0, dtype=np.float32)
    for turn in (0.0, np.pi):
        grid = F.affine_grid(_sampling_grid(moment_a, moment_b, turn, side), (n, 3, side, side),
                             align_corners=False)
        warped = F.grid_sample(b, grid, mode="bilinear", padding_mode="zeros", align_corners=False).numpy()
        score = verifier.weighted_ssim(grey_a, warped[:, 0], weight_a, warped[:, 1], warped[:, 2])
        best = np.maximum(best, score)
    return best


def _score_task(grey_a, weight_a, grey_b, weight_b, moment_a, moment_b) -> np.ndarray:
    import torch

    torch.set_num_threads(1)
    return np.concatenate([
        _score_batch(grey_a[k:k + BATCH], weight_a[k:k + BATCH], grey_b[k:k + BATCH], weight_b[k:k + BATCH],
                     moment_a[k:k + BATCH], moment_b[k:k + BATCH])
        for k in range(0, len(grey_a), BATCH)]) if len(grey_a) else np.zeros(0, np.float32)


def align_pairs(grey: np.ndarray, weight: np.ndarray, pairs: np.ndarray, workers: int = 1) -> np.ndarray:
    """Leaf-aligned SSIM of each pair (rows of ``pairs`` index ``grey`` / ``weight``, (N, SIDE, SIDE)
    uint8 from :func:`leaf_thumbnail`); NaN where either picture has no leaf or the outlines differ by
    more than :data:`HU_SCREEN`."""
    grey, weight = np.asarray(grey), np.asarray(weight)
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if grey.ndim != 3 or grey.shape != weight.shape:
        raise verifier.VerifierInputError(f"leaf thumbnails must be (N, side, side) with matching weights; "
                                          f"got {grey.shape} and {weight.shape}")
    out = np.full(len(pairs), np.nan, dtype=np.float32)
    if not len(pairs):
        return out
    if pairs.min() < 0 or pairs.max() >= len(grey):
        raise verifier.VerifierInputError(f"pair indices must lie in 0..{len(grey) - 1}")
    moments, signature = _moments_and_signature(weight)
    alike = np.abs(signature[pairs[:, 0]] - signature[pairs[:, 1]]).sum(axis=1) <= HU_SCREEN
    rows = np.flatnonzero((moments[pairs[:, 0], 3] > 0) & (moments[pairs[:, 1], 3] > 0) & alike)
    i, j = pairs[rows, 0], pairs[rows, 1]
    spans = [(k, min(len(rows), k + 4 * BATCH)) for k in range(0, len(rows), 4 * BATCH)]

    def arguments(a: int, b: int) -> tuple[np.ndarray, ...]:
        return (grey[i[a:b]], weight[i[a:b]], grey[j[a:b]], weight[j[a:b]], moments[i[a:b]], moments[j[a:b]])

    if workers <= 1 or len(spans) <= 1:
        import torch

        threads = torch.get_num_threads()
        try:
            scores = [_score_task(*arguments(a, b)) for a, b in spans]
        finally:
            torch.set_num_threads(threads)
    else:
        with clean_pool(workers) as pool:
            scores = list(pool.map(_score_task, *zip(*(arguments(a, b) for a, b in spans), strict=True)))
    if rows.size:
        out[rows] = np.concatenate(scores)
    return out
