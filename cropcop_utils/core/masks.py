"""Leaf masks for lab photographs by a classical method, and the measures that check them.

:func:`leaf_mask` — why these steps:

1. **Plant colour score.**  Lab backdrops (PlantVillage's grey-purple card, a bench, a scanner lid) are
   nearly colourless, and so are the leaf's shadow and a camera's frame; a leaf is green, yellow or
   brown.  The score is the pixel's chroma (max − min of R, G, B: unlike HSV saturation it stays low in
   dark noise) where its hue lies between orange-brown and green-cyan, and a fraction of it elsewhere
   (a purple or blue card is coloured but not plant-coloured).
2. **Otsu threshold** of the smoothed score (with a floor, so a colourless photo is not split in two by
   noise).  Coloured camera frames are removed first (bands along an edge, rings round the picture);
   the largest connected region is kept, holes filled: dark or pale lesions enclosed by leaf tissue
   stay in the leaf.  When that region is ragged (solidity under 0.8: the split took in grass or
   soil too), the top class of a three-class Otsu split is tried and the more solid region kept.
3. **GrabCut** (OpenCV) seeded from that region — certain leaf inside an eroded core, "probably leaf"
   in its convex hull (leaves are nearly convex: a lesion or a shaded half biting into the outline is
   probably leaf), certain background far outside — learns the photo's own leaf and background
   colours and moves the boundary onto the real edge.  The largest region is kept, holes filled.

Photos larger than 128 px are masked at 128 px and the mask scaled back (GrabCut's cost grows with
pixels, the outline does not need them).  Measured (tests/test_masks.py): IoU with the synthetic true
masks >= 0.90 on uniform lab backdrops; grass behind the leaf (the synthetic ``field_phone`` source)
is the weak case, and a very dark leaf on a bluish card can lose its shaded half.

Masks are boolean arrays of the photo's height and width; on disk, 8-bit PNGs with the leaf white.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
from PIL import Image
from scipy import ndimage
from skimage.filters import threshold_multiotsu
from skimage.morphology import convex_hull_image

# OpenCV hue runs 0..179 (degrees / 2): 8..95 is orange-brown through yellow and green to cyan-green
# (shaded PlantVillage leaves photograph bluish).
PLANT_HUE = (8, 95)
OFF_HUE_WEIGHT = 0.35      # coloured but not plant-coloured (purple or blue card) counts this much
MIN_THRESHOLD = 8.0        # chroma grey levels: below this nothing is called leaf, whatever Otsu says
MIN_SOLIDITY = 0.8         # a two-class seed less solid than this is retried with three classes
FRAME_FILL = 0.95          # an edge row (column) this full of plant colour is a frame, not leaf ...
FRAME_DEPTH = 0.12         # ... up to this share of the side in from the edge
GRABCUT_SEED = 0
GRABCUT_ITERATIONS = 4
WORK_PX = 128              # larger photos are masked at this size and the mask scaled back
CORE_ERODE = 0.06          # certain-leaf core: the region eroded by this share of the image side
BACKGROUND_MARGIN = 0.12   # certain background: farther than this share of the side from the region


def plant_score(rgb: np.ndarray) -> np.ndarray:
    """Chroma weighted by hue (float32, 0..255): high on leaf tissue, low on colourless backdrops."""
    rgb = _as_rgb(rgb)
    chroma = (rgb.max(axis=2).astype(np.float32) - rgb.min(axis=2).astype(np.float32))
    hue = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[..., 0]
    weight = np.where((hue >= PLANT_HUE[0]) & (hue <= PLANT_HUE[1]), 1.0, OFF_HUE_WEIGHT)
    return chroma * weight.astype(np.float32)


def leaf_mask(rgb: np.ndarray, grabcut: bool = True) -> np.ndarray:
    """The leaf of a lab photograph (H×W×3 uint8 RGB) as a boolean H×W mask; all False if none is found."""
    rgb = _as_rgb(rgb)
    height, width = rgb.shape[:2]
    if max(height, width) > WORK_PX:  # GrabCut's cost grows with pixels; the outline does not need them
        factor = WORK_PX / max(height, width)
        small = cv2.resize(rgb, (max(1, round(width * factor)), max(1, round(height * factor))),
                           interpolation=cv2.INTER_AREA)
        found = leaf_mask(small, grabcut).astype(np.float32)
        return cv2.resize(found, (width, height), interpolation=cv2.INTER_LINEAR) >= 0.5
    side = min(height, width)
    score = cv2.GaussianBlur(plant_score(rgb), (0, 0), max(0.6, side / 160))
    seed = _seed(score)
    if not seed.any() or not grabcut:
        return seed
    return _grabcut(rgb, seed, side)


def _seed(score: np.ndarray) -> np.ndarray:
    """The leaf as the score sees it: Otsu's bright class, or the top of three classes when a
    two-way split also takes in a coloured backdrop (grass, soil) and so comes out ragged."""
    scaled = np.clip(score, 0, 255).astype(np.uint8)
    otsu, _ = cv2.threshold(scaled, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    seed = largest_region(_drop_frames(score > max(float(otsu), MIN_THRESHOLD)))
    if not seed.any() or solidity(seed) >= MIN_SOLIDITY or len(np.unique(scaled)) < 3:
        return seed
    upper = float(threshold_multiotsu(scaled, classes=3)[-1])
    tighter = largest_region(_drop_frames(score > max(upper, MIN_THRESHOLD)))
    return tighter if tighter.any() and solidity(tighter) > solidity(seed) else seed


def _drop_frames(candidates: np.ndarray) -> np.ndarray:
    """Remove coloured camera frames: regions that run round all four edges and enclose far more than
    they cover (a leaf filling the picture touches the edges too, but is not hollow), and bands along
    an edge that are plant-coloured across nearly all of it (a frame the leaf touches)."""
    bands = []
    for axis in (0, 1):  # rows from the top and the bottom, then columns from the left and the right
        fill = candidates.mean(axis=1 - axis)
        for order in (range(len(fill)), range(len(fill) - 1, -1, -1)):
            for depth, line in enumerate(order):
                if depth >= FRAME_DEPTH * len(fill) or fill[line] < FRAME_FILL:
                    break
                bands.append((axis, line))
    candidates = candidates.copy()
    for axis, line in bands:
        if axis == 0:
            candidates[line] = False
        else:
            candidates[:, line] = False
    labels, n = ndimage.label(candidates, structure=np.ones((3, 3)))
    edges = [set(np.unique(side)) for side in (labels[0], labels[-1], labels[:, 0], labels[:, -1])]
    for region in set.intersection(*edges) - {0}:
        inside = labels == region
        if inside.sum() < 0.5 * ndimage.binary_fill_holes(inside).sum():
            candidates = candidates & ~inside
    return candidates


def solidity(mask: np.ndarray) -> float:
    """Area over convex-hull area: near 1 for a leaf, low for a region that also took in a backdrop."""
    return float(mask.sum()) / max(1, int(convex_hull_image(mask).sum()))


def _grabcut(rgb: np.ndarray, seed: np.ndarray, side: int) -> np.ndarray:
    core = ndimage.binary_erosion(seed, iterations=max(1, round(CORE_ERODE * side)))
    if not core.any():
        core = seed
    # Leaves are nearly convex: a lesion or a shaded half biting into the outline is probably leaf.
    hull = convex_hull_image(seed)
    near = ndimage.binary_dilation(hull, iterations=max(1, round(BACKGROUND_MARGIN * side)))
    labels = np.full(seed.shape, cv2.GC_BGD, np.uint8)
    labels[near] = cv2.GC_PR_BGD
    labels[hull] = cv2.GC_PR_FGD
    labels[core] = cv2.GC_FGD
    if (labels == cv2.GC_BGD).sum() < 16:  # a leaf filling the frame leaves no certain background
        labels[labels == cv2.GC_BGD] = cv2.GC_PR_BGD
        border = np.zeros_like(seed)
        border[[0, -1], :] = border[:, [0, -1]] = True
        labels[border & ~seed] = cv2.GC_BGD
    background, foreground = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    # GrabCut seeds its colour models from OpenCV's thread RNG, whose state depends on every earlier
    # call in the process: reseeded here, a photo's mask no longer depends on which photos came before.
    cv2.setRNGSeed(GRABCUT_SEED)
    try:
        cv2.grabCut(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), labels, None, background, foreground,
                    GRABCUT_ITERATIONS, cv2.GC_INIT_WITH_MASK)
    except cv2.error:  # degenerate colour statistics (e.g. a flat image): keep the colour-score mask
        return seed
    refined = largest_region((labels == cv2.GC_FGD) | (labels == cv2.GC_PR_FGD))
    return refined if refined.any() else seed


def largest_region(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected region of a boolean mask, holes filled (all False stays all False)."""
    labels, n = ndimage.label(mask, structure=np.ones((3, 3)))
    if n == 0:
        return np.zeros(mask.shape, bool)
    sizes = np.bincount(labels.ravel())[1:]
    return ndimage.binary_fill_holes(labels == int(np.argmax(sizes)) + 1)


def mask_iou(a: np.ndarray, b: np.ndarray) -> float | None:
    """Intersection over union of two boolean masks of one shape; None when both are empty."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape:
        raise ValueError(f"masks differ in shape: {a.shape} vs {b.shape}")
    union = int(np.count_nonzero(a | b))
    return None if union == 0 else int(np.count_nonzero(a & b)) / union


def load_mask(path: str | os.PathLike) -> np.ndarray:
    """A mask file (any image; leaf = brighter than half grey) as a boolean array."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such mask file")
    with Image.open(path) as opened:
        return np.asarray(opened.convert("L")) >= 128


def _as_rgb(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an RGB image of shape (H, W, 3), got {rgb.shape}")
    return np.ascontiguousarray(rgb, dtype=np.uint8)
