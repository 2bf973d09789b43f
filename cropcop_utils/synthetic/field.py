"""Field photographs of the embedded corpus's classes: the same leaves, drawn as an orchard photo is taken.

What changes from the lab renderer (:mod:`cropcop_utils.synthetic.drawing`): the backdrop is cluttered
(soil, foliage, sky and bark in patches, out-of-focus leaves, a branch, sometimes a hand), the light is
uneven and coloured (dappled sun, exposure and white balance vary per photo), and the leaf is smaller
and off-centre.  The leaf itself is drawn by the lab renderer's subject code, so a class's cues are the
same; only the photograph around it changes.  Every photo comes with the leaf's true mask.

Why hand-written: as for the lab corpus, no library draws labelled field photographs offline.  All
randomness is ``numpy.random.default_rng([seed, 11, class index, k])``: its own stream, so adding the
field cohort leaves the lab corpus byte-identical.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ..core.evidence import sha256_bytes
from .drawing import _draw_subject, downsample_mask, place_subject
from .leaves import _SS, _blob, _smooth
from .world import CLASS_BY_NAME, CLASSES

FIELD_STREAM = 11  # rng stream id of field photos (the lab renderer uses 1, 2, 3)
CAMERA = ("Google", "Pixel 7")
MASKS_DIR = "masks"  # inside the field folder: masks/<class>/<stem>.png, as a user's cohort may have
# Patch colours of an orchard backdrop: soil, dry grass, foliage (light, dark), sky, bark, gravel.
PALETTE = np.array([(112, 86, 60), (150, 136, 88), (82, 118, 58), (44, 70, 38), (176, 198, 222),
                    (76, 60, 48), (132, 130, 122)], dtype=np.float32)


def _backdrop(rng: np.random.Generator, size: int) -> np.ndarray:
    """Patches of three to five palette colours blended by smooth noise, then clutter on top."""
    picks = rng.choice(len(PALETTE), int(rng.integers(3, 6)), replace=False)
    weights = np.stack([_smooth(rng, size, int(rng.integers(2, 6))) * rng.uniform(1.5, 3.0)
                        for _ in picks])
    weights = np.exp(weights - weights.max(axis=0))
    weights /= weights.sum(axis=0)
    colours = PALETTE[picks] + rng.uniform(-14, 14, (len(picks), 3)).astype(np.float32)
    bg = np.einsum("khw,kc->hwc", weights, colours)
    bg += _smooth(rng, size, int(rng.integers(16, 28)))[..., None] * 9  # fine texture
    clutter = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(clutter)
    for _ in range(int(rng.integers(3, 9))):  # other leaves, out of focus once blurred below
        x, y = rng.uniform(0, size, 2)
        green = tuple(int(v) for v in np.clip(rng.normal((70, 112, 50), 18), 0, 255))
        draw.polygon(_blob(rng, x, y, size * rng.uniform(0.06, 0.16), 0.3, n=10,
                           aspect=rng.uniform(0.4, 0.8)), fill=green)
    if rng.random() < 0.7:  # a branch across the frame
        a, b = rng.uniform(0, size, 2), rng.uniform(0, size, 2)
        draw.line([tuple(a), tuple(b)], fill=(86, 66, 50), width=int(size * rng.uniform(0.02, 0.05)))
    if rng.random() < 0.3:  # fingers holding the leaf up
        x, y = rng.uniform(0, size), rng.uniform(0.6, 1.0) * size
        draw.polygon(_blob(rng, x, y, size * 0.16, 0.25, aspect=0.6), fill=(214, 168, 140))
    return np.asarray(clutter.filter(ImageFilter.GaussianBlur(size * rng.uniform(0.004, 0.015))),
                      dtype=np.float32)


def _light(rng: np.random.Generator, size: int) -> np.ndarray:
    """Multiplicative light over the whole photo (leaf included): dappled sun, exposure, white balance."""
    dapple = 1 + rng.uniform(0.1, 0.35) * np.tanh(_smooth(rng, size, int(rng.integers(3, 8))))
    exposure = rng.uniform(0.7, 1.25)
    balance = np.array([rng.uniform(0.9, 1.12), 1.0, rng.uniform(0.85, 1.1)], dtype=np.float32)
    return dapple[..., None] * exposure * balance


def render_field(seed: int, image_px: int, class_name: str, k: int) -> tuple[Image.Image, np.ndarray]:
    """The ``k``-th field photograph of a class and its leaf's true mask (bool, upright)."""
    size = image_px * _SS
    index = [c.name for c in CLASSES].index(class_name)
    rng = np.random.default_rng([seed, FIELD_STREAM, index, k])
    layer, alpha = _draw_subject(rng, CLASS_BY_NAME[class_name], size)
    bg = _backdrop(rng, size)
    angle = rng.uniform(0, 2 * np.pi)
    scale = rng.uniform(0.38, 0.68)
    shift = rng.uniform(-0.24, 0.24, 2) * size
    placed, alpha_t = place_subject(layer, alpha, angle, scale, shift, size)
    composed = Image.composite(placed.convert("RGB"), Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8)),
                               alpha_t)
    arr = np.asarray(composed.resize((image_px, image_px), Image.Resampling.LANCZOS), dtype=np.float32)
    arr = arr * _light(rng, image_px) + rng.normal(0, rng.uniform(3, 8), arr.shape).astype(np.float32)
    image = Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))
    return image, downsample_mask(alpha_t, image_px)


def encode_field(image: Image.Image, seed: int, k: int) -> bytes:
    """JPEG as a phone writes it: quality varies per photo, camera make and model in EXIF."""
    quality = int(np.random.default_rng([seed, FIELD_STREAM, 10**6, k]).integers(70, 91))
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = CAMERA
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality, exif=exif.tobytes())
    return buffer.getvalue()


def encode_mask(mask: np.ndarray) -> bytes:
    """A mask as an 8-bit PNG, leaf white (255), the rest black."""
    buffer = io.BytesIO()
    Image.fromarray(np.where(mask, 255, 0).astype(np.uint8), mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


# --------------------------------------------------------------------------- the field cohort
def field_classes() -> tuple[list[str], list[str], list[str]]:
    """(classes drawn, lab classes left untested, classes drawn that the lab class map will not hold).

    The smallest tail class gets no field photos (the chapter must list it as untested outside the
    lab) and the singleton class, which the corpus chapter quarantines, does (the chapter must report
    its folder as having no lab counterpart and leave it out).
    """
    tail = [c.name for c in CLASSES if not c.singleton]
    singletons = [c.name for c in CLASSES if c.singleton]
    return tail[:-1] + singletons, tail[-1:], singletons


def render_cohort(seed: int, image_px: int, per_class: int) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every file of the field folder (``rel_path`` → bytes, masks under ``masks/``) and its truth.

    One extra photo of the first class is stored truncated: the scan must quarantine it.
    """
    drawn, untested, not_in_lab = field_classes()
    files: dict[str, bytes] = {}
    entries = []
    for class_name in drawn if per_class else []:
        for k in range(per_class + (class_name == drawn[0])):
            image, mask = render_field(seed, image_px, class_name, k)
            blob = encode_field(image, seed, k)
            broken = k == per_class
            rel = f"{class_name}/field_{k:04d}.jpg"
            files[rel] = blob[: int(0.4 * len(blob))] if broken else blob
            mask_rel = None if broken else f"{MASKS_DIR}/{class_name}/field_{k:04d}.png"
            if mask_rel is not None:
                files[mask_rel] = encode_mask(mask)
            entries.append({"rel_path": rel, "class": class_name, "k": k, "mask_rel_path": mask_rel,
                            "leaf_fraction": None if broken else round(float(mask.mean()), 4),
                            "broken_kind": "truncated" if broken else None, "bytes": len(files[rel]),
                            "sha256": sha256_bytes(files[rel])})
    truth = {
        "per_class": per_class,
        "classes": drawn if per_class else [],
        "untested_lab_classes": untested,
        "not_in_lab_class_map": not_in_lab,
        "files": entries,
        "n_photos": sum(e["broken_kind"] is None for e in entries),
        "n_broken": sum(e["broken_kind"] is not None for e in entries),
    }
    return files, truth
