"""The hand-crafted representation and the pixel pass (probes.features)."""

from __future__ import annotations

import numpy as np
import pytest
from probes.probe_fixtures import write_images

from cropcop_utils.probes import features


def test_handcrafted_has_a_fixed_length_and_separates_colours():
    green = np.zeros((48, 48, 3), dtype=np.uint8)
    green[..., 1] = 160
    brown = green.copy()
    brown[...] = (120, 80, 30)
    small = features.handcrafted(green)
    assert small.shape == features.handcrafted(np.ascontiguousarray(np.tile(green, (2, 2, 1)))).shape
    assert np.isfinite(small).all()
    assert np.abs(small - features.handcrafted(brown)).sum() > 1.0
    assert np.array_equal(small, features.handcrafted(green))  # deterministic


def test_pixel_pass_parallel_equals_serial_and_names_missing_files(tmp_path):
    paths = write_images(tmp_path / "imgs")
    settings = features.PixelSettings(size=32)
    serial = features.extract_pixel_features(paths, settings, workers=1, chunk=2, progress=False)
    parallel = features.extract_pixel_features(paths, settings, workers=2, chunk=2, progress=False)
    assert set(serial) == set(features.PIXEL_SETS)
    for name in features.PIXEL_SETS:
        assert serial[name].shape[0] == len(paths)
        assert np.array_equal(serial[name], parallel[name]), name
    assert serial["jpeg"][:, 1].tolist() == [60 + 5 * i for i in range(len(paths))]
    with pytest.raises(FileNotFoundError, match="missing"):
        features.extract_pixel_features([*paths, tmp_path / "gone.jpg"], settings, progress=False)
