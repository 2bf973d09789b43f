"""The renderer of the embedded corpus: one leaf photograph from ``(seed, class, source, uid, shot)``.

Why a hand-written renderer: no image library generates labelled leaf photographs, and the book must
run offline.  Leaves are drawn with PIL at twice the output size and downsampled once (anti-aliasing);
all randomness comes from ``numpy.random.default_rng`` seeded per image, so the same arguments give the
same pixels on any run.  The generator (:mod:`cropcop_utils.synthetic`) plans the corpus and encodes
what :func:`render_upright` draws.

This module assembles the photograph: the subject (shape from :mod:`.leaves`, condition from
:mod:`.lesions`, then the marks of one individual leaf), its pose, the source's backdrop, shadow,
lighting, sensor noise and frame or vignette.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from PIL import Image, ImageFilter

from .leaves import (
    _SS,
    _blob,
    _Canvas,
    _draw_bananas,
    _draw_palmate_leaf,
    _draw_profile_leaf,
    _jitter,
    _mix,
    _smooth,
)
from .lesions import PATTERNS
from .world import CLASS_BY_NAME, CROPS, SOURCES, ClassSpec, SourceSpec


def _draw_subject(rng: np.random.Generator, spec: ClassSpec, size: int) -> tuple[Image.Image, Image.Image]:
    crop = CROPS[spec.crop]
    cv = _Canvas(size, _jitter(rng, crop.colour, 10))
    if crop.shape == "banana":
        _draw_bananas(rng, cv)
    elif crop.shape == "palmate":
        _draw_palmate_leaf(rng, cv, distorted=spec.condition == "mosaic_virus")
    else:
        _draw_profile_leaf(rng, cv, crop, distorted=spec.condition == "mosaic_virus")
    PATTERNS[spec.condition](rng, cv)
    # Natural unevenness: slow shading across the subject (grain comes from the sensor noise later).
    arr = np.asarray(cv.rgb, dtype=np.float32)
    arr += _smooth(rng, size, 5)[..., None] * 7
    cv.rgb = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    _individual_marks(rng, cv)
    return cv.rgb, cv.alpha


def _individual_marks(rng: np.random.Generator, cv: _Canvas) -> None:
    """What makes one leaf (or fruit) this one: faint mottling and a few specks and scuffs.

    Real leaves of a class differ in these even when healthy, and PlantVillage's re-shots are recognised
    by them.  Without them the generator's leaves of a class were one outline in other poses: unrelated
    same-class pairs aligned leaf on leaf scored SSIM 0.52 at the median, against 0.18 on PlantVillage
    tomato, and the audit's thresholds, calibrated on those look-alikes, rejected real re-shots.  Drawn
    last, from the same per-leaf stream, so every shape and lesion stays as it was.
    """
    arr = np.asarray(cv.rgb, dtype=np.float32)
    arr += _smooth(rng, cv.size, 14)[..., None] * np.array([5, 6, 3], dtype=np.float32)
    cv.rgb = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    n = int(rng.integers(4, 9))
    for (x, y), r, pale in zip(cv.inside(rng, n).tolist(), (cv.scale * rng.uniform(0.012, 0.03, n)).tolist(),
                               (rng.random(n) < 0.5).tolist(), strict=True):
        mask, draw = cv.mask()
        outline = _blob(rng, x, y, r, 0.35, aspect=float(rng.uniform(0.5, 1.0)))
        draw.polygon(outline, fill=int(rng.uniform(110, 190)))
        cv.tint(_mix(cv.colour, (226, 230, 190) if pale else (52, 60, 30), 0.6), mask, blur=0.004 * cv.size)


_UNEVEN_LIGHT = {"lab_bench": 12.0, "field_phone": 6.0, "greenhouse_cam": 8.0, "flatbed_scan": 8.0}


def _background(rng: np.random.Generator, src: SourceSpec, size: int) -> np.ndarray:
    """The source's backdrop.  Its layout (texture, uneven light) varies per photo, which also keeps
    distinct photos of similar leaves apart in perceptual-hash space."""
    base = np.array(src.background, dtype=np.float32) + rng.uniform(-8, 8, 3).astype(np.float32)
    bg = np.broadcast_to(base, (size, size, 3)).copy()
    if src.name == "field_phone":
        mix = 1 / (1 + np.exp(-2.5 * _smooth(rng, size, int(rng.integers(4, 7)))))
        grass = np.array([74, 104, 52], dtype=np.float32) + rng.uniform(-8, 8, 3).astype(np.float32)
        bg = bg * (1 - mix[..., None]) + grass * mix[..., None]
        bg += _smooth(rng, size, 14)[..., None] * 10
    elif src.name == "greenhouse_cam":
        period = size / rng.uniform(4, 6)
        rows = (np.arange(size) + rng.uniform(0, period)) % period < period * 0.14
        bg[rows] -= 34
    bg += _smooth(rng, size, 3)[..., None] * _UNEVEN_LIGHT[src.name]
    # Light from above (what EXIF orientation must restore), with some sideways tilt per photo.
    ramp = np.linspace(1, -1, size, dtype=np.float32)
    tilt = rng.uniform(-0.5, 0.5)
    light = ramp[:, None] * rng.uniform(0.7, 1.3) + tilt * ramp[None, :]
    return bg + (light * src.gradient)[..., None]


@functools.lru_cache(maxsize=8)
def _vignette(px: int, strength: float) -> np.ndarray:
    yy, xx = np.mgrid[0:px, 0:px] / (px - 1) * 2 - 1
    return (1 - strength * np.clip((np.hypot(xx, yy) - 0.75) / 0.66, 0, 1) ** 1.5).astype(np.float32)


def _finish(rng: np.random.Generator, src: SourceSpec, img: Image.Image, lighting: float) -> Image.Image:
    """Output-size touches: lighting, sensor noise and the source's frame or vignette."""
    arr = np.asarray(img, dtype=np.float32) * lighting
    arr += rng.normal(0, src.noise, arr.shape).astype(np.float32)
    px = arr.shape[0]
    if src.border == "frame":
        band = max(1, round(src.border_frac * px))
        arr[:band], arr[-band:], arr[:, :band], arr[:, -band:] = (src.border_colour,) * 4
    else:
        arr *= _vignette(px, src.border_frac)[..., None]
    return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))


def render_upright(seed: int, image_px: int, class_name: str, source: str, uid: int,
                   shot: int = 0, reshot: str = "moved") -> Image.Image:
    """Draw one photograph as it should be seen (before any EXIF rotation of the stored pixels).

    The subject (shape, colours, lesions), its pose and the backdrop's layout depend only on
    ``(seed, uid)``; ``shot > 0`` re-photographs the same leaf on the same bench — a few pixels and
    degrees off, with fresh lighting and sensor noise — which is what a re-shot family is.  ``reshot``
    says how a re-shot differs: ``moved`` (as above), ``relit`` (barely moved, light 20-30 % brighter or
    darker) or ``background`` (slightly moved, on another shade of the backdrop).
    """
    return render_with_mask(seed, image_px, class_name, source, uid, shot, reshot)[0]


def render_with_mask(seed: int, image_px: int, class_name: str, source: str, uid: int,
                     shot: int = 0, reshot: str = "moved") -> tuple[Image.Image, np.ndarray]:
    """:func:`render_upright` and the subject's true mask (bool, ``image_px`` square, upright).

    The mask is the subject's alpha after the pose transform, area-averaged to the output size and cut
    at one half: a pixel is leaf when the leaf covers most of it (stalk included, shadow excluded).
    """
    size = image_px * _SS
    spec, src = CLASS_BY_NAME[class_name], SOURCES[source]
    subject_rng = np.random.default_rng([seed, 1, uid])
    pose_rng = np.random.default_rng([seed, 2, uid])
    shot_rng = np.random.default_rng([seed, 3, uid, shot])
    layer, alpha = _draw_subject(subject_rng, spec, size)
    angle = pose_rng.uniform(0, 2 * np.pi)
    scale = pose_rng.uniform(0.62, 1.0)
    shift = pose_rng.uniform(-0.13, 0.13, 2) * size
    lighting = None
    if reshot not in ("moved", "relit", "background"):
        raise ValueError(f"unknown re-shot kind {reshot!r}: use moved, relit or background")
    if shot and reshot == "moved":
        angle += math.radians(shot_rng.choice([-1, 1]) * shot_rng.uniform(3, 8))
        shift = shift + shot_rng.uniform(-1, 1, 2) * 0.04 * size
        scale *= shot_rng.uniform(0.97, 1.03)
    elif shot:
        angle += math.radians(shot_rng.choice([-1, 1]) * shot_rng.uniform(0.5, 3))
        shift = shift + shot_rng.uniform(-1, 1, 2) * 0.015 * size
    if shot and reshot == "relit":
        darker = shot_rng.random() < 0.5
        lighting = float(shot_rng.uniform(0.7, 0.8) if darker else shot_rng.uniform(1.2, 1.3))
    # A re-shot keeps the backdrop's layout (same bench, same spot) but not its noise or lighting.
    bg = _background(pose_rng, src, size)
    if shot and reshot == "background":
        # Another sheet of the same backdrop: a shade 18-32 levels lighter or darker, slightly tinted.
        shade = shot_rng.choice([-1, 1]) * shot_rng.uniform(18, 32) + shot_rng.uniform(-6, 6, 3)
        bg += shade.astype(np.float32)

    placed, alpha_t = place_subject(layer, alpha, angle, scale, shift, size)
    if src.shadow > 0:
        # The subject's own silhouette, shifted down-right and blurred: light from the top left.
        off = max(1, round(0.025 * size))
        silhouette = Image.new("L", (size, size), 0)
        silhouette.paste(alpha_t, (off, off))
        shadow = np.asarray(silhouette.filter(ImageFilter.GaussianBlur(0.02 * size)), dtype=np.float32) / 255
        bg *= (1 - src.shadow * shadow)[..., None]
    background = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    composed = Image.composite(placed.convert("RGB"), background, alpha_t)
    small = composed.resize((image_px, image_px), Image.Resampling.LANCZOS)
    image = _finish(shot_rng, src, small, lighting or float(shot_rng.uniform(0.95, 1.05)))
    return image, downsample_mask(alpha_t, image_px)


def place_subject(layer: Image.Image, alpha: Image.Image, angle: float, scale: float, shift: np.ndarray,
                  size: int) -> tuple[Image.Image, Image.Image]:
    """The subject rotated, scaled and shifted on the canvas, and its alpha there.

    One affine resample for all three (PIL wants the output-to-input mapping).  Bilinear is enough:
    the canvas is downsampled 2x with a Lanczos filter afterwards.
    """
    c, s = math.cos(angle) / scale, math.sin(angle) / scale
    ox, oy = size / 2 + shift[0], size / 2 + shift[1]
    coeffs = (c, s, size / 2 - c * ox - s * oy, -s, c, size / 2 + s * ox - c * oy)
    layer.putalpha(alpha)
    placed = layer.transform((size, size), Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR)
    return placed, placed.getchannel("A")


def downsample_mask(alpha: Image.Image, image_px: int) -> np.ndarray:
    """A supersampled alpha as a boolean mask at the output size (area average, cut at one half)."""
    return np.asarray(alpha.resize((image_px, image_px), Image.Resampling.BOX)) >= 128
