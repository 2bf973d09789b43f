"""Files for the corpus tests: small JPEGs, raw bytes, and the reasons the broken corpus must get.

Imported as ``corpus.corpus_files`` (``tests/`` is on the path); the corpora built from them are
fixtures in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def jpeg(path: Path, seed: int, size: tuple[int, int] = (32, 32)) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path, "JPEG")
    return path


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# rel_path → expected quarantine reason (None = admitted)
EXPECTED = {
    "train/alpha/a1.jpg": None, "train/alpha/a2.jpg": None, "train/alpha/a3.JPG": None,
    "test/alpha/a4.jpeg": None,
    "train/alpha/zero.jpg": "zero_byte",
    "train/alpha/truncated.jpg": "truncated",
    "train/alpha/notes.jpg": "not_an_image",
    "train/alpha/bomb.png": "decompression_bomb",
    "train/alpha/corrupt.png": "unreadable",
    "train/alpha/.hidden.jpg": "hidden",
    "train/alpha/._a1.jpg": "os_junk",
    "train/.DS_Store": "os_junk",
    "train/beta/b1.jpg": None, "train/beta/b2.jpg": None, "test/beta/b3.jpg": None,
    "train/beta/sub/deep.jpg": "outside_layout",
    "train/loose.jpg": "outside_layout",
    "README.txt": "outside_layout",
    ".git/HEAD": "hidden",
    "__MACOSX/train/alpha/a1.jpg": "os_junk",
    "train/solo/s1.jpg": "class_below_min_support",
}
