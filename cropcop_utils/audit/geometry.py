"""The audit's geometric verifier: do two pictures show the same surface under some camera change?

Local features with geometric verification (OpenCV): ORB keypoints on a small grey square of each image
(:data:`SIDE` px), matched by Hamming distance with Lowe's ratio test, then a RANSAC homography between
the matched positions.  Two estimators: OpenCV's USAC framework (``cv2.USAC_FAST``: LO-RANSAC with a
sequential test that drops a hopeless model after a few points) screens every pair, ~60x faster per fit
than classic ``cv2.RANSAC`` (3-4 ms a fit here, 80 % of the tomato audit's time); a pair it gives at least
:data:`SCREEN_INLIERS` inliers is fitted again by classic RANSAC, whose counts the thresholds were
calibrated on (USAC alone admitted one more look-alike pair on the default synthetic corpus: near-pair
precision 0.977 instead of 0.981).  Unrelated pairs, the vast majority, never reach the slow fit.  A
homography covers what an augmenting tool or a second
shot does to a flat leaf — turns, shear, perspective, scale and crops — and, with a negative
determinant, mirrors; but ORB descriptors of a mirrored patch do not match the patch, so each image
also keeps the ORB keypoints of its mirror image, and the better of plain and mirrored matching counts
(the mirrored pass runs only when the plain one finds fewer than :data:`CLEAR_INLIERS` inliers).

Recorded per pair: matches, RANSAC inliers, the inlier ratio (inliers / matches), whether the mirrored
match won, and the SSIM of a with b warped into a's frame by the fitted homography (:func:`align`; the
same subject-weighted SSIM as :mod:`.verifier`).  Unrelated leaves give chance matches that no single
homography explains, and where repetitive texture or a shared backdrop lets one explain them anyway,
the aligned pictures still disagree; the same leaf gives dozens of inliers and an aligned SSIM near that
of a re-encoded copy.  Thresholds are profile settings calibrated on the synthetic truth
(``audit.geometry_min_inliers``, ``audit.geometry_min_ratio``, ``audit.geometry_min_ssim``).

Why hand-written glue rather than a library call: OpenCV supplies every step (ORB, ``BFMatcher``,
``findHomography``); only their chaining over a batch of pairs, with the mirrored pass, is ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .pools import clean_pool

SIDE = 128            # ORB runs on this grey square: leaf structure survives, noise and cost stay low
FEATURES = 150        # keypoints kept per image (strongest FAST corners over the pyramid)
PATCH = 15            # ORB patch (and border) in px: small, so keypoints reach near the edges at 128 px
RANSAC_PX = 3.0       # reprojection error (px at SIDE) that still counts as an inlier
RANSAC_ITERATIONS = 150  # enough for a true match (>= half inliers: ~70 draws for 99 %)
SCREEN = "USAC_FAST"   # cv2 estimator that screens every pair
CONFIRM = "RANSAC"     # cv2 estimator whose inliers are recorded where the screen finds enough of them
SCREEN_INLIERS = 10    # = MIN_MATCHES, the least audit.geometry_min_inliers / support_inliers may be
LOWE_RATIO = 0.8      # a match counts when clearly nearer than the second-best descriptor
MIN_MATCHES = 10      # fewer ratio-test matches than this: no homography is fitted (inliers 0); unrelated
                      # tomato leaves give 5-25 matches of which at most ~9 fit one homography
CLEAR_INLIERS = 30    # a plain match this strong makes the mirrored pass pointless


@dataclass
class Keypoints:
    """ORB keypoints of one image, plain and of its left-right mirror (positions in the mirror frame)."""

    xy: np.ndarray            # (K, 2) float32
    descriptors: np.ndarray   # (K, 32) uint8
    mirror_xy: np.ndarray
    mirror_descriptors: np.ndarray


@dataclass
class GeometryScores:
    """Geometric verification of a batch of pairs (arrays of equal length)."""

    matches: np.ndarray    # int32: ratio-test matches of the winning (plain or mirrored) pass
    inliers: np.ndarray    # int32: RANSAC homography inliers
    ratio: np.ndarray      # float32: inliers / matches (0 when nothing matched)
    mirrored: np.ndarray   # bool: the mirrored pass won
    homography: np.ndarray  # (M, 3, 3) float32: a's SIDE-px frame -> b's (mirrored b's when mirrored)
    done: np.ndarray | None = None  # bool: the pair was matched (callers that skip pairs set it)

    def __post_init__(self) -> None:
        if self.done is None:
            self.done = np.ones(len(self.inliers), dtype=bool)


def _orb():
    import cv2

    return cv2.ORB_create(nfeatures=FEATURES, scaleFactor=1.2, nlevels=4, edgeThreshold=PATCH,
                          patchSize=PATCH, fastThreshold=10)


def _detect(grey: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    found, descriptors = _orb().detectAndCompute(grey, None)
    if descriptors is None or not found:
        return np.zeros((0, 2), np.float32), np.zeros((0, 32), np.uint8)
    return np.array([k.pt for k in found], dtype=np.float32), descriptors


def keypoints(rgb: Image.Image) -> Keypoints:
    """ORB keypoints of an upright RGB picture, squashed to SIDE×SIDE grey (as the SSIM thumbnails are),
    and of its mirror image."""
    grey = np.asarray(rgb.convert("L").resize((SIDE, SIDE), Image.Resampling.BILINEAR))
    xy, descriptors = _detect(grey)
    mirror_xy, mirror_descriptors = _detect(np.ascontiguousarray(grey[:, ::-1]))
    return Keypoints(xy, descriptors, mirror_xy, mirror_descriptors)


_NO_FIT = np.full((3, 3), np.nan, np.float32)


def _homography(src: np.ndarray, dst: np.ndarray, method: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    import cv2

    # Fixed seed: the samplers draw from OpenCV's global RNG; the same pair must score the same.
    cv2.setRNGSeed(0)
    return cv2.findHomography(src, dst, getattr(cv2, method), RANSAC_PX, maxIters=RANSAC_ITERATIONS,
                              confidence=0.99)


def _fit(xy_a: np.ndarray, d_a: np.ndarray, xy_b: np.ndarray, d_b: np.ndarray) -> tuple[int, int, np.ndarray]:
    """(ratio-test matches, RANSAC homography inliers, homography) between two keypoint sets."""
    import cv2

    if len(d_a) < MIN_MATCHES or len(d_b) < MIN_MATCHES:
        return 0, 0, _NO_FIT
    nearest = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(d_a, d_b, k=2)
    matches = [m[0] for m in nearest if len(m) == 2 and m[0].distance < LOWE_RATIO * m[1].distance]
    if len(matches) < MIN_MATCHES:
        return len(matches), 0, _NO_FIT
    src = xy_a[[m.queryIdx for m in matches]]
    dst = xy_b[[m.trainIdx for m in matches]]
    homography, mask = _homography(src, dst, SCREEN)
    if homography is not None and mask is not None and int(mask.sum()) >= SCREEN_INLIERS:
        homography, mask = _homography(src, dst, CONFIRM)
    if homography is None or mask is None:
        return len(matches), 0, _NO_FIT
    return len(matches), int(mask.sum()), homography.astype(np.float32)


def match_pair(a: Keypoints, b: Keypoints) -> tuple[int, int, float, bool, np.ndarray]:
    """(matches, inliers, inlier ratio, mirrored, homography) of the better of plain and mirrored
    matching."""
    plain = _fit(a.xy, a.descriptors, b.xy, b.descriptors)
    if plain[1] >= CLEAR_INLIERS:
        return plain[0], plain[1], plain[1] / plain[0], False, plain[2]
    mirror = _fit(a.xy, a.descriptors, b.mirror_xy, b.mirror_descriptors)
    mirrored = mirror[1] > plain[1]
    matches, inliers, homography = mirror if mirrored else plain
    return matches, inliers, (inliers / matches if matches else 0.0), bool(mirrored), homography


def align(grey_b: np.ndarray, homography: np.ndarray, mirrored: bool) -> tuple[np.ndarray, np.ndarray]:
    """b's thumbnail (any square side) warped into a's frame by a SIDE-px homography, and the mask of
    output pixels that came from inside b (zeros elsewhere)."""
    import cv2

    side = grey_b.shape[0]
    image = np.ascontiguousarray(grey_b[:, ::-1] if mirrored else grey_b).astype(np.float32)
    scale = np.diag([side / SIDE, side / SIDE, 1.0])
    # Pixel centres: SIDE-px coordinates (x + 0.5) map to thumbnail (x + 0.5) * side / SIDE.
    shift = np.array([[1, 0, -0.5], [0, 1, -0.5], [0, 0, 1]])
    unshift = np.array([[1, 0, 0.5], [0, 1, 0.5], [0, 0, 1]])
    small = shift @ scale @ unshift @ homography.astype(np.float64) @ shift @ np.linalg.inv(scale) @ unshift
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    warped = cv2.warpPerspective(image, small, (side, side), flags=flags, borderValue=0)
    inside = cv2.warpPerspective(np.ones_like(image), small, (side, side), flags=flags, borderValue=0)
    return warped, inside


def _score_task(pairs: list[tuple[Keypoints, Keypoints]]) -> list[tuple[int, int, float, bool, np.ndarray]]:
    import cv2

    cv2.setNumThreads(1)
    return [match_pair(a, b) for a, b in pairs]


def verify_pairs(points: list[Keypoints], pairs: np.ndarray, workers: int = 1,
                 task: int = 2000) -> GeometryScores:
    """Geometric verification of every pair (rows of ``pairs``: indices into ``points``), in pair order;
    ``workers > 1`` spreads tasks of ``task`` pairs over a process pool."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    jobs = [[(points[i], points[j]) for i, j in pairs[k:k + task]] for k in range(0, len(pairs), task)]
    if workers > 1 and len(jobs) > 1:
        with clean_pool(workers) as pool:
            parts = list(pool.map(_score_task, jobs))
    else:
        parts = [_score_task(job) for job in jobs]
    rows = [row for part in parts for row in part]
    if not rows:
        return empty_scores(0)
    matches, inliers, ratio, mirrored, homography = zip(*rows, strict=True)
    return GeometryScores(np.array(matches, np.int32), np.array(inliers, np.int32),
                          np.array(ratio, np.float32), np.array(mirrored, bool), np.stack(homography))


def empty_scores(m: int) -> GeometryScores:
    """Scores of ``m`` pairs that were not matched (no matches, no homography)."""
    return GeometryScores(np.zeros(m, np.int32), np.zeros(m, np.int32), np.zeros(m, np.float32),
                          np.zeros(m, bool), np.full((m, 3, 3), np.nan, np.float32), np.zeros(m, bool))
