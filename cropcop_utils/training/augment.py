"""Conservative training augmentation, deterministic given a ``torch.Generator``.

The pipeline works on the square image the loading contract produced (``imaging.load_square``) and
returns a uint8 CHW tensor of the same size; normalisation is left to ``imaging.to_tensor`` so training
and evaluation share one normalisation.  Order: mild random-resized crop, horizontal / vertical flip,
small affine (rotation, translation, scale), illumination and colour jitter, JPEG re-compression,
Gaussian blur, Gaussian noise.

Why parameters are drawn here rather than by ``torchvision.transforms.v2`` classes: those draw from the
global torch RNG, which the training loop's dropout / drop-path also consume, so an augmented sample
would depend on everything that ran before it.  Drawing every parameter from a per-sample generator
makes a sample a pure function of (image, seed), which is what lets a resumed run reproduce an
uninterrupted one bit for bit.  The pixel work itself is torchvision's functional ops.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from ..core import imaging
from ..core.config import dataclass_from_section


class AugmentConfigError(ValueError):
    """The ``augment`` section of the training profile has an unknown key or an out-of-range value."""


@dataclass(frozen=True)
class AugmentParams:
    """Every knob of the pipeline; a probability of 0 (or a zero range) switches an operation off."""

    enabled: bool = True
    crop_scale: tuple[float, float] = (0.75, 1.0)   # area fraction kept by the random-resized crop
    crop_ratio: tuple[float, float] = (0.85, 1.18)  # aspect ratio range of the crop
    hflip: float = 0.5
    vflip: float = 0.0
    rotate_deg: float = 10.0
    translate: float = 0.05                         # fraction of the side
    scale: tuple[float, float] = (0.95, 1.05)
    brightness: float = 0.2                         # factor drawn from [1 - x, 1 + x]
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.02                               # fraction of the hue circle
    jpeg_p: float = 0.3
    jpeg_quality: tuple[int, int] = (60, 95)
    blur_p: float = 0.2
    blur_sigma: tuple[float, float] = (0.1, 1.0)    # pixels
    noise_p: float = 0.2
    noise_std: float = 0.02                         # of the [0, 1] intensity range

    @classmethod
    def from_dict(cls, section: dict[str, Any] | None) -> AugmentParams:
        params = dataclass_from_section(cls, section, "training.augment", AugmentConfigError)
        params.validate()
        return params

    def validate(self) -> None:
        for name in ("hflip", "vflip", "jpeg_p", "blur_p", "noise_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise AugmentConfigError(f"training.augment.{name} is a probability, "
                                         f"got {getattr(self, name)}")
        for name in ("crop_scale", "crop_ratio", "scale", "jpeg_quality", "blur_sigma"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise AugmentConfigError(f"training.augment.{name} needs 0 < low <= high, got {(low, high)}")
        if self.crop_scale[1] > 1.0:
            raise AugmentConfigError(f"training.augment.crop_scale cannot exceed 1, got {self.crop_scale}")
        if not 1 <= self.jpeg_quality[0] <= self.jpeg_quality[1] <= 100:
            raise AugmentConfigError(f"training.augment.jpeg_quality must lie in 1..100, "
                                     f"got {self.jpeg_quality}")
        if not 0 <= self.hue <= 0.5:
            raise AugmentConfigError(f"training.augment.hue must lie in [0, 0.5], got {self.hue}")
        for name in ("rotate_deg", "translate", "brightness", "contrast", "saturation", "noise_std"):
            if getattr(self, name) < 0:
                raise AugmentConfigError(f"training.augment.{name} must be >= 0, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# --------------------------------------------------------------------------- draws
N_DRAWS = 24  # uniforms drawn per sample; fixed, so switching an op off never shifts the other draws


class Draws:
    """Uniforms drawn in one call (a scalar ``torch.rand`` per parameter costs more than the pixel work)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.values = torch.rand(N_DRAWS, generator=generator, dtype=torch.float64).tolist()
        self.next = 0

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        value = self.values[self.next]
        self.next += 1
        return low + (high - low) * value

    def chance(self, p: float) -> bool:
        return self.uniform() < p

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high] inclusive."""
        return min(high, low + int(self.uniform() * (high - low + 1)))


def crop_box(draws: Draws, side: int, scale: tuple[float, float],
             ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random-resized crop, drawn as torchvision's RandomResizedCrop does.

    One attempt instead of torchvision's ten: with the mild ranges allowed here the first draw fits
    unless both sides overshoot, and the fallback clips instead of retrying.
    """
    target = side * side * draws.uniform(*scale)
    aspect = math.exp(draws.uniform(math.log(ratio[0]), math.log(ratio[1])))
    width = min(side, max(1, round(math.sqrt(target * aspect))))
    height = min(side, max(1, round(math.sqrt(target / aspect))))
    return draws.integer(0, side - height), draws.integer(0, side - width), height, width


def _edge_fill(image: Image.Image) -> tuple[int, int, int]:
    # Fill uncovered corners with the outer ring's mean colour, the loading contract's padding colour.
    return imaging.edge_mean_colour(image)


_GREY = np.array([0.2989, 0.587, 0.114], dtype=np.float64)  # torchvision's rgb_to_grayscale weights
_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_FROM_YIQ = np.linalg.inv(_TO_YIQ)


def colour_matrix(brightness: float, saturation: float, hue: float) -> np.ndarray:
    """One 3×3 RGB matrix for brightness × saturation × hue rotation.

    Why not torchvision's ``adjust_hue``: it converts to HSV and back, the costliest step of the whole
    pipeline at these image sizes.  A small hue shift is a rotation about the grey axis, done here in
    YIQ space, which is linear in RGB, so the three adjustments compose into one matrix product.
    Brightness and saturation follow torchvision's definitions (scale; blend with the grey image).
    """
    sat = saturation * np.eye(3) + (1 - saturation) * np.tile(_GREY, (3, 1))
    angle = -2 * math.pi * hue  # the sign makes a positive shift turn red towards green, as torchvision
    rot = np.array([[1.0, 0.0, 0.0], [0.0, math.cos(angle), -math.sin(angle)],
                    [0.0, math.sin(angle), math.cos(angle)]])
    return brightness * (_FROM_YIQ @ rot @ _TO_YIQ @ sat)


def jitter_colour(image: np.ndarray, brightness: float, contrast: float, saturation: float,
                  hue: float) -> np.ndarray:
    """Brightness, saturation and hue as one matrix, then contrast (blend with the mean grey level).

    ``image`` is HWC uint8; returns HWC float32, unclipped (the caller rounds and clips once).
    """
    out = image.astype(np.float32) @ colour_matrix(brightness, saturation, hue).T.astype(np.float32)
    mean_grey = float(np.clip(out, 0, 255).reshape(-1, 3).mean(0) @ _GREY)
    return contrast * out + (1 - contrast) * mean_grey


def _to_image(array: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8), mode="RGB")


def recompress(image: Image.Image, quality: int) -> Image.Image:
    """JPEG encode and decode in memory (Pillow's codec: the one the corpus files were written with)."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(quality))
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return decoded.convert("RGB")


# --------------------------------------------------------------------------- pipeline
def augment(image: Image.Image | np.ndarray | torch.Tensor, params: AugmentParams,
            generator: torch.Generator) -> torch.Tensor:
    """Augment one square RGB image; returns uint8 (3, S, S).  Uses only ``generator`` for randomness.

    Geometry runs on the PIL image (torchvision's functional ops dispatch to Pillow's C resampler, several
    times faster than the tensor path at these sizes), colour in numpy, noise from ``generator``.
    """
    img = as_image(image)
    if not params.enabled:
        return as_uint8_chw(img)
    side = img.width
    if img.height != side:
        raise ValueError(f"augment expects a square image (the loading contract's output), got {img.size}")
    d = Draws(generator)

    top, left, height, width = crop_box(d, side, params.crop_scale, params.crop_ratio)
    if (height, width) != (side, side):
        img = F.resized_crop(img, top, left, height, width, [side, side],
                             interpolation=InterpolationMode.BILINEAR, antialias=True)
    if d.chance(params.hflip):
        img = F.horizontal_flip(img)
    if d.chance(params.vflip):
        img = F.vertical_flip(img)

    angle = d.uniform(-params.rotate_deg, params.rotate_deg)
    shift = [round(d.uniform(-params.translate, params.translate) * side) for _ in range(2)]
    zoom = d.uniform(*params.scale)
    if angle != 0.0 or shift != [0, 0] or zoom != 1.0:
        img = F.affine(img, angle=angle, translate=shift, scale=zoom, shear=[0.0, 0.0],
                       interpolation=InterpolationMode.BILINEAR, fill=list(_edge_fill(img)))

    factors = [d.uniform(1 - v, 1 + v) for v in (params.brightness, params.contrast, params.saturation)]
    hue = d.uniform(-params.hue, params.hue)
    if factors != [1.0, 1.0, 1.0] or hue != 0.0:
        img = _to_image(jitter_colour(np.asarray(img), factors[0], factors[1], factors[2], hue))

    quality = d.integer(*params.jpeg_quality)
    if d.chance(params.jpeg_p):
        img = recompress(img, quality)

    sigma = d.uniform(*params.blur_sigma)
    if d.chance(params.blur_p):
        img = img.filter(ImageFilter.GaussianBlur(radius=sigma))  # Pillow's radius is the sigma

    std = d.uniform(0.0, params.noise_std)
    out = as_uint8_chw(img)
    if d.chance(params.noise_p) and std > 0:
        noise = torch.randn(out.shape, generator=generator) * (std * 255.0)
        out = (out.float() + noise).round_().clamp_(0, 255).to(torch.uint8)
    return out


def as_image(image: Image.Image | np.ndarray | torch.Tensor) -> Image.Image:
    """A PIL image, HWC uint8 array or CHW uint8 tensor as an RGB PIL image."""
    if isinstance(image, Image.Image):
        return image.convert("RGB") if image.mode != "RGB" else image
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"expected a uint8 tensor of shape (3, H, W), "
                             f"got {image.dtype} {tuple(image.shape)}")
        image = image.permute(1, 2, 0).numpy()
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an RGB uint8 image of shape (H, W, 3), got {image.dtype} {image.shape}")
    return Image.fromarray(np.ascontiguousarray(image), mode="RGB")


def as_uint8_chw(image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
    """A PIL image, HWC uint8 array or CHW uint8 tensor as a CHW uint8 tensor (a copy)."""
    array = np.array(as_image(image), dtype=np.uint8)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def to_hwc(image: torch.Tensor) -> np.ndarray:
    """A CHW uint8 tensor as the HWC array ``imaging.to_tensor`` takes."""
    return image.permute(1, 2, 0).contiguous().numpy()
