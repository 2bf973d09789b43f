"""Decoded squares: one threaded decode shared by the caches of the same files at the same size."""

from __future__ import annotations

import numpy as np
from PIL import Image

from cropcop_utils.core import imaging, squares


def test_square_caches_of_the_same_files_share_one_threaded_decode(tmp_path, decodes):
    rng = np.random.default_rng(1)
    paths = []
    for k in range(7):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / f"{k}.png")
        paths.append(tmp_path / f"{k}.png")
    first = squares.SquareCache(paths, 24)
    first.fill(threads=2)
    second = squares.SquareCache(paths, 24)  # the compact model's trainer after the reference's
    second.fill(threads=2)
    assert all(n == 1 for n in decodes.values()) and len(decodes) == 7
    for k, path in enumerate(paths):
        # threads write each image to its own slot
        assert np.array_equal(second.get(k), np.asarray(imaging.load_square(path, 24)))
    other = squares.SquareCache(paths, 20)  # another size is another set of arrays
    other.fill(threads=1)
    assert len(decodes) == 7 and all(n == 2 for n in decodes.values())
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


def test_a_file_rewritten_in_place_is_decoded_again(tmp_path, fresh_squares):
    # A chapter run twice in one process may rewrite its images (composites, generated inputs) at the
    # same paths: the shared squares must be the new pictures, not the old ones.
    import os

    path = tmp_path / "a.png"
    Image.new("RGB", (16, 16), (200, 10, 10)).save(path)
    before = squares.SquareCache([path], 8)
    before.fill(threads=1)
    Image.new("RGB", (16, 16), (10, 10, 200)).save(path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock may not move
    after = squares.SquareCache([path], 8)
    assert after.get(0)[0, 0].tolist() == [10, 10, 200]
    assert before.get(0)[0, 0].tolist() == [200, 10, 10]  # the old cache keeps what it decoded


def test_a_missing_file_still_fails_with_its_name(tmp_path, fresh_squares):
    import pytest

    cache = squares.SquareCache([tmp_path / "gone.jpg"], 8)
    with pytest.raises(FileNotFoundError, match="gone.jpg"):
        cache.fill(threads=1)


def test_caches_share_single_files_and_the_oldest_leave_past_the_byte_budget(tmp_path, monkeypatch, decodes,
                                                                           fresh_squares):
    # The learning curve's points train on nested draws: a cache of a superset reuses every photo a
    # cache of a subset decoded, and the shared store keeps at most SHARED_BYTES of squares.
    paths = []
    for k in range(6):
        Image.new("RGB", (10, 10), (k * 40, 0, 0)).save(tmp_path / f"{k}.png")
        paths.append(tmp_path / f"{k}.png")
    squares.SquareCache(paths[:2], 8).fill(threads=1)
    squares.SquareCache(paths[:4], 8).fill(threads=1)
    assert [decodes[str(p)] for p in paths[:4]] == [1, 1, 1, 1]
    monkeypatch.setattr(fresh_squares, "SHARED_BYTES", 3 * 8 * 8 * 3)  # three squares
    squares.SquareCache(paths[4:], 8).fill(threads=1)
    assert len(fresh_squares._shared) == 3 and fresh_squares._shared_bytes == 3 * 8 * 8 * 3
    newest = squares.SquareCache(paths[3:], 8)
    newest.fill(threads=1)
    assert [decodes[str(p)] for p in paths] == [1, 1, 1, 1, 1, 1]  # the newest three are still shared
    oldest = squares.SquareCache(paths[:1], 8)
    oldest.fill(threads=1)
    assert decodes[str(paths[0])] == 2  # the oldest was dropped
    assert np.array_equal(oldest.get(0), np.asarray(imaging.load_square(paths[0], 8)))
    assert all(np.array_equal(newest.get(k), np.asarray(imaging.load_square(p, 8)))
               for k, p in enumerate(paths[3:]))
