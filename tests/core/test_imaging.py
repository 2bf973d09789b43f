"""The image-loading contract: orientation, colour modes, padding, resize, normalisation, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from cropcop_utils.core import imaging

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def upright_marker(width: int = 40, height: int = 20) -> Image.Image:
    """A wide blue image with a red block in its top-left corner: orientation is visible."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(RED, (0, 0, 8, 6))
    return image


def save_with_orientation(image: Image.Image, path, orientation: int) -> None:
    exif = Image.Exif()
    exif[274] = orientation
    exif[271] = "CropCam"
    exif[272] = "Model 6"
    image.save(path, "PNG", exif=exif)  # lossless, so pixel checks are exact


@pytest.mark.parametrize(("orientation", "stored_as"), [
    (6, Image.Transpose.ROTATE_90),   # stored turned 90° counter-clockwise; viewer turns it clockwise
    (8, Image.Transpose.ROTATE_270),  # stored turned 90° clockwise; viewer turns it counter-clockwise
])
def test_exif_orientation_comes_out_upright(tmp_path, orientation, stored_as):
    upright = upright_marker()
    path = tmp_path / f"o{orientation}.png"
    save_with_orientation(upright.transpose(stored_as), path, orientation)
    assert Image.open(path).size == (20, 40)  # stored portrait

    loaded = imaging.open_rgb(path)
    assert loaded.mode == "RGB"
    assert loaded.size == (40, 20)
    assert np.array_equal(np.asarray(loaded), np.asarray(upright))
    assert loaded.getpixel((1, 1)) == RED and loaded.getpixel((38, 18)) == BLUE


def test_exif_fields_are_read(tmp_path):
    path = tmp_path / "o6.png"
    save_with_orientation(upright_marker(), path, 6)
    header: dict = {}
    imaging.open_decoded(path, header=header)
    assert header["exif_orientation"] == 6
    assert header["exif_make"] == "CropCam" and header["exif_model"] == "Model 6"
    assert (header["width"], header["height"], header["format"]) == (40, 20, "PNG")


def test_palette_with_transparency_is_composited_on_white(tmp_path):
    image = Image.new("P", (10, 10), 0)
    image.putpalette([0, 128, 0] + [200, 0, 0] + [0, 0, 0] * 254)
    image.paste(1, (0, 0, 5, 10))
    path = tmp_path / "palette.png"
    image.save(path, transparency=1)
    loaded = imaging.open_rgb(path)
    assert loaded.mode == "RGB"
    assert loaded.getpixel((1, 1)) == WHITE  # transparent index → white, not its palette red
    assert loaded.getpixel((8, 8)) == (0, 128, 0)


def test_rgba_and_la_are_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 0, 255))
    rgba.putpixel((1, 0), (0, 0, 0, 128))
    rgba.save(tmp_path / "rgba.png")
    loaded = imaging.open_rgb(tmp_path / "rgba.png")
    assert loaded.getpixel((3, 3)) == WHITE
    assert loaded.getpixel((0, 0)) == (0, 0, 0)
    assert all(120 <= v <= 135 for v in loaded.getpixel((1, 0)))  # half black over white

    la = Image.new("LA", (4, 4), (0, 0))
    la.save(tmp_path / "la.png")
    assert imaging.open_rgb(tmp_path / "la.png").getpixel((2, 2)) == WHITE


def test_greyscale_and_cmyk_become_rgb(tmp_path):
    Image.new("L", (6, 6), 77).save(tmp_path / "grey.png")
    grey = imaging.open_rgb(tmp_path / "grey.png")
    assert grey.mode == "RGB" and grey.getpixel((3, 3)) == (77, 77, 77)

    Image.new("CMYK", (6, 6), (0, 255, 255, 0)).save(tmp_path / "cmyk.tif")
    cmyk = imaging.open_rgb(tmp_path / "cmyk.tif")
    assert cmyk.mode == "RGB" and cmyk.getpixel((3, 3)) == RED


def test_16_bit_greyscale_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257 * 100, 65535, 30000]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "wide.png")
    assert Image.open(tmp_path / "wide.png").mode.startswith("I")
    loaded = np.asarray(imaging.open_rgb(tmp_path / "wide.png"))
    assert loaded.dtype == np.uint8 and loaded.shape == (1, 4, 3)
    assert loaded[0, :, 0].tolist() == [0, 100, 255, round(30000 / 257)]


def test_non_square_is_padded_symmetrically_with_edge_mean():
    image = Image.new("RGB", (30, 11), (10, 20, 30))
    square = imaging.pad_to_square(image)
    assert square.size == (30, 30)
    pixels = np.asarray(square)
    # 19 rows of padding: 9 above, 10 below; the edge-mean of a flat image is its colour.
    assert (pixels == (10, 20, 30)).all()
    marked = Image.new("RGB", (30, 11), (0, 0, 0))
    padded = np.asarray(imaging.pad_to_square(marked, fill=(200, 200, 200)))
    assert (padded[:9] == 200).all() and (padded[9:20] == 0).all() and (padded[20:] == 200).all()

    tall = Image.new("RGB", (5, 20), (0, 0, 0))
    tall.paste((100, 100, 100), (0, 0, 5, 10))
    assert imaging.edge_mean_colour(tall) == (50, 50, 50)
    padded = np.asarray(imaging.pad_to_square(tall))
    assert padded.shape == (20, 20, 3)
    assert (padded[:, :7] == 50).all() and (padded[:, 12:] == 50).all()  # 7 left, 8 right


def test_load_square_array_and_tensor(tmp_path):
    path = tmp_path / "wide.png"
    upright_marker(64, 32).save(path)
    square = imaging.load_square(path, 24)
    assert square.size == (24, 24) and square.mode == "RGB"
    array = imaging.load_array(path, 24)
    assert array.dtype == np.uint8 and array.shape == (24, 24, 3)
    assert array[7, 1, 0] > 200 and array[7, 1, 2] < 60  # the red corner survives below the top pad

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    tensor = imaging.load_tensor(path, 24, mean, std)
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (3, 24, 24)
    expected = (array[5, 10, 1] / 255.0 - mean[1]) / std[1]
    assert tensor[1, 5, 10].item() == pytest.approx(expected, abs=1e-5)
    spec = imaging.ImageSpec.from_section({"size": 24, "mean": list(mean), "std": list(std)})
    assert torch.equal(spec.load_tensor(path), tensor)


def test_to_tensor_rejects_bad_inputs():
    with pytest.raises(ValueError, match="std"):
        imaging.to_tensor(np.zeros((4, 4, 3), np.uint8), (0, 0, 0), (1, 0, 1))
    with pytest.raises(ValueError, match="RGB"):
        imaging.to_tensor(np.zeros((4, 4), np.uint8), (0, 0, 0), (1, 1, 1))


def _jpeg_bytes(tmp_path) -> bytes:
    rng = np.random.default_rng(0)
    path = tmp_path / "ok.jpg"
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path, quality=90)
    return path.read_bytes()


@pytest.mark.parametrize(("make", "reason"), [
    (lambda data: b"", "zero_byte"),
    (lambda data: b"this is a text file, not a picture\n", "not_an_image"),
    (lambda data: data[: len(data) // 2], "truncated"),
])
def test_broken_files_raise_image_load_error(tmp_path, make, reason):
    path = tmp_path / "broken.jpg"
    path.write_bytes(make(_jpeg_bytes(tmp_path)))
    with pytest.raises(imaging.ImageLoadError) as caught:
        imaging.open_rgb(path)
    assert caught.value.reason == reason
    assert str(path) in str(caught.value)


def corrupt_png(path) -> None:
    """A PNG whose header is fine but whose compressed pixel stream is damaged."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IDAT") + 40
    data[start:start + 20] = b"\x00" * 20
    path.write_bytes(bytes(data))


def test_corrupt_stream_is_unreadable(tmp_path):
    path = tmp_path / "corrupt.png"
    corrupt_png(path)
    with pytest.raises(imaging.ImageLoadError) as caught:
        imaging.open_rgb(path)
    assert caught.value.reason == "unreadable"
    assert "broken data stream" in str(caught.value)


def test_decompression_bomb_limit(tmp_path):
    path = tmp_path / "big.png"
    Image.new("RGB", (100, 60)).save(path)
    default_limit = Image.MAX_IMAGE_PIXELS
    for limit in (5000, 3500):  # above 2x the limit Pillow raises, between 1x and 2x it only warns
        with pytest.raises(imaging.ImageLoadError) as caught:
            imaging.open_rgb(path, max_image_pixels=limit)
        assert caught.value.reason == "decompression_bomb"
    assert imaging.open_rgb(path, max_image_pixels=6000).size == (100, 60)
    assert Image.MAX_IMAGE_PIXELS == default_limit  # the process-wide limit is restored


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        imaging.open_rgb(tmp_path / "nope.jpg")
