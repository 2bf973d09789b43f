"""How a planted copy differs from its original: the kinds of copy and the pixels each produces.

:data:`TRANSFORMS` (hash-near and geometric) and :data:`RESHOT_KINDS` name the near-duplicate and re-shot
kinds, :data:`PAIR_KINDS` every kind of planted pair.  ``_derive`` makes a near duplicate from its
parent's file as a re-saving tool would, ``_derive_mask`` gives its true leaf mask under the same
geometry (``_reframe``), and ``_encode`` / ``_store_rotated`` write a JPEG with the source's EXIF and
orientation.  Separate from :mod:`.plan` (which copies are made) and :mod:`.generator` (writing them).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from .world import SOURCES

# Near-duplicate transforms: the first four keep the picture's geometry close enough for a perceptual
# hash; the rest are the copies an augmenting previous owner leaves beside the original (flips, quarter
# and arbitrary turns, shear, perspective, elastic warps, crops of 10-35 %, rescaling of the content).
HASH_NEAR_TRANSFORMS = ("reencode", "resize", "crop", "brightness")
GEOMETRIC_TRANSFORMS = ("hflip", "vflip", "rot90", "rotate", "shear", "perspective", "elastic", "crop_large",
                        "scale")
TRANSFORMS = (*HASH_NEAR_TRANSFORMS, *GEOMETRIC_TRANSFORMS)
RESHOT_KINDS = ("moved", "relit", "background")  # how a re-shot differs from its family's first photo
PAIR_KINDS = ("byte_copy", *TRANSFORMS, "reshot", *(f"reshot_{k}" for k in RESHOT_KINDS))


# --------------------------------------------------------------------------- encoding and transforms
def _encode(img: Image.Image, quality: int, source: str, when: str | None, orientation: int) -> bytes:
    src = SOURCES[source]
    exif = Image.Exif()
    exif[0x010F] = src.make
    exif[0x0110] = src.model
    if when:
        exif[0x0132] = when
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality, exif=exif.tobytes())
    return buffer.getvalue()


def _store_rotated(upright: Image.Image, orientation: int) -> Image.Image:
    """Pixels as a camera held sideways stores them; EXIF-aware loading (exif_transpose) undoes it."""
    if orientation == 6:
        return upright.transpose(Image.Transpose.ROTATE_90)
    if orientation == 8:
        return upright.transpose(Image.Transpose.ROTATE_270)
    return upright


def _derive(parent_bytes: bytes, transform: str, knobs: dict[str, Any]) -> Image.Image:
    """A near duplicate made from the parent FILE, as a re-saving tool would (EXIF rotation applied)."""
    with Image.open(io.BytesIO(parent_bytes)) as opened:
        upright = ImageOps.exif_transpose(opened).convert("RGB")
    edges = np.concatenate([np.asarray(upright)[[0, -1]].reshape(-1, 3),
                            np.asarray(upright)[:, [0, -1]].reshape(-1, 3)])
    img = _reframe(upright, transform, knobs, tuple(int(c) for c in edges.mean(0)))
    if transform == "brightness":
        return ImageEnhance.Brightness(img).enhance(knobs["factor"])
    return img  # reencode: same pixels, another quality


def _derive_mask(parent_mask: np.ndarray, transform: str, knobs: dict[str, Any]) -> np.ndarray:
    """The true mask of a near duplicate: the parent's mask under the same geometry."""
    layer = Image.fromarray(np.where(parent_mask, 255, 0).astype(np.uint8), mode="L")
    return np.asarray(_reframe(layer, transform, knobs, 0)) >= 128


def _perspective_coefficients(size: tuple[int, int], corners: list[float]) -> list[float]:
    """PIL's 8 PERSPECTIVE coefficients (output pixel -> input pixel) for corners moved by ``corners``
    (fractions of the side, x and y of top-left, top-right, bottom-right, bottom-left)."""
    w, h = size
    source = np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float64)
    target = source + np.array(corners, dtype=np.float64).reshape(4, 2) * [w, h]
    rows, rhs = [], []
    for (x, y), (u, v) in zip(target, source, strict=True):
        rows += [[x, y, 1, 0, 0, 0, -u * x, -u * y], [0, 0, 0, x, y, 1, -v * x, -v * y]]
        rhs += [u, v]
    return [float(c) for c in np.linalg.solve(np.array(rows), np.array(rhs))]


def _elastic(img: Image.Image, knobs: dict[str, Any]) -> Image.Image:
    """A smooth random displacement field (Simard et al. 2003), the same for an image and its mask."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    arr = np.asarray(img, dtype=np.float32)
    h, w = arr.shape[:2]
    rng = np.random.default_rng(knobs["seed"])
    shift = []
    for _ in range(2):
        field = gaussian_filter(rng.uniform(-1, 1, (h, w)), knobs["sigma"] * w)
        shift.append(field / (np.abs(field).max() + 1e-9) * knobs["alpha"] * w)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    coords = [yy + shift[0], xx + shift[1]]
    planes = arr[..., None] if arr.ndim == 2 else arr
    out = np.stack([map_coordinates(planes[..., c], coords, order=1, mode="nearest")
                    for c in range(planes.shape[-1])], axis=-1)
    out = np.clip(np.round(out), 0, 255).astype(np.uint8)
    return Image.fromarray(out[..., 0] if arr.ndim == 2 else out)


def _reframe(img: Image.Image, transform: str, knobs: dict[str, Any], fill: Any) -> Image.Image:
    """The geometry of a near-duplicate transform; reencode and brightness keep the frame.  ``fill``
    paints what a turn or warp uncovers (the edge colour for photos, 0 for masks)."""
    w, h = img.size
    bicubic = Image.Resampling.BICUBIC
    if transform == "hflip":
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if transform == "vflip":
        return img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    if transform == "rot90":
        turns = {1: Image.Transpose.ROTATE_90, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_270}
        return img.transpose(turns[knobs["quarter_turns"]])
    if transform == "rotate":
        return img.rotate(knobs["angle"], resample=bicubic, expand=False, fillcolor=fill)
    if transform == "shear":
        s = knobs["factor"]
        coeffs = (1, s, -s * h / 2, 0, 1, 0) if knobs["axis"] == "x" else (1, 0, 0, s, 1, -s * w / 2)
        return img.transform((w, h), Image.Transform.AFFINE, coeffs, bicubic, fillcolor=fill)
    if transform == "perspective":
        return img.transform((w, h), Image.Transform.PERSPECTIVE,
                             _perspective_coefficients((w, h), knobs["corners"]), bicubic, fillcolor=fill)
    if transform == "elastic":
        return _elastic(img, knobs)
    if transform == "scale":
        f, cx, cy = knobs["factor"], w / 2, h / 2
        coeffs = (1 / f, 0, cx - cx / f, 0, 1 / f, cy - cy / f)
        return img.transform((w, h), Image.Transform.AFFINE, coeffs, bicubic, fillcolor=fill)
    if transform == "resize":
        return img.resize((max(8, round(w * knobs["factor"])), max(8, round(h * knobs["factor"]))),
                          Image.Resampling.LANCZOS)
    if transform in ("crop", "crop_large"):
        box = (round(knobs["left"] * w), round(knobs["top"] * h), w - round(knobs["right"] * w),
               h - round(knobs["bottom"] * h))
        cropped = img.crop(box)
        return cropped.resize((w, h), Image.Resampling.BICUBIC) if knobs["resize_back"] else cropped
    return img
