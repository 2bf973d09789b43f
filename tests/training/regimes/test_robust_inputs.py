"""The background-robust regime's inputs in the run folder: train masks and pool, made once, reused."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cropcop_utils.core.evidence import Chapter, read_registry
from cropcop_utils.training.regimes import robust_inputs as ri

SIDE = 32
SECTION = {"clutter": 1, "texture": 1, "leaf_blur": 1, "solid": 1, "gradient": 1}


class Squares:
    """Stand-in for the training cache: green ellipse leaves on a grey card."""

    size = SIDE

    def __init__(self, n: int) -> None:
        yy, xx = np.mgrid[0:SIDE, 0:SIDE]
        self.images = []
        for i in range(n):
            square = np.full((SIDE, SIDE, 3), 140, np.uint8)
            leaf = ((yy - 16) / (9 + i)) ** 2 + ((xx - 16) / 7) ** 2 <= 1
            square[leaf] = (50, 150, 40)
            self.images.append(square)

    def get(self, index: int) -> np.ndarray:
        return self.images[index]


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"row_id": [f"r{i}" for i in range(n)], "label": [i % 2 for i in range(n)]})


def test_inputs_are_written_registered_and_reused(tmp_path):
    ch = Chapter(tmp_path, "training")
    first = ri.prepare(ch, _rows(3), Squares(3), SECTION)
    registry = read_registry(tmp_path)
    assert {ri.MASKS, ri.POOL} <= set(registry) and registry[ri.POOL]["chapter"] == "training"
    assert first.record["pool"]["n"] == 5 and first.record["masks"]["usable"] == 3
    assert all(m.shape == (SIDE, SIDE) and m.any() for m in first.paste.masks)
    again = ri.prepare(Chapter(tmp_path, "training"), _rows(3), Squares(3), SECTION)
    assert again.record["pool"]["sha256"] == first.record["pool"]["sha256"]
    assert again.record["masks"]["sha256"] == first.record["masks"]["sha256"]
    assert all(np.array_equal(a, b) for a, b in zip(first.paste.masks, again.paste.masks, strict=True))


def test_other_rows_or_parameters_make_new_inputs(tmp_path):
    first = ri.prepare(Chapter(tmp_path, "training"), _rows(3), Squares(3), SECTION)
    more = ri.prepare(Chapter(tmp_path, "training"), _rows(4), Squares(4), SECTION)
    assert more.record["masks"]["rows"] == 4
    assert more.record["masks"]["sha256"] != first.record["masks"]["sha256"]
    other = ri.prepare(Chapter(tmp_path, "training"), _rows(4), Squares(4), {**SECTION, "pool_seed": 7})
    assert other.record["pool"]["sha256"] != more.record["pool"]["sha256"]


def test_examples_figure_is_registered(tmp_path):
    ch = Chapter(tmp_path, "training")
    inputs = ri.prepare(ch, _rows(3), Squares(3), SECTION)
    sha = ri.save_examples(ch, inputs, Squares(3), seed=0, n=3)
    assert read_registry(tmp_path)[ri.EXAMPLES]["sha256"] == sha
