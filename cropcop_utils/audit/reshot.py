"""The audit's fourth verifier: the same leaf photographed again, moved, turned and lit differently.

PlantVillage photographed many leaves more than once: the leaf is picked up, put back a little moved or
turned, and the light changes.  The other verifiers miss most of these shots.  The SSIM verifiers
compare pixels, which lighting and a turn change.  ORB on a 128 px thumbnail finds 17-32 RANSAC inliers
at an inlier ratio of 0.6 on such pairs: the card's texture adds matches that are not the leaf, and a
homography has more freedom to fit chance matches than a leaf lying flat needs.  This verifier looks
where a person looks, at the leaf's own marks, and asks whether one rigid move explains them:

1. :func:`leaf_keypoints` — SIFT keypoints (OpenCV; RootSIFT descriptors, Arandjelović & Zisserman 2012)
   on a ``SIDE`` px grey square of the picture (PlantVillage's native size; smaller pictures are enlarged
   so their marks reach SIFT's finer scales), kept only inside the leaf mask of chapter 10
   (:func:`..core.masks.leaf_mask`, without GrabCut) widened by ``MASK_GROW`` so the outline's teeth count.
2. :func:`match_pair` — ratio-test matches, then a *similarity* (rotation, uniform scale, shift:
   ``cv2.estimateAffinePartial2D`` with RANSAC) rather than a homography: a flat leaf re-shot from the
   same stand changes by little more, and a model with four degrees of freedom fits far fewer chance
   matches than one with eight.  Recorded: matches, inliers, the scale and the turn of the fit.
3. :func:`accepted` — a re-shot's scale (``SCALE_RANGE``) and a turn of at most ``audit.reshot_max_angle``
   degrees, and either many inliers (``audit.reshot_min_inliers``) or fewer that are most of the matches
   (``audit.reshot_support_inliers`` at an inlier share of ``audit.reshot_min_share``).  Why the share:
   the synthetic corpus draws the healthy leaves of a class from one template (outline, teeth, veins),
   and two such leaves give 15-23 inliers on the shared structure — but only half their matches agree,
   while a leaf and its re-shot agree on 0.8 of theirs (the individual marks match too).  Why the turn:
   on PlantVillage tomato the chance fits between two different leaves came at turns of 50-180 degrees,
   while re-shots turn by a few.  Calibrated on the synthetic truth over four generator seeds
   (``bench/audit_seeds.py``) and checked by eye on PlantVillage tomato (``bench/reshot_labels.csv``).

Which pairs it scores: proposed pairs the other three verifiers left open that already show some
evidence — ``audit.reshot_screen_inliers`` ORB inliers or a leaf-aligned SSIM of ``audit.reshot_screen_leaf``
(on PlantVillage tomato 3,610 of 93,774 open pairs; 69 of the 71 synthetic re-shots it recovers pass
the screen).  SIFT costs ~20 ms a picture, too much for every picture of a large corpus.

Hand-written glue, as :mod:`.geometry`: OpenCV supplies SIFT, the matcher and the robust fit; only the
mask and the chaining over a batch of pairs are ours.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .pools import clean_pool

SIDE = 256             # PlantVillage's native size: the marks a person recognises a leaf by survive
FEATURES = 400         # SIFT keypoints kept per picture (strongest first)
CONTRAST = 0.01        # SIFT's contrast threshold (OpenCV default 0.04): faint lesions and veins count
MASK_GROW = 0.06       # the leaf mask widened by this share of the side: keypoints on the outline count
MIN_LEAF_SHARE = 0.01  # a mask smaller than this share of the picture is no leaf: keypoints everywhere
LOWE_RATIO = 0.8       # a match counts when clearly nearer than the second-best descriptor
RANSAC_SIDES = 0.015   # reprojection error that still counts as an inlier, as a share of the side
RANSAC_ITERATIONS = 2000
SCALE_RANGE = (0.8, 1.25)  # a re-shot from the same stand: the leaf's size changes by a few percent
CLEAR_INLIERS = 40     # a plain fit this strong makes the mirrored pass pointless


@dataclass
class LeafKeypoints:
    """SIFT keypoints on one picture's leaf: positions in [0, 1] (x, y) and raw SIFT descriptors (uint8)."""

    xy: np.ndarray
    descriptors: np.ndarray


@dataclass
class ReshotScores:
    """The verifier's record of a batch of pairs (arrays of equal length; 0 / NaN where not scored)."""

    matches: np.ndarray   # int32 ratio-test matches
    inliers: np.ndarray   # int32 RANSAC similarity inliers
    scale: np.ndarray     # float32 scale of the fit (b's leaf size / a's)
    angle: np.ndarray     # float32 turn of the fit in degrees, in (-180, 180]
    mirrored: np.ndarray  # bool: the fit carries a onto b's mirror image
    done: np.ndarray      # bool: the pair was scored

    @classmethod
    def empty(cls, m: int) -> ReshotScores:
        return cls(np.zeros(m, np.int32), np.zeros(m, np.int32), np.full(m, np.nan, np.float32),
                   np.full(m, np.nan, np.float32), np.zeros(m, bool), np.zeros(m, bool))

    @property
    def share(self) -> np.ndarray:
        """Inliers over matches (0 where nothing matched)."""
        return self.inliers / np.maximum(self.matches, 1)


def leaf_keypoints(rgb: Image.Image) -> LeafKeypoints:
    """SIFT keypoints inside the (widened) leaf mask of an upright RGB picture (see module docstring)."""
    import cv2

    from ..core.masks import leaf_mask

    resample = Image.Resampling.BICUBIC if min(rgb.size) < SIDE else Image.Resampling.BILINEAR
    square = rgb.convert("RGB").resize((SIDE, SIDE), resample)
    leaf = leaf_mask(np.asarray(square), grabcut=False)
    if leaf.mean() < MIN_LEAF_SHARE:
        leaf = np.ones_like(leaf)
    grow = max(1, round(MASK_GROW * SIDE))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * grow + 1, 2 * grow + 1))
    search = cv2.dilate(leaf.astype(np.uint8), kernel)
    found, descriptors = cv2.SIFT_create(nfeatures=FEATURES, contrastThreshold=CONTRAST).detectAndCompute(
        np.asarray(square.convert("L")), search)
    if descriptors is None or not found:
        return LeafKeypoints(np.zeros((0, 2), np.float32), np.zeros((0, 128), np.uint8))
    xy = np.array([k.pt for k in found], dtype=np.float32) / SIDE
    return LeafKeypoints(xy, np.clip(np.round(descriptors), 0, 255).astype(np.uint8))


def _root_sift(descriptors: np.ndarray) -> np.ndarray:
    """RootSIFT: L1-normalised, square-rooted (Euclidean distance then compares like the Hellinger kernel)."""
    d = descriptors.astype(np.float32)
    return np.sqrt(d / (d.sum(axis=1, keepdims=True) + 1e-7))


def mirrored(points: LeafKeypoints) -> LeafKeypoints:
    """The keypoints of the picture's left-right mirror image, without detecting them again.

    Mirroring a patch mirrors its canonical frame: OpenCV's 4x4x8 SIFT histogram (rows along the
    keypoint's y axis, columns along x, eight orientation bins) then reads with its rows reversed and
    its orientation bins negated (bin o -> (8 - o) mod 8); positions go to x -> 1 - x.  Checked against
    SIFT run on a mirrored PlantVillage picture: 359 of its 388 keypoints match this way, all inliers."""
    d = points.descriptors.reshape(-1, 4, 4, 8)[:, ::-1, :, :][..., (8 - np.arange(8)) % 8]
    xy = np.column_stack([1.0 - points.xy[:, 0], points.xy[:, 1]]).astype(np.float32)
    return LeafKeypoints(xy, np.ascontiguousarray(d).reshape(-1, 128))


def match_pair(a: LeafKeypoints, b: LeafKeypoints) -> tuple[int, int, float, float, bool]:
    """(matches, inliers, scale, angle in degrees, mirrored) of the best similarity carrying a's leaf onto
    b's, or onto b's mirror image where that explains more matches (a flipped copy, or a leaf photographed
    from its other side)."""
    plain = _fit(a, b)
    if plain[1] >= CLEAR_INLIERS:
        return (*plain, False)
    mirror = _fit(a, mirrored(b))
    return (*mirror, True) if mirror[1] > plain[1] else (*plain, False)


def _fit(a: LeafKeypoints, b: LeafKeypoints) -> tuple[int, int, float, float]:
    """(matches, inliers, scale, angle in degrees) of the best similarity carrying a's leaf onto b's."""
    import cv2

    if len(a.descriptors) < 3 or len(b.descriptors) < 3:
        return 0, 0, np.nan, np.nan
    nearest = cv2.BFMatcher(cv2.NORM_L2).knnMatch(_root_sift(a.descriptors), _root_sift(b.descriptors), k=2)
    matches = [m[0] for m in nearest if len(m) == 2 and m[0].distance < LOWE_RATIO * m[1].distance]
    if len(matches) < 3:
        return len(matches), 0, np.nan, np.nan
    src = a.xy[[m.queryIdx for m in matches]]
    dst = b.xy[[m.trainIdx for m in matches]]
    cv2.setRNGSeed(0)  # RANSAC draws from OpenCV's global RNG: the same pair must score the same
    fit, inlying = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC,
                                               ransacReprojThreshold=RANSAC_SIDES,
                                               maxIters=RANSAC_ITERATIONS, confidence=0.995)
    if fit is None or inlying is None:
        return len(matches), 0, np.nan, np.nan
    scale = float(np.sqrt(abs(np.linalg.det(fit[:, :2]))))
    return len(matches), int(inlying.sum()), scale, float(np.degrees(np.arctan2(fit[1, 0], fit[0, 0])))


def accepted(scores: ReshotScores, min_inliers: int, support_inliers: int, min_share: float,
             max_angle: float) -> np.ndarray:
    """The verifier's decision per pair (see module docstring, step 3)."""
    with np.errstate(invalid="ignore"):
        plausible = (scores.done & (scores.scale >= SCALE_RANGE[0]) & (scores.scale <= SCALE_RANGE[1])
                     & (np.abs(scores.angle) <= max_angle))
    return plausible & ((scores.inliers >= min_inliers)
                        | ((scores.inliers >= support_inliers) & (scores.share >= min_share)))


# --------------------------------------------------------------------------- a batch of pairs
def _load(path: str) -> LeafKeypoints:
    from ..core import imaging

    with open(path, "rb") as handle:
        rgb = imaging.to_rgb(imaging.open_decoded(handle.read(), None, path=path))
    return leaf_keypoints(rgb)


def _keypoint_task(paths: list[str]) -> list[LeafKeypoints]:
    import cv2

    cv2.setNumThreads(1)
    return [_load(p) for p in paths]


def _match_task(jobs: list[tuple[LeafKeypoints, LeafKeypoints]]) -> list[tuple[int, int, float, float, bool]]:
    import cv2

    cv2.setNumThreads(1)
    return [match_pair(a, b) for a, b in jobs]


def verify_pairs(paths: Callable[[int], str] | Sequence[str], pairs: np.ndarray, workers: int = 1,
                 task: int = 200) -> ReshotScores:
    """Score every pair (rows of ``pairs``: positions of the pictures ``paths`` names), in pair order.

    Each picture's keypoints are computed once, however many pairs it is in; ``workers > 1`` spreads
    pictures, then pairs, over a process pool.  Pictures are decoded by the loading contract (EXIF
    orientation applied), as every other fingerprint of the audit."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    out = ReshotScores.empty(len(pairs))
    if not len(pairs):
        return out
    name = paths if callable(paths) else (lambda k: os.fspath(paths[k]))
    needed = np.unique(pairs)
    chunks = [[name(int(k)) for k in needed[s:s + task]] for s in range(0, len(needed), task)]
    local = np.searchsorted(needed, pairs)
    parts = np.array_split(local, max(1, len(pairs) // (task * 5)))

    def jobs(points: list[LeafKeypoints]) -> list[list[tuple[LeafKeypoints, LeafKeypoints]]]:
        return [[(points[i], points[j]) for i, j in part] for part in parts]

    if workers > 1 and len(chunks) > 1:
        with clean_pool(workers) as pool:
            points = [p for part in pool.map(_keypoint_task, chunks) for p in part]
            rows = [r for part in pool.map(_match_task, jobs(points)) for r in part]
    else:
        points = [p for chunk in chunks for p in _keypoint_task(chunk)]
        rows = [r for job in jobs(points) for r in _match_task(job)]
    matches, inliers, scale, angle, flipped = (np.array(col) for col in zip(*rows, strict=True))
    return ReshotScores(matches.astype(np.int32), inliers.astype(np.int32), scale.astype(np.float32),
                        angle.astype(np.float32), flipped.astype(bool), np.ones(len(pairs), bool))
