"""The subject's canvas and its shape: drawing primitives, the leaf-local :class:`_Canvas`, the leaf
outlines (toothed profiles, palmate) and the banana hand.

Shared by the lab renderer (:mod:`.drawing`), the lesion patterns (:mod:`.lesions`) and the field
renderer (:mod:`.field`); kept apart from the photograph around the subject (backdrop, light, noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .world import CropSpec

_SS = 2  # supersampling: draw at twice the size and downsample once, for anti-aliased edges


def _smooth(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Low-frequency noise in about [-2, 2]: a random coarse grid, bicubic-upsampled."""
    grid = rng.standard_normal((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(grid).resize((size, size), Image.Resampling.BICUBIC))


def _mix(a: tuple[int, ...], b: tuple[int, ...], t: float) -> tuple[int, int, int]:
    return tuple(int(round(x + (y - x) * t)) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _jitter(rng: np.random.Generator, colour: tuple[int, ...], amount: float) -> tuple[int, int, int]:
    return _jitter_many(rng, colour, amount, 1)[0]


def _jitter_many(rng: np.random.Generator, colour: tuple[int, ...], amount: float,
                 n: int) -> list[tuple[int, int, int]]:
    shifted = np.clip(np.array(colour) + rng.uniform(-amount, amount, (n, 3)), 0, 255).astype(int)
    return [tuple(row) for row in shifted.tolist()]


def _blob(rng: np.random.Generator, x: float, y: float, r: float, irregular: float = 0.25,
          n: int = 14, aspect: float = 1.0) -> list[tuple[float, float]]:
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False) + rng.uniform(0, 2 * np.pi / n)
    radii = r * (1 + irregular * rng.uniform(-1, 1, n))
    return list(zip((x + radii * np.cos(angles)).tolist(), (y + aspect * radii * np.sin(angles)).tolist(),
                    strict=True))


class _Canvas:
    """The subject (leaf or fruit) in leaf-local coordinates: colour image, alpha and shape facts."""

    def __init__(self, size: int, colour: tuple[int, int, int]):
        self.size = size
        self.colour = colour
        # Filled with the subject colour everywhere so rotation never drags in a dark fringe.
        self.rgb = Image.new("RGB", (size, size), colour)
        self.alpha = Image.new("L", (size, size), 0)
        self.outline: np.ndarray = np.zeros((0, 2))
        self.centre = (size / 2, size / 2)
        self.frame: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
        self._inside: np.ndarray | None = None

    @property
    def draw(self) -> ImageDraw.ImageDraw:
        return ImageDraw.Draw(self.rgb)

    def mask(self) -> tuple[Image.Image, ImageDraw.ImageDraw]:
        layer = Image.new("L", (self.size, self.size), 0)
        return layer, ImageDraw.Draw(layer)

    def tint(self, colour: tuple[int, int, int], mask: Image.Image, blur: float = 0.0) -> None:
        if blur > 0:
            mask = mask.filter(ImageFilter.GaussianBlur(blur))
        self.rgb = Image.composite(Image.new("RGB", self.rgb.size, colour), self.rgb, mask)

    def tint_array(self, colour: tuple[int, int, int], weight: np.ndarray) -> None:
        self.tint(colour, Image.fromarray((np.clip(weight, 0, 1) * 255).astype(np.uint8)))

    @property
    def scale(self) -> float:
        """Characteristic size of the subject: square root of its area."""
        return math.sqrt(max(1, int(np.count_nonzero(self.inside_mask()))))

    def inside_mask(self) -> np.ndarray:
        if self._inside is None:
            self._inside = np.asarray(self.alpha) > 127
        return self._inside

    def inside(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ys, xs = np.nonzero(self.inside_mask())
        pick = rng.integers(0, len(xs), n)
        return np.stack([xs[pick], ys[pick]], axis=1).astype(float)

    def near_margin(self, rng: np.random.Generator, n: int) -> np.ndarray:
        vertices = self.outline[rng.integers(0, len(self.outline), n)]
        inward = rng.uniform(0.05, 0.3, (n, 1))
        return vertices + (np.array(self.centre) - vertices) * inward


def _tooth(x: np.ndarray) -> np.ndarray:
    return (x % 1.0) ** 1.5 - 0.4


def _profile(shape: str, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if shape == "ovate":
        return np.sin(np.pi * t ** rng.uniform(0.72, 0.88)) ** 0.85
    if shape == "elliptic":
        return np.sin(np.pi * t ** rng.uniform(0.85, 1.0)) ** 0.75
    if shape == "cordate":
        return np.sin(np.pi * t ** rng.uniform(0.55, 0.68)) ** 0.7
    return (1 - t ** 2.5) ** 0.9 * (0.72 + 0.28 * np.minimum(1, t / 0.2))  # strap (corn)


def _draw_profile_leaf(rng: np.random.Generator, cv: _Canvas, crop: CropSpec, distorted: bool) -> None:
    S = cv.size
    length = S * crop.length * rng.uniform(0.9, 1.05)
    half = S * crop.width / 2 * rng.uniform(0.85, 1.15)
    bend = rng.uniform(-0.07, 0.07)
    t = np.linspace(0, 1, 90)
    profile = _profile(crop.shape, t, rng)
    wobble = crop.wobble * (2.5 if distorted else 1.0)
    sides = []
    for _ in range(2):
        teeth = crop.tooth_amp * rng.uniform(0.6, 1.4) * _tooth(crop.teeth * rng.uniform(0.85, 1.15) * t
                                                                 + rng.uniform(0, 1))
        slow = np.interp(t, np.linspace(0, 1, 6), rng.normal(0, wobble, 6))
        sides.append(half * profile * (1 + teeth + slow))
    y0 = S / 2 + length / 2
    ys = y0 - t * length
    xc = S / 2 + bend * length * np.sin(np.pi * t)
    right = np.stack([xc + sides[0], ys], axis=1)
    left = np.stack([xc - sides[1], ys], axis=1)[::-1]
    cv.outline = np.concatenate([right, left])
    cv.centre = (S / 2, S / 2)
    draw_alpha = ImageDraw.Draw(cv.alpha)
    draw_alpha.polygon([tuple(v) for v in cv.outline.tolist()], fill=255)
    draw = cv.draw
    vein = _mix(cv.colour, (206, 226, 150), 0.35)
    midrib = [(float(x), float(y)) for x, y in zip(xc[:-3], ys[:-3], strict=True)]
    if crop.shape == "strap":
        for frac in (-0.7, -0.35, 0.35, 0.7):
            line = [(float(x + frac * w), float(y)) for x, y, w in zip(xc, ys, sides[0], strict=True)][:-8]
            draw.line(line, fill=_mix(cv.colour, vein, 0.5), width=max(1, S // 128))
    else:
        stalk = _mix(cv.colour, (120, 96, 50), 0.35)
        stalk_end = (float(xc[0] + rng.uniform(-0.04, 0.04) * S), y0 + 0.11 * length)
        for dst, fill in ((cv.alpha, 255), (cv.rgb, stalk)):
            ImageDraw.Draw(dst).line([(float(xc[0]), y0), stalk_end], fill=fill, width=max(2, int(0.022 * S)))
        draw = cv.draw
        positions = np.linspace(0.14, 0.82, crop.laterals) + rng.uniform(-0.03, 0.03, crop.laterals)
        for k, tk in enumerate(positions):
            i0, i1 = int(tk * 89), min(89, int((tk + 0.12) * 89))
            for side, sign in ((sides[0], 1), (sides[1], -1)):
                draw.line([(float(xc[i0]), float(ys[i0])),
                           (float(xc[i1] + sign * 0.85 * side[i1]), float(ys[i1]))],
                          fill=vein, width=max(1, S // 150 + (k == 0)))
    draw.line(midrib, fill=vein, width=max(1, int(0.012 * S)))

    def frame(xs: np.ndarray, ys_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tt = np.clip((y0 - ys_) / length, 0, 1)
        centre = S / 2 + bend * length * np.sin(np.pi * tt)
        width = np.maximum(half * np.interp(tt, t, profile), 1e-3)
        return tt, (xs - centre) / width

    cv.frame = frame


def _draw_palmate_leaf(rng: np.random.Generator, cv: _Canvas, distorted: bool) -> None:
    S = cv.size
    radius = S * 0.36 * rng.uniform(0.88, 1.08)
    cx, cy = S / 2, S / 2 + 0.06 * S
    phi = np.linspace(-np.pi, np.pi, 240, endpoint=False)
    centres = np.array([0.0, 1.2, -1.2, 2.25, -2.25]) + rng.uniform(-0.1, 0.1, 5)
    heights = np.array([1.0, 0.9, 0.9, 0.72, 0.72]) * rng.uniform(0.9, 1.1, 5)
    widths = 0.55 * rng.uniform(0.85, 1.15, 5)
    delta = (phi[None, :] - centres[:, None] + np.pi) % (2 * np.pi) - np.pi
    lobes = (heights[:, None] * np.exp(-(delta / widths[:, None]) ** 2)).max(axis=0)
    sinus = 1 - 0.5 * np.exp(-((np.abs(phi) - np.pi) / 0.28) ** 2)
    teeth = 0.035 * rng.uniform(0.6, 1.4) * _tooth(phi * 26 / (2 * np.pi) + rng.uniform(0, 1))
    slow = np.interp(phi, np.linspace(-np.pi, np.pi, 8), rng.normal(0, 0.06 if distorted else 0.025, 8))
    r = radius * (0.68 + 0.32 * lobes) * sinus * (1 + teeth + slow)
    cv.outline = np.stack([cx + r * np.sin(phi), cy - r * np.cos(phi)], axis=1)
    cv.centre = (cx, cy)
    ImageDraw.Draw(cv.alpha).polygon([tuple(v) for v in cv.outline.tolist()], fill=255)
    stalk = _mix(cv.colour, (150, 90, 60), 0.45)
    tip = (cx + rng.uniform(-0.05, 0.05) * S, cy + 0.62 * radius)
    for dst, fill in ((cv.alpha, 255), (cv.rgb, stalk)):
        ImageDraw.Draw(dst).line([(cx, cy), tip], fill=fill, width=max(2, int(0.022 * S)))
    draw = cv.draw
    vein = _mix(cv.colour, (206, 226, 150), 0.35)
    for c, h in zip(centres, heights, strict=True):
        reach = radius * (0.68 + 0.32 * h) * 0.88
        draw.line([(cx, cy), (cx + reach * math.sin(c), cy - reach * math.cos(c))], fill=vein,
                  width=max(1, int(0.011 * S)))


def _draw_bananas(rng: np.random.Generator, cv: _Canvas) -> None:
    """A hand of one to three banana fingers: concentric arcs whose stalks meet at one crown."""
    S = cv.size
    fingers = int(rng.integers(1, 4))
    bend_radius = S * rng.uniform(0.55, 0.8)
    span = S * rng.uniform(0.58, 0.7) / bend_radius
    width = S * rng.uniform(0.13, 0.17)
    arc_x, arc_y = S / 2, S / 2 - bend_radius
    crown_angle = -span / 2 - 0.14
    crown = (arc_x + bend_radius * math.sin(crown_angle), arc_y + bend_radius * math.cos(crown_angle))
    t = np.linspace(0, 1, 60)
    angle = -span / 2 + span * t
    normal = np.stack([np.sin(angle), np.cos(angle)], axis=1)
    green = _mix(cv.colour, (120, 160, 50), 0.55)
    draw, alpha = cv.draw, ImageDraw.Draw(cv.alpha)
    outlines, stalk_width = [], max(2, int(width * 0.3))
    for f in range(fingers):
        rf = bend_radius + (f - (fingers - 1) / 2) * width * 0.8
        centre = np.stack([arc_x + rf * np.sin(angle), arc_y + rf * np.cos(angle)], axis=1)
        w = width / 2 * np.sqrt(np.clip(1 - (2 * t - 1) ** 6, 0, 1)) * (0.85 + 0.15 * np.sin(np.pi * t))
        edge = normal * w[:, None]
        outline = np.concatenate([centre + edge, (centre - edge)[::-1]])
        outlines.append(outline)
        body = _mix(cv.colour, (0, 0, 0), 0.08 * (fingers - 1 - f))  # back fingers in shade
        alpha.polygon([tuple(v) for v in outline.tolist()], fill=255)
        draw.polygon([tuple(v) for v in outline.tolist()], fill=body)
        base = np.concatenate([centre[:8] + edge[:8], (centre[:8] - edge[:8])[::-1]])
        draw.polygon([tuple(v) for v in base.tolist()], fill=_mix(body, green, 0.6))
        ridges = ((0.4, _mix(body, (150, 120, 30), 0.35)), (-0.25, _mix(body, (250, 240, 170), 0.4)))
        for offset, colour in ridges:
            ridge = centre + normal * (offset * w)[:, None]
            draw.line([tuple(v) for v in ridge[4:-4].tolist()], fill=colour, width=max(1, S // 128))
        for dst, fill in ((alpha, 255), (draw, (118, 112, 52))):
            dst.line([tuple(centre[0]), crown], fill=fill, width=stalk_width)
        tx, ty = centre[-1]
        r = width * 0.12
        draw.ellipse([tx - r, ty - r, tx + r, ty + r], fill=(72, 58, 34))
    r = stalk_width * 0.9
    for dst, fill in ((alpha, 255), (draw, (96, 90, 44))):
        dst.ellipse([crown[0] - r, crown[1] - r, crown[0] + r, crown[1] + r], fill=fill)
    cv.outline = np.concatenate(outlines)
    cv.centre = (S / 2, S / 2)
