"""Corpora shared by the corpus tests: a broken one, one with byte copies, one with symbolic links."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from corpus.corpus_files import EXPECTED, jpeg, write
from PIL import Image

from cropcop_utils import corpus
from cropcop_utils.core.evidence import sha256_file


@pytest.fixture
def broken_corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    for seed, rel in enumerate(rel for rel, reason in EXPECTED.items()
                               if reason in (None, "class_below_min_support", "outside_layout", "hidden")
                               and rel.endswith(("jpg", "JPG", "jpeg"))):
        jpeg(root / rel, seed)
    good = (root / "train/alpha/a1.jpg").read_bytes()
    write(root / "train/alpha/zero.jpg", b"")
    write(root / "train/alpha/truncated.jpg", good[: len(good) // 2])
    write(root / "train/alpha/notes.jpg", b"field notes, not a photo\n")
    write(root / "train/alpha/._a1.jpg", b"\x00\x05\x16\x07AppleDouble")
    write(root / "train/.DS_Store", b"Bud1junk")
    write(root / "README.txt", b"a corpus\n")
    write(root / ".git/HEAD", b"ref: refs/heads/main\n")
    write(root / "__MACOSX/train/alpha/a1.jpg", good)
    Image.new("RGB", (100, 100), (0, 90, 0)).save(root / "train/alpha/bomb.png")  # 10,000 px > limit
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "train/alpha/corrupt.png")
    data = bytearray((root / "train/alpha/corrupt.png").read_bytes())
    start = data.index(b"IDAT") + 40
    data[start:start + 20] = b"\x00" * 20
    (root / "train/alpha/corrupt.png").write_bytes(bytes(data))
    (root / "val" / "empty_class").mkdir(parents=True)
    return root


@pytest.fixture
def copied_corpus(tmp_path) -> Path:
    """40 distinct JPEGs in train/test, a byte-identical copy inside train and one across train/test."""
    root = tmp_path / "copies"
    for i in range(40):
        jpeg(root / ("train" if i % 4 else "test") / ("a" if i % 2 else "b") / f"f{i}.jpg", 100 + i)
    out = sorted(p for p in root.rglob("*.jpg")
                 if not corpus.in_sample(sha256_file(p), 0.3) and p.parts[-3] == "train")
    write(root / "train/a/copy_in_train.jpg", out[0].read_bytes())
    write(root / "test/b/copy_across.jpg", out[1].read_bytes())
    return root


@pytest.fixture
def linked_corpus(tmp_path) -> tuple[Path, Path]:
    """A corpus with links that stay inside it, links that leave it, and a folder-link cycle."""
    root, outside = tmp_path / "corpus", tmp_path / "elsewhere"
    for i in range(3):
        jpeg(root / "train" / "alpha" / f"a{i}.jpg", i)
        jpeg(root / "train" / "beta" / f"b{i}.jpg", 10 + i)
    jpeg(outside / "secret.jpg", 99)  # a valid image: read, it would be admitted
    write(outside / "passwd", b"root:x:0:0:root:/root:/bin/bash\n")
    (root / "train/beta/b_link.jpg").symlink_to("../alpha/a0.jpg")  # inside: followed
    (root / "train/alpha/stolen.jpg").symlink_to(outside / "secret.jpg")  # outside, absolute
    (root / "train/alpha/passwd.jpg").symlink_to(Path("../../..") / "elsewhere/passwd")  # outside, relative
    (root / "train/alpha/far").symlink_to(outside, target_is_directory=True)  # outside folder
    (root / "train/alpha/loop").symlink_to("..", target_is_directory=True)  # cycle back to train/
    (root / "train/beta_again").symlink_to("beta", target_is_directory=True)  # a folder seen twice
    return root, outside
