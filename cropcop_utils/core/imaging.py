"""The image-loading contract: how every chapter turns a corpus file into pixels.

One function chain, used by the corpus scan (to prove a file is admissible) and by every chapter that
feeds a model, so a file that was admitted is decoded the same way everywhere:

1. :func:`open_decoded` – open and *fully* decode (``img.load()``, truncated files refused), with an
   optional decompression-bomb limit.  Failures raise :class:`ImageLoadError` whose ``reason`` is one
   of the corpus quarantine reasons (``zero_byte``, ``not_an_image``, ``truncated``, ``unreadable``,
   ``decompression_bomb``).
2. :func:`to_rgb` – EXIF orientation applied (``ImageOps.exif_transpose``); first frame of multi-frame
   files; palette / RGBA / LA / anything with transparency composited on white; CMYK, greyscale,
   YCbCr, LAB… converted to RGB; 16- and 32-bit integer greyscale scaled by /257 (16-bit range), float
   images clipped to 0..255.
3. :func:`pad_to_square` – the shorter side padded symmetrically (the odd pixel goes right / bottom)
   with the **edge-mean colour**: the mean RGB of the image's outermost pixel ring.  Why: PlantVillage
   style photos have a fairly uniform background, so the padding continues it instead of adding a hard
   black bar whose position would tell a model the original aspect ratio.
4. :func:`load_square` – pad, then bicubic resize to ``size``×``size``.
5. :func:`to_tensor` – float32 CHW tensor in [0, 1], normalised with the profile's ``image.mean`` /
   ``image.std``.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

if TYPE_CHECKING:  # torch is heavy: only the tensor helpers import it, at call time
    import torch

WHITE = (255, 255, 255)
RESAMPLE = Image.Resampling.BICUBIC
IN_MEMORY_BYTES = 64 << 20
LOAD_REASONS = ("zero_byte", "not_an_image", "truncated", "unreadable", "decompression_bomb")


class ImageLoadError(ValueError):
    """A file cannot be decoded under the loading contract; ``reason`` is a quarantine reason."""

    def __init__(self, path: str | os.PathLike | None, reason: str, detail: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = reason
        self.detail = detail
        where = self.path or "<bytes>"
        super().__init__(f"{where}: cannot load image ({reason}): {detail}")


# --------------------------------------------------------------------------- decoding
@contextmanager
def pixel_limit(max_image_pixels: int | None) -> Iterator[None]:
    """Temporarily set Pillow's decompression-bomb limit (a process-wide global) and restore it."""
    previous = Image.MAX_IMAGE_PIXELS
    if max_image_pixels is not None:
        Image.MAX_IMAGE_PIXELS = int(max_image_pixels)
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def classify_error(error: BaseException) -> str:
    """Map a decoding exception to a quarantine reason."""
    if isinstance(error, ImageLoadError):
        return error.reason
    if isinstance(error, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return "decompression_bomb"
    if isinstance(error, UnidentifiedImageError):
        return "not_an_image"
    # Pillow reports a short file as OSError("image file is truncated …") or "Truncated File Read".
    if "truncat" in str(error).lower():
        return "truncated"
    return "unreadable"


def _decode(source: bytes | Path, max_image_pixels: int | None, header: dict[str, Any]) -> Image.Image:
    """Open, record the header (format, size, mode) into ``header``, fully decode, add EXIF fields."""
    # A later import may have flipped this process-wide switch; truncated files must fail here.
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    with pixel_limit(max_image_pixels), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        header.update(format=image.format, width=image.width, height=image.height, mode=image.mode)
        bombs = [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
        if bombs:
            # Pillow only *warns* between 1x and 2x its limit; the contract refuses both.
            raise Image.DecompressionBombError(str(bombs[0].message))
        image.load()
    # EXIF only after load(): PNG's getexif() loads the image itself and would hide a decode error.
    header.update(exif_fields(image))
    return image


def open_decoded(
    source: str | os.PathLike | bytes,
    max_image_pixels: int | None = None,
    path: str | os.PathLike | None = None,
    header: dict[str, Any] | None = None,
) -> Image.Image:
    """Open ``source`` (a path or the file's bytes) and fully decode its first frame.

    Images larger than ``max_image_pixels`` (Pillow's limit when None) are refused as decompression
    bombs before their pixels are decoded.  ``header``, when given, receives what the file's header
    said (format, width, height, mode) even when decoding then fails, and the EXIF fields once the
    pixels decoded.  Raises
    :class:`ImageLoadError` on any failure (``path`` names the file in the message).
    """
    header = {} if header is None else header
    if isinstance(source, (bytes, bytearray)):
        data: bytes | Path = bytes(source)
        empty = not source
    else:
        path = source
        file = Path(source)
        if not file.is_file():
            raise FileNotFoundError(f"{source}: no such image file")
        size = file.stat().st_size
        empty = size == 0
        # Decode from memory (no open handle left behind by multi-frame files) unless it is huge.
        data = file.read_bytes() if 0 < size <= IN_MEMORY_BYTES else file
    if empty:
        raise ImageLoadError(path, "zero_byte", "the file is empty (0 bytes)")
    try:
        return _decode(data, max_image_pixels, header)
    except Exception as error:  # every decoder failure becomes a classified error
        raise ImageLoadError(path, classify_error(error), describe_error(error)) from error


def describe_error(error: BaseException) -> str:
    """``Type: message`` without memory addresses (the manifest must be byte-reproducible)."""
    text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "the file", str(error))
    return f"{type(error).__name__}: {re.sub(r' at 0x[0-9a-fA-F]+', '', text)}"


def exif_fields(image: Image.Image) -> dict[str, Any]:
    """EXIF orientation (tag 274), camera make (271) and model (272) of a decoded image, or None."""
    try:
        exif = image.getexif()
    except Exception:  # broken EXIF blocks are common and not a reason to refuse a file
        return {"exif_orientation": None, "exif_make": None, "exif_model": None}

    def text(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("latin-1", "replace")
        value = str(value).replace("\x00", "").strip()
        return value or None

    orientation = exif.get(274)
    try:
        orientation = int(orientation) if orientation is not None else None
    except (TypeError, ValueError):
        orientation = None
    return {"exif_orientation": orientation, "exif_make": text(exif.get(271)),
            "exif_model": text(exif.get(272))}


# --------------------------------------------------------------------------- colour
def _composite_on_white(image: Image.Image) -> Image.Image:
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, WHITE + (255,))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _wide_grey_to_rgb(image: Image.Image) -> Image.Image:
    # Pillow's convert("L") clips 16-bit values at 255; scale the 16-bit range instead.
    values = np.asarray(image)
    if image.mode == "F":
        grey = np.clip(values, 0, 255).round().astype(np.uint8)
    else:
        grey = ((np.clip(values.astype(np.int64), 0, 65535) + 128) // 257).astype(np.uint8)
    return Image.fromarray(grey, mode="L").convert("RGB")


def to_rgb(image: Image.Image) -> Image.Image:
    """Apply EXIF orientation and convert any Pillow mode to 8-bit RGB (transparency on white)."""
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # an unparsable EXIF block has no orientation to honour
        pass
    mode = image.mode
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        return _composite_on_white(image)
    if mode.startswith("I") or mode == "F":
        return _wide_grey_to_rgb(image)
    if mode == "RGB":
        return image
    return image.convert("RGB")  # P (opaque), L, 1, CMYK, YCbCr, LAB, HSV, RGBX


def open_rgb(path: str | os.PathLike, max_image_pixels: int | None = None) -> Image.Image:
    """Decode ``path`` under the contract: upright, 8-bit RGB.  Raises :class:`ImageLoadError`."""
    try:
        return to_rgb(open_decoded(path, max_image_pixels))
    except ImageLoadError:
        raise
    except FileNotFoundError:
        raise
    except Exception as error:  # a mode Pillow cannot convert is an unreadable file
        raise ImageLoadError(path, "unreadable", describe_error(error)) from error


# --------------------------------------------------------------------------- geometry
def edge_mean_colour(image: Image.Image) -> tuple[int, int, int]:
    """Mean RGB of the outermost pixel ring: the padding colour of :func:`pad_to_square`."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    ring = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    return tuple(int(v) for v in np.rint(ring.mean(axis=0)))  # type: ignore[return-value]


def pad_to_square(image: Image.Image, fill: tuple[int, int, int] | None = None) -> Image.Image:
    """Pad the shorter side symmetrically (odd pixel right / bottom) with ``fill`` (edge mean)."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    colour = edge_mean_colour(image) if fill is None else tuple(fill)
    canvas = Image.new("RGB", (side, side), colour)
    canvas.paste(image.convert("RGB"), ((side - width) // 2, (side - height) // 2))
    return canvas


def square_resize(image: Image.Image, size: int) -> Image.Image:
    """Pad to square, then bicubic resize to ``size``×``size``."""
    if size <= 0:
        raise ValueError(f"image size must be positive, got {size}")
    square = pad_to_square(image)
    if square.size == (size, size):
        return square
    return square.resize((size, size), RESAMPLE)


def load_square(path: str | os.PathLike, size: int) -> Image.Image:
    """Open under the contract, pad to square with the edge-mean colour, bicubic resize."""
    return square_resize(open_rgb(path), size)


def load_array(path: str | os.PathLike, size: int) -> np.ndarray:
    """``load_square`` as a ``uint8`` array of shape (size, size, 3)."""
    return np.asarray(load_square(path, size), dtype=np.uint8)


# --------------------------------------------------------------------------- tensors
def to_tensor(image: Image.Image | np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """An RGB image (PIL or HWC uint8 array) as a normalised float32 tensor of shape (3, H, W)."""
    import torch

    array = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an RGB image of shape (H, W, 3), got {array.shape}")
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f"mean and std need three values with std > 0, got mean={mean} std={std}")
    tensor = torch.from_numpy(np.array(array, dtype=np.uint8)).permute(2, 0, 1).float().div_(255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    return (tensor - mean_t) / std_t


def load_tensor(
    path: str | os.PathLike, size: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """The whole contract: file → upright RGB → square → size×size → normalised (3, size, size)."""
    return to_tensor(load_square(path, size), mean, std)


@dataclass(frozen=True)
class ImageSpec:
    """The profile's ``image`` section (size, mean, std) bound to the loading contract."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> ImageSpec:
        missing = {"size", "mean", "std"} - set(section)
        if missing:
            raise KeyError(f"profile 'image' section lacks {sorted(missing)}; it needs size, mean and std")
        return cls(int(section["size"]), tuple(map(float, section["mean"])),  # type: ignore[arg-type]
                   tuple(map(float, section["std"])))  # type: ignore[arg-type]

    def load_tensor(self, path: str | os.PathLike) -> torch.Tensor:
        return load_tensor(path, self.size, self.mean, self.std)

    def load_array(self, path: str | os.PathLike) -> np.ndarray:
        return load_array(path, self.size)
