"""The background-robust regime: lab leaves cut out by their masks and pasted on other backgrounds.

Two parts, both deterministic:

* :func:`build_pool` — the backgrounds, made once per run from the profile's seed and *train* photos
  only (never a validation, test or field photo): procedural clutter (OpenCV shapes on a colour,
  defocused), scikit-image's bundled ``grass`` and ``gravel`` textures tinted, blurred crops of lab
  leaves, solid colours and linear gradients.  The pool is written to the run folder and its SHA-256 is
  part of the trained models' configuration fingerprint.
* :class:`BackgroundPaste` — per training sample, drawn from the sample's own generator (so a resumed
  run reproduces an uninterrupted one): the leaf, scaled to a size in the frame and moved, is pasted
  with a feathered edge on a pool background, then the light, white balance, gamma and focus change as
  they do between a lab bench and an orchard.  The ordinary augmentation (:mod:`.augment`) runs after.

Why OpenCV for the pixel work (warpAffine, GaussianBlur, drawing): it is what the masks and composites
of chapter 10 use, and it works on the HWC uint8 squares the training cache holds.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

import cv2
import numpy as np
import torch

from ...core.config import dataclass_from_section

KINDS: tuple[str, ...] = ("clutter", "texture", "leaf_blur", "solid", "gradient")
TEXTURES: tuple[str, ...] = ("grass", "gravel")   # scikit-image's bundled grey textures
N_DRAWS = 16                                      # uniforms per sample, fixed (see augment.N_DRAWS)


class BackgroundConfigError(ValueError):
    """The ``training.background_robust`` section has an unknown key or an impossible value."""


def _pair(value: Any) -> tuple[float, float]:
    return (float(value[0]), float(value[1]))


@dataclass(frozen=True)
class RobustParams:
    """Every choice of the regime (profile ``training.background_robust``); sizes are shares of the side."""

    pool_seed: int = 0
    clutter: int = 48                                  # backgrounds of each kind in the pool
    texture: int = 48
    leaf_blur: int = 48
    solid: int = 16
    gradient: int = 16
    clutter_shapes: tuple[int, int] = (12, 40)         # ellipses, branches and polygons per clutter image
    clutter_defocus: tuple[float, float] = (0.0, 0.03)  # Gaussian sigma of the whole clutter image
    tint: tuple[float, float] = (0.3, 0.8)             # share of the tint colour over a grey texture
    texture_crop: tuple[float, float] = (0.25, 1.0)    # side of the texture crop, share of the texture
    leaf_blur_sigma: tuple[float, float] = (0.03, 0.08)
    leaf_blur_crop: tuple[float, float] = (0.35, 0.7)  # side of the crop round a lab leaf
    paste_p: float = 0.8                               # share of samples whose leaf is pasted
    min_leaf_share: float = 0.02                       # a mask covering less of the photo is not pasted
    leaf_scale: tuple[float, float] = (0.55, 1.0)      # leaf size in the frame, relative to the lab photo
    feather: float = 0.01                              # sigma of the softened mask edge
    photometric_p: float = 0.8                         # share of pasted samples that get the field look
    light: tuple[float, float] = (0.6, 1.3)            # overall brightness gain
    gamma: tuple[float, float] = (0.75, 1.35)
    white_balance: float = 0.15                        # per-channel gain drawn from 1 +- this
    blur_p: float = 0.3
    blur_sigma: tuple[float, float] = (0.003, 0.012)

    @classmethod
    def from_dict(cls, section: dict[str, Any] | None) -> RobustParams:
        params = dataclass_from_section(cls, section, "training.background_robust", BackgroundConfigError)
        params.validate()
        return params

    def validate(self) -> None:
        for name in ("paste_p", "photometric_p", "blur_p", "min_leaf_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BackgroundConfigError(f"training.background_robust.{name} is a share in [0, 1], "
                                            f"got {getattr(self, name)}")
        if self.pool_size() < 1:
            raise BackgroundConfigError("training.background_robust: the pool would be empty; give at "
                                        f"least one background of a kind ({', '.join(KINDS)})")
        for name in ("clutter_shapes", "clutter_defocus", "tint", "texture_crop", "leaf_blur_sigma",
                     "leaf_blur_crop", "leaf_scale", "light", "gamma", "blur_sigma"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise BackgroundConfigError(f"training.background_robust.{name} needs 0 <= low <= high, "
                                            f"got {(low, high)}")
        if not (0 < self.leaf_scale[0] and self.leaf_scale[1] <= 1.5):
            raise BackgroundConfigError(f"training.background_robust.leaf_scale must lie in (0, 1.5], "
                                        f"got {self.leaf_scale}")

    def pool_size(self) -> int:
        return sum(int(getattr(self, kind)) for kind in KINDS)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# --------------------------------------------------------------------------- the pool
def _colour(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(0, 256, 3))


def _defocus(image: np.ndarray, sigma: float) -> np.ndarray:
    return cv2.GaussianBlur(image, (0, 0), sigma) if sigma > 0.3 else image


def clutter(rng: np.random.Generator, side: int, params: RobustParams) -> np.ndarray:
    """Overlapping ellipses, branch-like lines and polygons in random colours on a random colour."""
    image = np.full((side, side, 3), _colour(rng), np.uint8)
    for _ in range(int(rng.integers(params.clutter_shapes[0], params.clutter_shapes[1] + 1))):
        colour, kind = _colour(rng), rng.integers(0, 3)
        centre = tuple(int(v) for v in rng.integers(0, side, 2))
        if kind == 0:
            axes = tuple(int(v) for v in rng.integers(max(1, side // 30), max(2, side // 4), 2))
            cv2.ellipse(image, centre, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
        elif kind == 1:
            end = tuple(int(v) for v in rng.integers(0, side, 2))
            cv2.line(image, centre, end, colour, int(rng.integers(1, max(2, side // 20))), cv2.LINE_AA)
        else:
            points = rng.integers(0, side, (int(rng.integers(3, 7)), 2)).astype(np.int32)
            cv2.fillPoly(image, [points], colour, cv2.LINE_AA)
    return _defocus(image, rng.uniform(*params.clutter_defocus) * side)


def texture(rng: np.random.Generator, side: int, params: RobustParams,
            sources: dict[str, np.ndarray]) -> np.ndarray:
    """A random crop of a grey scikit-image texture, resized, tinted with a random colour."""
    grey = sources[TEXTURES[int(rng.integers(0, len(TEXTURES)))]]
    crop = max(8, round(rng.uniform(*params.texture_crop) * min(grey.shape)))
    top, left = (int(rng.integers(0, n - crop + 1)) for n in grey.shape)
    patch = cv2.resize(grey[top : top + crop, left : left + crop], (side, side), interpolation=cv2.INTER_AREA)
    tinted = patch[..., None].astype(np.float32) / 255.0 * np.asarray(_colour(rng), np.float32)
    share = rng.uniform(*params.tint)
    out = share * tinted + (1 - share) * patch[..., None].astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


def leaf_blur(rng: np.random.Generator, side: int, params: RobustParams, square: np.ndarray,
              mask: np.ndarray) -> np.ndarray:
    """A crop round a lab leaf, enlarged and defocused: leaves behind the leaf, as in an orchard."""
    ys, xs = np.nonzero(mask)
    cy, cx = (int(ys.mean()), int(xs.mean())) if len(ys) else (side // 2, side // 2)
    crop = max(4, round(rng.uniform(*params.leaf_blur_crop) * side))
    top = int(np.clip(cy - crop // 2 + rng.integers(-crop // 4, crop // 4 + 1), 0, side - crop))
    left = int(np.clip(cx - crop // 2 + rng.integers(-crop // 4, crop // 4 + 1), 0, side - crop))
    patch = cv2.resize(square[top : top + crop, left : left + crop], (side, side),
                       interpolation=cv2.INTER_LINEAR)
    if rng.random() < 0.5:
        patch = cv2.flip(patch, int(rng.integers(-1, 2)))
    return _defocus(patch, rng.uniform(*params.leaf_blur_sigma) * side)


def gradient(rng: np.random.Generator, side: int) -> np.ndarray:
    """A linear blend of two random colours along a random direction."""
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / max(1, side - 1)
    t = (np.cos(angle) * (xx - 0.5) + np.sin(angle) * (yy - 0.5)) / np.sqrt(0.5) + 0.5
    a, b = (np.asarray(_colour(rng), np.float32) for _ in range(2))
    return np.clip(a + np.clip(t, 0, 1)[..., None] * (b - a), 0, 255).astype(np.uint8)


def build_pool(params: RobustParams, side: int, leaves: list[tuple[str, np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, list[str], list[str | None]]:
    """The pool: (N×side×side×3 uint8, kind per image, source row_id of each leaf_blur image or None).

    ``leaves`` are (row_id, square, mask) of *train* photos; leaf_blur backgrounds are drawn from them.
    """
    from skimage import data

    rng = np.random.default_rng(params.pool_seed)
    sources = {name: getattr(data, name)() for name in TEXTURES}
    with_leaf = [item for item in leaves if item[2].mean() >= params.min_leaf_share]
    images, kinds, origins = [], [], []
    for kind in KINDS:
        count = int(getattr(params, kind))
        if kind == "leaf_blur" and not with_leaf:
            count = 0  # no train photo with a usable mask: nothing to blur (recorded by the counts)
        for _ in range(count):
            origin = None
            if kind == "clutter":
                image = clutter(rng, side, params)
            elif kind == "texture":
                image = texture(rng, side, params, sources)
            elif kind == "leaf_blur":
                origin, square, mask = with_leaf[int(rng.integers(0, len(with_leaf)))]
                image = leaf_blur(rng, side, params, square, mask)
            elif kind == "solid":
                image = np.full((side, side, 3), _colour(rng), np.uint8)
            else:
                image = gradient(rng, side)
            images.append(image)
            kinds.append(kind)
            origins.append(origin)
    return np.stack(images), kinds, origins


def pool_bytes(images: np.ndarray, kinds: list[str], origins: list[str | None],
               spec_sha256: str = "") -> bytes:
    """The pool as one ``.npz`` file (uncompressed: identical bytes for identical pools); ``spec_sha256``
    fingerprints what it was made from (parameters, side, masks), so a rerun knows when to reuse it."""
    buffer = io.BytesIO()
    np.savez(buffer, images=images, kinds=np.asarray(kinds), origins=np.asarray([o or "" for o in origins]),
             spec_sha256=np.asarray(spec_sha256))
    return buffer.getvalue()


def load_pool(data: bytes) -> tuple[np.ndarray, list[str]]:
    with np.load(io.BytesIO(data)) as loaded:
        return loaded["images"], [str(k) for k in loaded["kinds"]]


# --------------------------------------------------------------------------- per sample
class BackgroundPaste:
    """Paste a training sample's leaf on a pool background, then apply the field look."""

    def __init__(self, params: RobustParams, pool: np.ndarray, masks: list[np.ndarray]) -> None:
        self.params, self.pool, self.masks = params, pool, masks

    def __call__(self, square: np.ndarray, row: int, generator: torch.Generator) -> np.ndarray:
        u = torch.rand(N_DRAWS, generator=generator, dtype=torch.float64).tolist()
        mask = self.masks[row]
        p = self.params
        if u[0] >= p.paste_p or mask.mean() < p.min_leaf_share:
            return square
        side = square.shape[0]
        background = self.pool[min(len(self.pool) - 1, int(u[1] * len(self.pool)))]
        if u[2] < 0.5:
            background = background[:, ::-1]
        scale = _lerp(p.leaf_scale, u[3])
        matrix = placement(mask, scale, u[4], u[5])
        leaf = cv2.warpAffine(square, matrix, (side, side), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_REFLECT)
        alpha = cv2.warpAffine(mask.astype(np.float32), matrix, (side, side), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        if p.feather > 0:
            alpha = cv2.GaussianBlur(alpha, (0, 0), max(0.3, p.feather * side))
        alpha = alpha[..., None]
        out = alpha * leaf.astype(np.float32) + (1 - alpha) * background.astype(np.float32)
        if u[6] < p.photometric_p:
            out = field_look(out, p, u[7:13], side)
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _lerp(bounds: tuple[float, float], u: float) -> float:
    return bounds[0] + (bounds[1] - bounds[0]) * u


def placement(mask: np.ndarray, scale: float, u_x: float, u_y: float) -> np.ndarray:
    """The 2×3 affine matrix that scales the leaf's bounding box by ``scale`` and moves it to a random
    place where it stays inside the frame (centred when it cannot)."""
    side = mask.shape[0]
    ys, xs = np.nonzero(mask)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    target = []
    for low, high, u in ((x0, x1, u_x), (y0, y1, u_y)):
        extent = (high - low) * scale
        room = side - extent
        target.append(side / 2 if room <= 0 else extent / 2 + u * room)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return np.array([[scale, 0, target[0] - scale * cx], [0, scale, target[1] - scale * cy]], np.float32)


def field_look(image: np.ndarray, p: RobustParams, u: list[float], side: int) -> np.ndarray:
    """White balance (per-channel gains), light (overall gain), gamma, and sometimes defocus."""
    gains = np.array([1 + p.white_balance * (2 * v - 1) for v in u[0:3]], np.float32) * _lerp(p.light, u[3])
    out = np.clip(image * gains, 0, 255)
    gamma = _lerp(p.gamma, u[4])
    out = 255.0 * (out / 255.0) ** gamma
    if u[5] < p.blur_p:
        sigma = _lerp(p.blur_sigma, u[5] / max(p.blur_p, 1e-9)) * side
        out = _defocus(out.astype(np.float32), sigma)
    return out
