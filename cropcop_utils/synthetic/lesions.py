"""The lesion patterns: one per condition (:data:`PATTERNS`), painted on the subject's canvas.

Each pattern draws a condition's cues (spots and halos, mites and webbing, mosaic, rust pustules,
mildew, rot) in leaf-local coordinates; the subject's alpha clips them later.  Separate from the shapes
(:mod:`.leaves`) so a condition's look can be read, and added, in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw

from .leaves import _blob, _Canvas, _jitter, _jitter_many, _smooth


# -- lesion patterns, one per condition, drawn in leaf-local coordinates and clipped by the alpha later
def _spots(rng: np.random.Generator, cv: _Canvas, n: int, rmin: float, rmax: float,
           at: np.ndarray | None = None) -> list[tuple[float, float, float]]:
    centres = cv.inside(rng, n) if at is None else at
    return [(float(x), float(y), cv.scale * float(rng.uniform(rmin, rmax))) for x, y in centres]


def _halo(rng: np.random.Generator, cv: _Canvas, spots: list, colour: tuple[int, int, int], grow: float,
          blur: float) -> None:
    mask, draw = cv.mask()
    for x, y, r in spots:
        draw.polygon(_blob(rng, x, y, r * grow, 0.3), fill=255)
    cv.tint(colour, mask, blur=blur * cv.size)


def _fill(rng: np.random.Generator, cv: _Canvas, spots: list, colour: tuple[int, int, int],
          shrink: float = 1.0, irregular: float = 0.25, blur: float = 0.0) -> None:
    mask, draw = cv.mask()
    for x, y, r in spots:
        draw.polygon(_blob(rng, x, y, r * shrink, irregular), fill=255)
    cv.tint(colour, mask, blur=blur * cv.size)


def _dots(rng: np.random.Generator, cv: _Canvas, centres: np.ndarray, radius: float,
          colour: tuple[int, int, int]) -> None:
    draw = cv.draw
    radii = (radius * rng.uniform(0.6, 1.3, len(centres))).tolist()
    fills = _jitter_many(rng, colour, 12, len(centres))
    for (x, y), r, fill in zip(centres.tolist(), radii, fills, strict=True):
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)


def _late_blight(rng: np.random.Generator, cv: _Canvas) -> None:
    n = int(rng.integers(1, 4))
    spots = _spots(rng, cv, n, 0.11, 0.2, at=cv.near_margin(rng, n))
    _halo(rng, cv, spots, _jitter(rng, (150, 160, 78), 10), 1.4, 0.02)
    _fill(rng, cv, spots, _jitter(rng, (84, 74, 48), 10), irregular=0.4, blur=0.006)
    _fill(rng, cv, spots, (58, 48, 34), shrink=0.55, irregular=0.4, blur=0.01)


def _early_blight(rng: np.random.Generator, cv: _Canvas) -> None:
    spots = _spots(rng, cv, int(rng.integers(3, 8)), 0.06, 0.1)
    _halo(rng, cv, spots, _jitter(rng, (198, 186, 70), 10), 1.65, 0.012)
    for k, shrink in enumerate((1.0, 0.76, 0.52, 0.28)):
        _fill(rng, cv, spots, (90, 60, 34) if k % 2 == 0 else (146, 108, 60), shrink=shrink, irregular=0.12)


def _spider_mites(rng: np.random.Generator, cv: _Canvas) -> None:
    cv.tint(_jitter(rng, (172, 152, 82), 8), Image.new("L", cv.rgb.size, int(255 * rng.uniform(0.25, 0.4))))
    _dots(rng, cv, cv.inside(rng, int(rng.integers(150, 350))), cv.size / 128, (224, 222, 160))
    _webbing(rng, cv, int(rng.integers(5, 10)))


def _webbing(rng: np.random.Generator, cv: _Canvas, n: int) -> None:
    """Silk threads: drawn into the alpha too, so they span the gaps between leaf edges."""
    hubs = cv.inside(rng, max(1, n // 3))
    width = max(1, cv.size // 96)
    draw, alpha = cv.draw, ImageDraw.Draw(cv.alpha)
    for k in range(n):
        hx, hy = hubs[k % len(hubs)]
        angle, reach = rng.uniform(0, 2 * np.pi), cv.scale * rng.uniform(0.3, 0.7)
        end = (hx + reach * math.cos(angle), hy + reach * math.sin(angle))
        draw.line([(hx, hy), end], fill=(238, 238, 230), width=width)
        alpha.line([(hx, hy), end], fill=180, width=width)
    cv._inside = None


def _mosaic(rng: np.random.Generator, cv: _Canvas) -> None:
    field_ = _smooth(rng, cv.size, int(rng.integers(5, 9)))
    cv.tint_array(_jitter(rng, (176, 198, 84), 8), np.clip((field_ - 0.1) * 2.5, 0, 1) * 0.8)
    cv.tint_array((36, 86, 30), np.clip((-field_ - 0.4) * 2.5, 0, 1) * 0.55)


def _scab(rng: np.random.Generator, cv: _Canvas) -> None:
    # Olive, velvety (soft-edged) spots with a dark centre, over a faint chlorotic ring.
    spots = _spots(rng, cv, int(rng.integers(5, 15)), 0.035, 0.07)
    _halo(rng, cv, spots, (132, 150, 70), 1.45, 0.012)
    _fill(rng, cv, spots, _jitter(rng, (92, 90, 46), 8), irregular=0.4, blur=0.01)
    _fill(rng, cv, spots, (46, 44, 28), shrink=0.55, irregular=0.4, blur=0.006)


def _cedar_rust(rng: np.random.Generator, cv: _Canvas) -> None:
    spots = _spots(rng, cv, int(rng.integers(3, 8)), 0.045, 0.08)
    _halo(rng, cv, spots, (222, 194, 64), 1.5, 0.012)
    _fill(rng, cv, spots, _jitter(rng, (198, 72, 32), 8), irregular=0.15)
    _fill(rng, cv, spots, _jitter(rng, (246, 174, 44), 8), shrink=0.7, irregular=0.15)
    for x, y, r in spots:
        teliospores = np.array([[x, y]]) + rng.uniform(-0.35 * r, 0.35 * r, (3, 2))
        _dots(rng, cv, teliospores, cv.size / 110, (70, 36, 24))


def _powdery_mildew(rng: np.random.Generator, cv: _Canvas) -> None:
    spots = _spots(rng, cv, int(rng.integers(3, 7)), 0.1, 0.2)
    _fill(rng, cv, spots, (232, 234, 226), irregular=0.45, blur=0.025)
    _dots(rng, cv, cv.inside(rng, 120), cv.size / 150, (236, 236, 230))


def _black_rot(rng: np.random.Generator, cv: _Canvas) -> None:
    spots = _spots(rng, cv, int(rng.integers(3, 9)), 0.045, 0.085)
    _fill(rng, cv, spots, _jitter(rng, (72, 42, 26), 6), irregular=0.12)
    _fill(rng, cv, spots, _jitter(rng, (172, 126, 78), 10), shrink=0.8, irregular=0.12)
    for x, y, r in spots:
        pts = np.array([[x, y]]) + rng.uniform(-0.55 * r, 0.55 * r, (int(rng.integers(4, 11)), 2))
        _dots(rng, cv, pts, cv.size / 140, (34, 24, 18))


def _erineum_mites(rng: np.random.Generator, cv: _Canvas) -> None:
    spots = _spots(rng, cv, int(rng.integers(3, 7)), 0.07, 0.13)
    _halo(rng, cv, spots, (170, 182, 92), 1.4, 0.02)
    _fill(rng, cv, spots, _jitter(rng, (216, 200, 160), 8), irregular=0.45, blur=0.008)
    _dots(rng, cv, cv.inside(rng, int(rng.integers(40, 100))), cv.size / 140, (206, 206, 150))


def _bean_fungal(rng: np.random.Generator, cv: _Canvas) -> None:
    """A broad label: rust pustules, angular leaf spot or anthracnose streaks, one per image."""
    variant = int(rng.integers(0, 3))
    if variant == 0:
        spots = _spots(rng, cv, int(rng.integers(25, 60)), 0.012, 0.022)
        _halo(rng, cv, spots, (194, 182, 72), 1.9, 0.006)
        _fill(rng, cv, spots, _jitter(rng, (142, 62, 32), 8), irregular=0.2)
    elif variant == 1:
        spots = _spots(rng, cv, int(rng.integers(6, 15)), 0.03, 0.055)
        _halo(rng, cv, spots, (182, 178, 84), 1.4, 0.01)
        mask, draw = cv.mask()
        for x, y, r in spots:
            draw.polygon(_blob(rng, x, y, r, 0.45, n=5), fill=255)
        cv.tint(_jitter(rng, (120, 98, 66), 8), mask)
    else:
        draw = cv.draw
        for x, y in cv.inside(rng, int(rng.integers(6, 13))):
            angle, reach = rng.uniform(0, 2 * np.pi), cv.scale * rng.uniform(0.08, 0.16)
            draw.line([(x, y), (x + reach * math.cos(angle), y + reach * math.sin(angle))],
                      fill=_jitter(rng, (98, 40, 30), 8), width=max(2, int(0.014 * cv.size)))


def _common_rust(rng: np.random.Generator, cv: _Canvas) -> None:
    draw = cv.draw
    centres = cv.inside(rng, int(rng.integers(40, 110)))
    n = len(centres)
    widths = (cv.scale * rng.uniform(0.012, 0.02, n)).tolist()
    heights = rng.uniform(2.0, 3.0, n).tolist()  # elongated along the leaf axis, as rust pustules are
    fills = _jitter_many(rng, (160, 80, 34), 10, n)
    for (x, y), w, k, fill in zip(centres.tolist(), widths, heights, fills, strict=True):
        h = w * k
        draw.ellipse([x - w, y - h, x + w, y + h], fill=fill)
        draw.ellipse([x - w / 2, y - h / 2, x + w / 2, y + h / 2], fill=(104, 46, 22))


def _nutrient_deficiency(rng: np.random.Generator, cv: _Canvas) -> None:
    """A broad label: nitrogen V from the tip, potassium margin firing, or interveinal striping."""
    ys, xs = np.mgrid[0:cv.size, 0:cv.size].astype(np.float32)
    t, s = cv.frame(xs, ys) if cv.frame else (ys / cv.size, xs / cv.size)
    variant = int(rng.integers(0, 3))
    if variant == 0:
        t0 = rng.uniform(0.3, 0.55)
        weight = ((t > t0) & (np.abs(s) < (t - t0) / (1 - t0) * 1.2)).astype(np.float32)
        cv.tint(_jitter(rng, (214, 198, 84), 8), Image.fromarray((weight * 230).astype(np.uint8)),
                blur=0.01 * cv.size)
    elif variant == 1:
        cv.tint_array(_jitter(rng, (198, 164, 72), 8), ((np.abs(s) > 0.6) & (t > 0.25)) * 0.9)
        cv.tint_array((140, 100, 52), ((np.abs(s) > 0.85) & (t > 0.3)) * 0.9)
    else:
        stripes = np.cos(s * np.pi * rng.uniform(3.5, 5.5)) > 0.3
        cv.tint_array(_jitter(rng, (208, 206, 112), 8), (stripes & (t > 0.1)) * 0.75)


def _disease_fruit(rng: np.random.Generator, cv: _Canvas) -> None:
    cv.tint(_jitter(rng, (172, 132, 62), 8), Image.new("L", cv.rgb.size, int(255 * rng.uniform(0.1, 0.25))))
    spots = _spots(rng, cv, int(rng.integers(2, 6)), 0.06, 0.12)
    _fill(rng, cv, spots, _jitter(rng, (70, 50, 30), 8), irregular=0.45, blur=0.01)
    _dots(rng, cv, cv.inside(rng, int(rng.integers(30, 90))), cv.size / 120, (52, 36, 22))


PATTERNS: dict[str, Callable[[np.random.Generator, _Canvas], None]] = {
    "healthy": lambda rng, cv: None,
    "healthy_fruit": lambda rng, cv: None,
    "late_blight": _late_blight,
    "early_blight": _early_blight,
    "spider_mites": _spider_mites,
    "mosaic_virus": _mosaic,
    "scab": _scab,
    "cedar_rust": _cedar_rust,
    "powdery_mildew": _powdery_mildew,
    "black_rot": _black_rot,
    "mites": _erineum_mites,
    "fungal_disease": _bean_fungal,
    "common_rust": _common_rust,
    "nutrient_deficiency": _nutrient_deficiency,
    "disease_fruit": _disease_fruit,
}
