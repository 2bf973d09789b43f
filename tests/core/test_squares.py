"""Decoded squares: one threaded decode shared by the caches of the same files at the same size."""

from __future__ import annotations

from collections import Counter

import numpy as np
from PIL import Image

from cropcop_utils.core import imaging, squares


def test_square_caches_of_the_same_files_share_one_threaded_decode(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    paths = []
    for k in range(7):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / f"{k}.png")
        paths.append(tmp_path / f"{k}.png")
    decoded = Counter()
    load = imaging.load_array

    def counting(path, size):
        decoded[str(path)] += 1
        return load(path, size)

    monkeypatch.setattr(squares.SquareCache, "_shared", {})
    monkeypatch.setattr(squares.imaging, "load_array", counting)
    first = squares.SquareCache(paths, 24)
    first.fill(threads=2)
    second = squares.SquareCache(paths, 24)  # the compact model's trainer after the reference's
    second.fill(threads=2)
    assert all(n == 1 for n in decoded.values()) and len(decoded) == 7
    for k, path in enumerate(paths):
        assert np.array_equal(second.get(k), load(path, 24))  # threads write each image to its own slot
    other = squares.SquareCache(paths, 20)  # another size is another set of arrays
    other.fill(threads=1)
    assert len(decoded) == 7 and all(n == 2 for n in decoded.values())
    off = squares.SquareCache(paths, 24, enabled=False)
    assert all(a is None for a in off.arrays)


def test_row_paths_resolve_each_row_under_its_source_root(tmp_path):
    import pandas as pd
    import pytest

    from cropcop_utils.core.sources import FIELD_TRAIN, LAB

    lab, orchard = tmp_path / "lab", tmp_path / "orchard"
    rows = pd.DataFrame({"rel_path": ["a/1.jpg", "a/1.jpg", "b/2.jpg"], "source": [LAB, FIELD_TRAIN, LAB]})
    roots = {LAB: lab, FIELD_TRAIN: orchard}
    assert squares.row_paths(rows, roots) == [lab / "a/1.jpg", orchard / "a/1.jpg", lab / "b/2.jpg"]
    # a single root, or rows without a source column, behave as before: every row under the lab root
    assert squares.row_paths(rows, lab) == [lab / "a/1.jpg", lab / "a/1.jpg", lab / "b/2.jpg"]
    plain = rows.drop(columns="source")
    assert squares.row_paths(plain, roots) == squares.row_paths(plain, lab)
    with pytest.raises(ValueError, match=r"\['field_train'\] have no image folder.*--field-train"):
        squares.row_paths(rows, {LAB: lab})
