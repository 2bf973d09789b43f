"""Acquisition cues (probes.cues): JPEG quality, border / corner / thumbnail pixels and the metadata frame."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from probes.probe_fixtures import PARAMS, framed, jpeg_bytes, random_split

from cropcop_utils.probes import classifiers, cues
from cropcop_utils.probes.errors import ProbeInputError


def noise(side: int = 48, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- JPEG quality
def test_ijg_table_at_quality_50_is_the_standard_table():
    assert np.array_equal(cues.ijg_table(50), cues.STD_LUMINANCE)
    assert np.array_equal(cues.ijg_table(50, cues.STD_CHROMINANCE), cues.STD_CHROMINANCE)
    assert cues.ijg_table(100).max() == 1 and cues.ijg_table(1).max() == 255


@pytest.mark.parametrize("quality", [5, 12, 25, 40, 50, 63, 75, 84, 90, 95, 98])
def test_quality_estimate_recovers_what_pillow_saved(tmp_path, quality):
    path = tmp_path / f"q{quality}.jpg"
    path.write_bytes(jpeg_bytes(noise(), quality=quality))
    with Image.open(path) as img:
        luma, exact = cues.estimate_jpeg_quality(img.quantization[0])
        chroma, chroma_exact = cues.estimate_jpeg_quality(img.quantization[1], chroma=True)
    assert abs(luma - quality) <= 2 and abs(chroma - quality) <= 2
    assert exact and chroma_exact
    settings = cues.jpeg_settings(path)
    assert settings[0] == 1 and abs(settings[1] - quality) <= 2 and settings[3] == 1


def test_quality_estimate_flags_a_non_ijg_table():
    table = cues.ijg_table(80).copy()
    table[[3, 17, 40]] += 5  # a camera's own table near IJG 80
    quality, exact = cues.estimate_jpeg_quality(table)
    assert abs(quality - 80) <= 2 and not exact
    with pytest.raises(ValueError, match="64 entries"):
        cues.estimate_jpeg_quality([1, 2, 3])


def test_jpeg_settings_of_png_subsampling_and_progressive(tmp_path):
    png = tmp_path / "a.png"
    Image.fromarray(noise()).save(png)
    assert cues.jpeg_settings(png).tolist() == [0, -1, -1, -1, -1, -1]
    full = tmp_path / "full.jpg"
    full.write_bytes(jpeg_bytes(noise(), quality=90, subsampling=0, progressive=True))
    settings = dict(zip(cues.JPEG_COLUMNS, cues.jpeg_settings(full), strict=True))
    assert settings["subsampling"] == 0 and settings["progressive"] == 1
    half = tmp_path / "half.jpg"
    half.write_bytes(jpeg_bytes(noise(), quality=90, subsampling=2))
    assert cues.jpeg_settings(half)[4] == 2


# --------------------------------------------------------------------------- pixel cues
def test_border_strips_measure_each_side():
    values = cues.border_strips(framed(), width=3, segments=4)
    assert values.shape == (4 * 4 * 3 + 4 * 3,)
    means = values[:48].reshape(4, 4, 3)
    assert np.allclose(means[0], [1, 0, 0])            # top strip, every piece red
    assert np.allclose(means[1], [0, 1, 0])            # bottom green
    assert np.allclose(means[2, 1:3], [0, 0, 1])       # left blue (its end pieces touch the top/bottom)
    assert np.allclose(means[3, 1:3], [1, 1, 0])       # right yellow
    assert np.allclose(values[48:51], 0)               # the top strip is uniform: no spread


def test_border_strips_clip_a_width_larger_than_the_image():
    values = cues.border_strips(framed(side=6), width=50, segments=2)
    assert values.shape == (4 * 2 * 3 + 12,) and np.isfinite(values).all()


def test_corner_pixels_take_the_corner_and_the_diagonal_inset_pixel():
    array = np.zeros((10, 12, 3), dtype=np.uint8)
    spots = {(0, 0): 10, (2, 2): 20, (0, 11): 30, (2, 9): 40, (9, 0): 50, (7, 2): 60, (9, 11): 70, (7, 9): 80}
    for (row, col), value in spots.items():
        array[row, col] = value
    values = cues.corner_pixels(array, inset=2) * 255
    assert values.shape == (24,)
    assert np.allclose(values[::3], [10, 20, 30, 40, 50, 60, 70, 80])


def test_thumbnail_is_the_box_average():
    array = np.zeros((8, 8, 3), dtype=np.uint8)
    array[:4, :4] = 200
    thumb = cues.thumbnail(array, 2).reshape(2, 2, 3) * 255
    assert np.allclose(thumb[0, 0], 200, atol=1) and np.allclose(thumb[1, 1], 0, atol=1)


# --------------------------------------------------------------------------- the metadata frame
def metadata_rows(planted: bool, n: int = 240, seed: int = 3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    rows = pd.DataFrame({"row_id": [f"r{i:04d}" for i in range(n)], "label": y,
                         "split": random_split(n, rng)})
    cameras = np.array(["Canon", "samsung", "EPSON"])
    make = np.where(rng.random(n) < 0.85, cameras[y], cameras[rng.integers(0, 3, n)]) if planted \
        else np.full(n, None)
    manifest = pd.DataFrame({"row_id": rows["row_id"], "exif_make": make, "exif_model": None,
                             "format": "JPEG", "mode": "RGB", "bytes": 5000, "width": 64, "height": 64})
    quality = np.where(planted, 70 + 10 * y, 75)
    jpeg = np.column_stack([np.ones(n), quality, quality, np.ones(n), np.full(n, 2), np.zeros(n)])
    return rows, manifest.sample(frac=1, random_state=0), jpeg


def test_metadata_probe_reads_camera_and_jpeg_quality():
    rows, manifest, jpeg = metadata_rows(planted=True)
    frame = cues.metadata_frame(rows, manifest, jpeg)
    joined = manifest.set_index("row_id").loc[rows["row_id"][:3], "exif_make"]
    assert list(frame["exif_make"][:3]) == list(joined)  # joined on row_id, not on position
    result = classifiers.class_probe(frame, rows["label"].to_numpy(), rows["split"].to_numpy(), 3,
                                     "extra_trees", PARAMS, cues.META_CATEGORICAL)
    assert result["test"]["accuracy"]["ci_low"] > 0.8


def test_constant_metadata_only_reaches_the_majority_rate():
    rows, manifest, jpeg = metadata_rows(planted=False)
    frame = cues.metadata_frame(rows, manifest, jpeg)
    assert set(frame["exif_make"]) == {cues.MISSING}
    result = classifiers.class_probe(frame, rows["label"].to_numpy(), rows["split"].to_numpy(), 3,
                                     "extra_trees", PARAMS, cues.META_CATEGORICAL)
    accuracy = result["test"]["accuracy"]
    assert accuracy["value"] == pytest.approx(accuracy["majority"], abs=1e-6)


def test_metadata_frame_refuses_a_mismatched_manifest():
    rows, manifest, jpeg = metadata_rows(planted=True)
    with pytest.raises(ProbeInputError, match="lacks"):
        cues.metadata_frame(rows, manifest.drop(columns=["bytes"]), jpeg)
    with pytest.raises(ProbeInputError, match="different runs"):
        cues.metadata_frame(rows, manifest.iloc[5:], jpeg)
