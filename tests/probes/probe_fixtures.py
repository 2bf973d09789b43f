"""Constructed data shared by the probes tests: probe settings, framed "leaves" and small JPEG files."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from cropcop_utils.probes import chapter as probes

PARAMS = {**probes.DEFAULTS, "bootstrap": 300, "forest_trees": 60, "workers": 1, "progress": False,
          "membership_folds": 4}
PALETTE = np.array([(200, 40, 40), (40, 200, 40), (40, 40, 200), (220, 220, 60)])


# --------------------------------------------------------------------------- constructed data
def leaf_image(rng: np.random.Generator, border, side: int = 24, width: int = 3) -> np.ndarray:
    """Random 'plant' in the centre (no class information) inside a border of ``border`` colour."""
    array = rng.integers(0, 256, (side, side, 3)).astype(np.int64)
    frame = np.ones((side, side), dtype=bool)
    frame[width:-width, width:-width] = False
    array[frame] = np.asarray(border) + rng.integers(-12, 13, (int(frame.sum()), 3))
    return np.clip(array, 0, 255).astype(np.uint8)


def random_split(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(np.array(["train", "val", "test"]), size=n, p=[0.6, 0.2, 0.2])


def jpeg_bytes(array: np.ndarray, **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", **save)
    return buffer.getvalue()


def framed(side: int = 40, colours=((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)), width: int = 3):
    """Grey centre; top, bottom, left, right strips in four colours (the sides' corners overlap)."""
    array = np.full((side, side, 3), 128, dtype=np.uint8)
    array[:, :width] = colours[2]
    array[:, -width:] = colours[3]
    array[:width] = colours[0]
    array[-width:] = colours[1]
    return array


def write_images(folder, n: int = 6, side: int = 40):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"img_{i}.jpg"
        path.write_bytes(jpeg_bytes(framed(side, width=2 + i % 3), quality=60 + 5 * i))
        paths.append(path)
    return paths
