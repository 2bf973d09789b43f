"""The hand-crafted frozen representation and the one pass over every image that computes the pixel features.

* the hand-crafted colour + texture descriptor (HSV histograms, HOG, LBP) computed on the loading
  contract's images: the last-resort frozen representation (a real, fixed representation, but plainly
  not a pretrained network), and the baseline the pretrained features are compared with;
* :func:`extract_pixel_features`: one decode of each image yields that descriptor and the pixel
  acquisition cues of :mod:`.cues` (thumbnail, border strips, corner pixels, JPEG settings).

Every pixel feature is computed from :mod:`cropcop_utils.core.imaging` (the loading contract), so the
probes see what the models will see.  The pretrained backbone lives in :mod:`.backbone`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..core.config import progress_wanted
from .cues import border_strips, corner_pixels, jpeg_settings, thumbnail

HANDCRAFTED = "handcrafted-colour-texture (HSV histograms + HOG + LBP)"


# --------------------------------------------------------------------------- hand-crafted frozen features
def _hist(codes: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(codes.ravel(), minlength=bins)[:bins].astype(np.float32) / codes.size


def handcrafted(square: np.ndarray, hog_cells: int = 4) -> np.ndarray:
    """Colour + texture descriptor of a loading-contract image (uint8 RGB, size×size).

    HSV histograms (hue 16, saturation 8, value 8 bins, and a joint 8×4 hue–saturation histogram),
    RGB means and standard deviations, HOG (9 orientations on a ``hog_cells``×``hog_cells`` grid,
    2×2-cell blocks) and the uniform LBP histogram (8 neighbours, radius 1) — the classic
    pre-deep-learning leaf-disease descriptor, used as the fallback frozen representation.
    """
    from skimage.feature import hog, local_binary_pattern

    image = Image.fromarray(square)
    hsv = np.asarray(image.convert("HSV"))  # Pillow's uint8 HSV: many times faster than skimage's
    hue, sat, val = (hsv[..., i].astype(np.int64) for i in range(3))
    colour = np.concatenate([_hist(hue * 16 // 256, 16), _hist(sat * 8 // 256, 8), _hist(val * 8 // 256, 8),
                             _hist((hue * 8 // 256) * 4 + sat * 4 // 256, 32)])
    rgb = square.reshape(-1, 3).astype(np.float32) / 255.0
    moments = np.concatenate([rgb.mean(axis=0), rgb.std(axis=0)])
    gray = np.asarray(image.convert("L"))
    cell = max(2, gray.shape[0] // hog_cells)
    shape = hog(gray, orientations=9, pixels_per_cell=(cell, cell), cells_per_block=(2, 2),
                feature_vector=True).astype(np.float32)
    texture = _hist(local_binary_pattern(gray, 8, 1, method="uniform").astype(np.int64), 10)
    return np.concatenate([colour, moments, shape, texture]).astype(np.float32)


# --------------------------------------------------------------------------- one pass per image
PIXEL_SETS = ("handcrafted", "thumbnail", "border", "corners", "jpeg")


@dataclass(frozen=True)
class PixelSettings:
    """Everything the pixel pass depends on (part of the cache key)."""

    size: int
    thumbnail_px: int = 8
    border_px: int = 4
    border_segments: int = 4
    corner_inset: int = 4
    hog_cells: int = 4

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def image_features(path: str | os.PathLike, settings: PixelSettings) -> dict[str, np.ndarray]:
    """All per-image features in one decode of each kind.

    Border and corner cues come from the decoded file (EXIF-oriented RGB, its own resolution): that
    is what the camera and the photographer's background left.  The hand-crafted representation and
    the thumbnail come from the loading contract's square image, i.e. what a model is shown.
    """
    from ..core import imaging

    decoded = imaging.open_rgb(path)
    raw = np.asarray(decoded)
    square = np.asarray(imaging.square_resize(decoded, settings.size), dtype=np.uint8)  # = load_array
    return {
        "handcrafted": handcrafted(square, settings.hog_cells),
        "thumbnail": thumbnail(square, settings.thumbnail_px),
        "border": border_strips(raw, settings.border_px, settings.border_segments),
        "corners": corner_pixels(raw, settings.corner_inset),
        "jpeg": jpeg_settings(path),
    }


def _features_chunk(paths: list[str], settings: PixelSettings) -> list[dict[str, np.ndarray]]:
    return [image_features(path, settings) for path in paths]


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


def extract_pixel_features(paths: Sequence[str | os.PathLike], settings: PixelSettings, workers: int = 1,
                           chunk: int = 64, progress: bool = True) -> dict[str, np.ndarray]:
    """Run :func:`image_features` over ``paths`` (joblib processes when ``workers > 1``).

    Returns one 2-D array per name in :data:`PIXEL_SETS`, rows in ``paths`` order.
    """
    from joblib import Parallel, delayed
    from tqdm import tqdm

    paths = [os.fspath(p) for p in paths]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) of the frozen split are missing, e.g. "
                                f"{missing[0]}; the corpus folder changed after the split was frozen.")
    bar = tqdm(total=len(paths), desc="probe features", unit="img", disable=not progress_wanted(progress))
    rows: list[dict[str, np.ndarray]] = []
    if workers <= 1:
        for block in _chunks(paths, chunk):
            rows.extend(_features_chunk(block, settings))
            bar.update(len(block))
    else:
        jobs = Parallel(n_jobs=workers, return_as="generator")(
            delayed(_features_chunk)(block, settings) for block in _chunks(paths, chunk))
        for done in jobs:
            rows.extend(done)
            bar.update(len(done))
    bar.close()
    if not rows:
        return {name: np.zeros((0, 0), dtype=np.float32) for name in PIXEL_SETS}
    return {name: np.stack([row[name] for row in rows]) for name in PIXEL_SETS}
