"""The embedded default corpus: a seeded generator of a plant-health image folder with planted truth.

``generate(out_dir, params)`` writes ``out_dir/corpus/{train,val,test}/<class>/img_NNNNNN.jpg`` (real
JPEG files with EXIF) and, last, ``out_dir/planted.json``: every file, where it came from and what was
planted in it — byte copies, near duplicates (re-encoded, resized, cropped, brightness-shifted; flipped,
turned by quarter or arbitrary angles, sheared, put in perspective, elastically warped, cropped by 10-35 %,
rescaled), re-shot families (moved, relit, on another backdrop shade), label conflicts, broken files,
EXIF-rotated files, a single-image class and a long class tail.
The audit, split and probe chapters are tested against that truth.

What is drawn (sources, crops, classes and their cues) is described in
:mod:`cropcop_utils.synthetic.world`; each photograph is drawn by
:func:`cropcop_utils.synthetic.drawing.render_upright`, seeded per image, so the same parameters give
byte-identical files on any run.  This module plans the corpus, encodes and derives the files, and
writes the truth.

Safety: the corpus is built in a temporary sibling folder and renamed into place, then ``planted.json``
is written atomically, so ``planted.json`` present means the corpus is complete.  ``generate`` replaces
an existing ``corpus/`` only when it can prove it wrote it (its ``planted.json`` is ours and lists every
file there); a half-written or foreign folder is refused with :class:`SyntheticCorpusConflict`.

``planted.json``: {generator, generator_version, seed, params (resolved), params_fingerprint, sources,
classes: [{name, crop, condition, type, pest, fruit, singleton, preferred_source, count (files in its
folders), originals}], files: [{rel_path (POSIX, relative to corpus/), class, split, source, origin
(original|byte_copy|near_duplicate|reshot|broken|singleton), parent (rel_path of the original or
null), parent_class, transform (one of TRANSFORMS or null), transform_params, family (re-shot family id;
the family's original carries it too), reshot_kind (moved|relit|background|null), broken_kind
(zero_byte|truncated|not_an_image|null), exif_orientation (1, 6, 8; null when there is no EXIF),
label_conflict, crosses_split, render ({uid, shot, reshot} for :func:`render_upright`), bytes, sha256}],
summary, lab_masks: {dir, files: {corpus rel_path: mask path under masks/}},
field: {dir, per_class, classes, untested_lab_classes, not_in_lab_class_map,
files: [{rel_path (under field/), class, k, mask_rel_path (under field/), leaf_fraction, broken_kind,
bytes, sha256}], n_photos, n_broken}}.

Chapter 10's data: ``masks/<class>/<stem>.png`` holds the true leaf mask of every loadable lab image,
upright as the loading contract hands it over (near duplicates get their parent's mask under the same
crop or resize), outside ``corpus/`` so the corpus scan is unchanged; ``field/`` is the field cohort
(:mod:`cropcop_utils.synthetic.field`: ``synthetic.field_per_class`` photos per class, cluttered
backgrounds, the leaf's mask at ``field/masks/<class>/<stem>.png``).  Both come from their own
random streams: the lab corpus's bytes do not depend on them.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps
from tqdm import tqdm

from ..config import RunContext, progress_wanted
from ..evidence import atomic_write_json, sha256_bytes, sha256_json
from .drawing import render_upright as render_upright  # re-exported: the planted truth names it
from .drawing import render_with_mask
from .field import encode_mask, render_cohort
from .world import CLASS_BY_NAME, CLASSES, SOURCES

GENERATOR = "cropcop_utils.synthetic"
GENERATOR_VERSION = "1.2.0"
CORPUS_DIR = "corpus"
FIELD_DIR = "field"    # the field cohort (chapter 10), beside the corpus so its scan is unchanged
MASKS_DIR = "masks"    # true leaf masks of the lab images: masks/<class>/<stem>.png
TRUTH_NAME = "planted.json"
PENDING_NAME = ".planted.json.pending"  # the truth of a corpus being moved into place
PARTIAL_PREFIX = ".corpus.partial-"
OUTPUT_DIRS = (CORPUS_DIR, FIELD_DIR, MASKS_DIR)
SPLITS = ("train", "val", "test")
# Near-duplicate transforms: the first four keep the picture's geometry close enough for a perceptual
# hash; the rest are the copies an augmenting previous owner leaves beside the original (flips, quarter
# and arbitrary turns, shear, perspective, elastic warps, crops of 10-35 %, rescaling of the content).
HASH_NEAR_TRANSFORMS = ("reencode", "resize", "crop", "brightness")
GEOMETRIC_TRANSFORMS = ("hflip", "vflip", "rot90", "rotate", "shear", "perspective", "elastic", "crop_large",
                        "scale")
TRANSFORMS = (*HASH_NEAR_TRANSFORMS, *GEOMETRIC_TRANSFORMS)
RESHOT_KINDS = ("moved", "relit", "background")  # how a re-shot differs from its family's first photo
PAIR_KINDS = ("byte_copy", *TRANSFORMS, "reshot", *(f"reshot_{k}" for k in RESHOT_KINDS))

DEFAULTS: dict[str, Any] = {
    "seed": 20261130,
    "image_px": 64,                 # side of the generated (square) JPEG files
    "largest_class": 150,           # originals in the largest class
    "tail_ratio": 50,               # largest / smallest class (singleton excluded)
    "min_class_size": 3,            # the smallest non-singleton class never has fewer originals
    "preferred_source_share": 0.75,  # share of a class's originals taken with its preferred source
    "split_fractions": {"train": 0.70, "val": 0.15, "test": 0.15},
    "byte_copy_fraction": 0.03,     # of originals
    "near_duplicate_fraction": 0.13,  # of originals, spread evenly over the 13 transforms
    "reshot_fraction": 0.06,        # of originals that end up in re-shot families (roots + re-shots)
    "crossing_fraction": 0.3,       # of each leakage kind that crosses the inherited split
    "label_conflicts": 2,           # copies filed under another class of the same crop
    "oriented_fraction": 0.01,      # originals stored rotated with EXIF orientation 6 or 8
    "field_per_class": 16,          # field photographs per class (cohort of chapter 10; 0: none)
}


class SyntheticError(RuntimeError):
    """Base class of the generator's errors."""


class SyntheticParamsError(SyntheticError, ValueError):
    """The ``synthetic`` profile section has an unknown key or an out-of-range value."""


class SyntheticCorpusConflict(SyntheticError):
    """``corpus/`` exists but cannot be proven to be a complete corpus written by this generator."""


class SyntheticTruthError(SyntheticError):
    """``planted.json`` is missing or is not this generator's ground truth."""




# --------------------------------------------------------------------------- parameters
def resolve_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """The profile's ``synthetic`` section with defaults filled in, validated."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise SyntheticParamsError(
            f"unknown synthetic parameter(s) {unknown}; known: {', '.join(sorted(DEFAULTS))}"
        )
    resolved = {**DEFAULTS, **params}
    resolved["split_fractions"] = {**DEFAULTS["split_fractions"], **(params.get("split_fractions") or {})}
    checks = [
        ("seed", isinstance(resolved["seed"], int) and resolved["seed"] >= 0, "a non-negative integer"),
        ("image_px", isinstance(resolved["image_px"], int) and 32 <= resolved["image_px"] <= 1024,
         "an integer in [32, 1024]"),
        ("min_class_size", isinstance(resolved["min_class_size"], int) and resolved["min_class_size"] >= 3,
         "an integer >= 3 (one image per inherited split)"),
        ("largest_class", isinstance(resolved["largest_class"], int)
         and resolved["largest_class"] >= resolved["min_class_size"], "an integer >= min_class_size"),
        ("tail_ratio", isinstance(resolved["tail_ratio"], (int, float)) and resolved["tail_ratio"] >= 1,
         "a number >= 1"),
        ("field_per_class", isinstance(resolved["field_per_class"], int)
         and 0 <= resolved["field_per_class"] <= 5000, "an integer in [0, 5000]"),
        ("label_conflicts", isinstance(resolved["label_conflicts"], int)
         and 0 <= resolved["label_conflicts"] <= 10, "an integer in [0, 10]"),
        ("split_fractions", set(resolved["split_fractions"]) == set(SPLITS)
         and abs(sum(resolved["split_fractions"].values()) - 1) < 1e-6, "{train, val, test} summing to 1"),
    ]
    for key in ("preferred_source_share", "byte_copy_fraction", "near_duplicate_fraction", "reshot_fraction",
                "crossing_fraction", "oriented_fraction"):
        value = resolved[key]
        checks.append((key, isinstance(value, (int, float)) and 0 <= value <= 1, "a number in [0, 1]"))
    for key, ok, expected in checks:
        if not ok:
            raise SyntheticParamsError(f"synthetic.{key} = {resolved[key]!r}: expected {expected}")
    return resolved


def params_fingerprint(params: dict[str, Any] | None) -> str:
    """SHA-256 of the resolved parameters and the generator version: equal means byte-identical files."""
    resolved = resolve_params(params)
    return sha256_json({"generator": GENERATOR, "version": GENERATOR_VERSION, "params": resolved})


def class_sizes(params: dict[str, Any]) -> dict[str, int]:
    """Originals per tail class: geometric from ``largest_class`` down to ``largest_class / tail_ratio``.

    Sizes are rounded up, except the smallest, which is rounded down so the ratio is at least
    ``tail_ratio`` (floating point would otherwise turn 150/50 into 4); none is below ``min_class_size``.
    """
    p = resolve_params(params)
    tail = [c for c in CLASSES if not c.singleton]
    largest, ratio, floor_ = p["largest_class"], float(p["tail_ratio"]), p["min_class_size"]
    sizes = {}
    for i, spec in enumerate(tail):
        exact = largest * ratio ** (-i / (len(tail) - 1))
        size = math.floor(exact + 1e-9) if i == len(tail) - 1 else math.ceil(exact - 1e-9)
        sizes[spec.name] = max(floor_, size)
    return sizes


# --------------------------------------------------------------------------- the plan
@dataclass(eq=False)
class _Item:
    """One planned file.  Rendered items carry a render key (uid, shot); derived ones a parent."""

    cls: str
    split: str
    origin: str
    source: str | None = None
    uid: int = -1
    shot: int = 0
    parent: _Item | None = None
    transform: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    family: int | None = None
    reshot_kind: str | None = None
    broken_kind: str | None = None
    orientation: int | None = 1
    label_conflict: bool = False
    when: str | None = None
    rel_path: str = ""


def _plan(p: dict[str, Any]) -> list[_Item]:
    """Decide every file (class, split, source, leakage role, name) before drawing anything."""
    rng = np.random.default_rng([p["seed"], 0])
    sizes = class_sizes(p)
    base_day = _dt.datetime(2019, 3, 1) + _dt.timedelta(days=p["seed"] % 997)
    uid = iter(range(10**9))

    def timestamp() -> str:
        return (base_day + _dt.timedelta(seconds=int(rng.integers(0, 2 * 365 * 86400)))).strftime(
            "%Y:%m:%d %H:%M:%S")

    items: list[_Item] = []
    originals: dict[str, list[_Item]] = {}
    others = {name: [s for s in SOURCES if s != name] for name in SOURCES}
    for spec in CLASSES:
        n = 1 if spec.singleton else sizes[spec.name]
        n_pref = n if spec.singleton else round(p["preferred_source_share"] * n)
        sources = [spec.source] * n_pref + list(rng.choice(others[spec.source], n - n_pref))
        sources = [str(s) for s in rng.permutation(sources)]
        splits = ["train"] if spec.singleton else [str(s) for s in rng.permutation(_split_counts(n, p))]
        originals[spec.name] = [
            _Item(spec.name, split, "singleton" if spec.singleton else "original", source=src,
                  uid=next(uid), when=timestamp())
            for src, split in zip(sources, splits, strict=True)
        ]
        items += originals[spec.name]

    # Leakage never touches the singleton or the smallest class, so the tail ratio holds for file counts.
    tail = [c.name for c in CLASSES if not c.singleton]
    eligible = tail[:-1]
    pool = [it for name in eligible for it in originals[name]]
    order = [pool[i] for i in rng.permutation(len(pool))]
    used: set[int] = set()

    def take(train_only: bool = False, classes: Iterable[str] | None = None) -> _Item:
        allowed = set(classes) if classes is not None else None
        for it in order:
            if id(it) in used or (train_only and it.split != "train"):
                continue
            if allowed is not None and it.cls not in allowed:
                continue
            used.add(id(it))
            return it
        raise SyntheticParamsError("too few originals for the requested leakage; raise largest_class")

    def other_split() -> str:
        return str(rng.choice(["val", "test"]))

    n_orig = sum(len(v) for k, v in originals.items() if not CLASS_BY_NAME[k].singleton)
    n_oriented = max(2, round(p["oriented_fraction"] * n_orig))
    oriented = [take() for _ in range(n_oriented)]
    for k, it in enumerate(oriented):
        it.orientation = 6 if k % 2 == 0 else 8
    used.difference_update(id(it) for it in oriented[1:])  # these may still be leakage parents

    def crossing_count(n: int) -> int:
        return min(n, max(1, round(p["crossing_fraction"] * n))) if n else 0

    n_fam = max(2, round(p["reshot_fraction"] * n_orig / 3))
    dealt = 0
    for fam in range(n_fam):
        crossing = fam < crossing_count(n_fam)
        root = take(train_only=crossing)
        root.family = fam
        members = int(rng.integers(1, 4))
        for shot in range(1, members + 1):
            split = other_split() if crossing and shot == members else root.split
            when = _later(root.when, shot * int(rng.integers(2, 40)))
            # Kinds are dealt in turn over all re-shots, so each kind has about a third of them.
            kind = RESHOT_KINDS[dealt % len(RESHOT_KINDS)]
            dealt += 1
            items.append(_Item(root.cls, split, "reshot", source=root.source, uid=root.uid, shot=shot,
                               parent=root, family=fam, reshot_kind=kind, when=when))

    n_byte = max(3, round(p["byte_copy_fraction"] * n_orig))
    for i in range(n_byte):
        crossing = i < crossing_count(n_byte)
        parent = take(train_only=crossing)
        items.append(_Item(parent.cls, other_split() if crossing else parent.split, "byte_copy",
                           source=parent.source, parent=parent, orientation=parent.orientation,
                           when=parent.when))

    n_near = max(2, round(p["near_duplicate_fraction"] * n_orig / len(TRANSFORMS)))
    for transform in TRANSFORMS:
        for i in range(n_near):
            crossing = i < crossing_count(n_near)
            if transform == "reencode" and i == n_near - 1:
                # A re-saved copy that lost the rotation: only EXIF-aware loading matches it.
                parent = oriented[0]
            else:
                parent = take(train_only=crossing)
            items.append(_Item(parent.cls, other_split() if crossing else parent.split, "near_duplicate",
                               source=parent.source, parent=parent, transform=transform,
                               knobs=_knobs(rng, transform, parent), when=parent.when))

    for i in range(p["label_conflicts"]):
        parent = take(classes=[c for c in eligible if _same_crop_alternatives(c, eligible)])
        target = str(rng.choice(_same_crop_alternatives(parent.cls, eligible)))
        transform = None if i % 2 == 0 else "brightness"
        items.append(_Item(target, parent.split, "byte_copy" if transform is None else "near_duplicate",
                           source=parent.source, parent=parent, transform=transform,
                           knobs=_knobs(rng, transform, parent) if transform else {},
                           orientation=parent.orientation if transform is None else 1,
                           label_conflict=True, when=parent.when))

    for kind, cls, split in (("zero_byte", tail[0], "train"), ("truncated", tail[1], "train"),
                             ("not_an_image", tail[2], "val")):
        rendered = kind == "truncated"
        items.append(_Item(cls, split, "broken", broken_kind=kind,
                           source=CLASS_BY_NAME[cls].source if rendered else None,
                           uid=next(uid) if rendered else -1, orientation=1 if rendered else None,
                           when=timestamp() if rendered else None))

    # Names are dealt from one shuffled sequence so a file number says nothing about how it was made.
    numbers = rng.permutation(len(items)) + 1
    extensions = rng.choice([".jpg", ".JPG", ".jpeg"], size=len(items), p=[0.8, 0.12, 0.08])
    for it, number, ext in zip(items, numbers, extensions, strict=True):
        ext = ".jpg" if it.origin == "broken" else str(ext)
        it.rel_path = f"{it.split}/{it.cls}/img_{int(number):06d}{ext}"
    return items


def _split_counts(n: int, p: dict[str, Any]) -> list[str]:
    fractions = p["split_fractions"]
    n_val = max(1, round(fractions["val"] * n)) if n >= 3 else 0
    n_test = max(1, round(fractions["test"] * n)) if n >= 3 else 0
    return ["train"] * (n - n_val - n_test) + ["val"] * n_val + ["test"] * n_test


def _same_crop_alternatives(name: str, eligible: list[str]) -> list[str]:
    crop = CLASS_BY_NAME[name].crop
    return [c for c in eligible if c != name and CLASS_BY_NAME[c].crop == crop]


def _later(when: str | None, seconds: int) -> str | None:
    if when is None:
        return None
    stamp = _dt.datetime.strptime(when, "%Y:%m:%d %H:%M:%S") + _dt.timedelta(seconds=seconds)
    return stamp.strftime("%Y:%m:%d %H:%M:%S")


def _knobs(rng: np.random.Generator, transform: str, parent: _Item) -> dict[str, Any]:
    """Transform parameters, drawn at plan time so rendering consumes no shared randomness."""
    quality = SOURCES[parent.source].quality
    if transform == "reencode":
        q = int(rng.integers(55, 71)) if quality >= 85 else int(rng.integers(88, 97))
        return {"quality": q}
    if transform == "resize":
        return {"factor": round(float(rng.uniform(0.6, 0.85)), 4), "quality": quality}
    if transform in ("crop", "crop_large"):
        # crop: 3-8% of each side removed (a re-framing crop); crop_large: 10-35% (an augmenting crop),
        # shared roughly evenly between the two edges of each axis.
        low, high = (0.03, 0.08) if transform == "crop" else (0.10, 0.35)
        total, share = rng.uniform(low, high, 2), rng.uniform(0.4, 0.6, 2)
        edges = [round(float(x), 4) for x in (total[0] * share[0], total[1] * share[1],
                                               total[0] * (1 - share[0]), total[1] * (1 - share[1]))]
        return {"left": edges[0], "top": edges[1], "right": edges[2], "bottom": edges[3],
                "resize_back": bool(rng.random() < 0.5), "quality": quality}
    if transform in ("hflip", "vflip"):
        return {"quality": quality}
    if transform == "rot90":
        return {"quarter_turns": int(rng.integers(1, 4)), "quality": quality}
    if transform == "rotate":
        # Off the quarter turns by 10-80 degrees: a turn no dihedral symmetry undoes.
        return {"angle": round(float(90 * rng.integers(0, 4) + rng.uniform(10, 80)), 2), "quality": quality}
    if transform == "shear":
        axis = str(rng.choice(["x", "y"]))
        return {"axis": axis, "factor": round(float(rng.choice([-1, 1]) * rng.uniform(0.12, 0.3)), 4),
                "quality": quality}
    if transform == "perspective":
        # Each corner moves inwards or outwards by 4-12% of the side: a tilted camera.
        offsets = rng.uniform(0.04, 0.12, 8) * rng.choice([-1, 1], 8)
        return {"corners": [round(float(x), 4) for x in offsets], "quality": quality}
    if transform == "elastic":
        return {"alpha": round(float(rng.uniform(0.02, 0.035)), 4), "sigma": 0.08,
                "seed": int(rng.integers(0, 2**31)), "quality": quality}
    if transform == "scale":
        factor = rng.uniform(0.7, 0.88) if rng.random() < 0.5 else rng.uniform(1.12, 1.3)
        return {"factor": round(float(factor), 4), "quality": quality}
    sign = 1 if rng.random() < 0.5 else -1
    return {"factor": round(1 + sign * float(rng.uniform(0.08, 0.15)), 4), "quality": quality}


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


_NOT_AN_IMAGE = (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
                 b"<body><h1>Not Found</h1><p>The requested image was not found on this server.</p>"
                 b"</body></html>\n")


def _render_all(items: list[_Item], p: dict[str, Any]) -> tuple[dict[int, bytes], dict[int, np.ndarray]]:
    """Every file's bytes and, for every loadable image, its true leaf mask (upright, as loaded)."""
    data: dict[int, bytes] = {}
    masks: dict[int, np.ndarray] = {}
    drawn = [it for it in items if it.uid >= 0]
    for it in tqdm(drawn, desc="synthetic corpus", unit="img", disable=None if progress_wanted() else True):
        upright, mask = render_with_mask(p["seed"], p["image_px"], it.cls, it.source, it.uid, it.shot,
                                         it.reshot_kind or "moved")
        if it.broken_kind is None:
            masks[id(it)] = mask
        blob = _encode(_store_rotated(upright, it.orientation or 1), SOURCES[it.source].quality,
                       it.source, it.when, it.orientation or 1)
        data[id(it)] = blob[: int(0.4 * len(blob))] if it.broken_kind == "truncated" else blob
    for it in items:
        if it.origin == "byte_copy":
            data[id(it)] = data[id(it.parent)]
            masks[id(it)] = masks[id(it.parent)]
        elif it.origin == "near_duplicate":
            img = _derive(data[id(it.parent)], it.transform, it.knobs)
            data[id(it)] = _encode(img, it.knobs["quality"], it.source, it.when, 1)
            masks[id(it)] = _derive_mask(masks[id(it.parent)], it.transform, it.knobs)
        elif it.broken_kind == "zero_byte":
            data[id(it)] = b""
        elif it.broken_kind == "not_an_image":
            data[id(it)] = _NOT_AN_IMAGE
    return data, masks


def lab_mask_paths(out_dir: str | os.PathLike) -> dict[str, Path]:
    """Corpus ``rel_path`` → its true leaf mask file, for every loadable lab image (from planted.json;
    ``out_dir`` is the folder holding it, ``<run>/synthetic``)."""
    out_dir = Path(out_dir)
    listed = load_truth(out_dir).get("lab_masks", {}).get("files", {})
    return {rel: out_dir / MASKS_DIR / mask for rel, mask in listed.items()}


def lab_mask_rel_path(rel_path: str, class_name: str) -> str:
    """Where a corpus file's true mask lives under ``masks/``: ``<class>/<stem>.png`` (stems are unique)."""
    return f"{class_name}/{Path(rel_path).stem}.png"


# --------------------------------------------------------------------------- the ground truth
def _file_entry(it: _Item, blob: bytes) -> dict[str, Any]:
    parent = it.parent
    return {
        "rel_path": it.rel_path,
        "class": it.cls,
        "split": it.split,
        "source": it.source,
        "origin": it.origin,
        "parent": parent.rel_path if parent else None,
        "parent_class": parent.cls if parent else None,
        "transform": it.transform,
        "transform_params": it.knobs or None,
        "family": it.family,
        "reshot_kind": it.reshot_kind,
        "broken_kind": it.broken_kind,
        "exif_orientation": it.orientation,
        "label_conflict": it.label_conflict,
        "crosses_split": bool(parent is not None and parent.split != it.split),
        "render": ({"uid": it.uid, "shot": it.shot, **({"reshot": it.reshot_kind} if it.reshot_kind else {})}
                   if it.uid >= 0 else None),
        "bytes": len(blob),
        "sha256": sha256_bytes(blob),
    }


def _summary(files: list[dict[str, Any]], classes: list[dict[str, Any]]) -> dict[str, Any]:
    crossing = Counter(f["origin"] for f in files if f["crosses_split"])
    tail = [c["count"] for c in classes if c["count"] > 1]
    return {
        "n_files": len(files),
        "n_classes": len(classes),
        "by_origin": dict(sorted(Counter(f["origin"] for f in files).items())),
        "by_transform": dict(sorted(Counter(f["transform"] for f in files if f["transform"]).items())),
        "by_split": dict(sorted(Counter(f["split"] for f in files).items())),
        "by_source": dict(sorted(Counter(f["source"] for f in files if f["source"]).items())),
        "broken": dict(sorted(Counter(f["broken_kind"] for f in files if f["broken_kind"]).items())),
        "crossing_split": {**dict(sorted(crossing.items())), "total": sum(crossing.values())},
        "label_conflicts": sum(f["label_conflict"] for f in files),
        "exif_rotated": dict(sorted(Counter(str(f["exif_orientation"]) for f in files
                                            if f["exif_orientation"] not in (None, 1)).items())),
        "reshot_families": len({f["family"] for f in files if f["family"] is not None}),
        "reshot_kinds": dict(sorted(Counter(f["reshot_kind"] for f in files if f["reshot_kind"]).items())),
        "largest_smallest_ratio": max(tail) / min(tail) if tail else None,
    }


def _truth(items: list[_Item], data: dict[int, bytes], p: dict[str, Any], field_truth: dict[str, Any],
           lab_masks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    files = sorted((_file_entry(it, data[id(it)]) for it in items), key=lambda f: f["rel_path"])
    counts = Counter(f["class"] for f in files)
    originals = Counter(f["class"] for f in files if f["origin"] in ("original", "singleton"))
    classes = [{"name": c.name, "crop": c.crop, "condition": c.condition, "type": c.type, "pest": c.pest,
                "fruit": c.fruit, "singleton": c.singleton, "preferred_source": c.source,
                "count": counts[c.name], "originals": originals[c.name]} for c in CLASSES]
    return {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "seed": p["seed"],
        "params": p,
        "params_fingerprint": params_fingerprint(p),
        "corpus_dir": CORPUS_DIR,
        "sources": {s.name: {"make": s.make, "model": s.model, "quality": s.quality, "border": s.border,
                             "border_colour": list(s.border_colour), "background": list(s.background)}
                    for s in SOURCES.values()},
        "classes": classes,
        "files": files,
        "summary": _summary(files, classes),
        "lab_masks": {"dir": MASKS_DIR, "files": lab_masks},
        "field": {"dir": FIELD_DIR, **field_truth},
    }


# --------------------------------------------------------------------------- public API
def generate(out_dir: str | os.PathLike, params: dict[str, Any] | None) -> Path:
    """Write ``out_dir/{corpus,masks,field}/...`` and then ``out_dir/planted.json``; return its path.

    ``corpus/`` is the lab corpus, ``masks/`` the true leaf mask of every loadable lab image
    (``<class>/<stem>.png``) and ``field/`` the field cohort (``<class>/<file>.jpg`` with its masks at
    ``field/masks/<class>/<stem>.png``).  An existing folder is replaced only if its ``planted.json``
    is this generator's and lists every file in it; otherwise :class:`SyntheticCorpusConflict` is
    raised and nothing is touched.
    """
    p = resolve_params(params)
    out_dir = Path(out_dir)
    truth_path, pending = out_dir / TRUTH_NAME, out_dir / PENDING_NAME
    for name in OUTPUT_DIRS:
        if (out_dir / name).exists():
            _prove_ours(out_dir / name, truth_path if truth_path.exists() else pending, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_DIRS:  # left by a killed run; the prefixes are ours
        for stale in out_dir.glob(f".{name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)

    items = _plan(p)
    data, masks = _render_all(items, p)
    lab_masks = {it.rel_path: lab_mask_rel_path(it.rel_path, it.cls) for it in items if id(it) in masks}
    field_files, field_truth = render_cohort(p["seed"], p["image_px"], p["field_per_class"])
    outputs = {
        CORPUS_DIR: {it.rel_path: data[id(it)] for it in items},
        MASKS_DIR: {lab_masks[it.rel_path]: encode_mask(masks[id(it)]) for it in items if id(it) in masks},
        FIELD_DIR: field_files,
    }
    partials = {name: Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=out_dir)) for name in OUTPUT_DIRS}
    try:
        for name, files in outputs.items():
            for rel, blob in files.items():
                target = partials[name] / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blob)
        # The pending truth lists the new files, so a run killed while swapping folders leaves
        # folders that the next run can still prove it wrote.
        atomic_write_json(pending, _truth(items, data, p, field_truth, lab_masks))
        if truth_path.exists():
            truth_path.unlink()  # from here until the last line there is no planted.json: "incomplete"
        for name in OUTPUT_DIRS:
            if (out_dir / name).exists():
                shutil.rmtree(out_dir / name)
            os.replace(partials[name], out_dir / name)
    except BaseException:
        for partial in partials.values():
            shutil.rmtree(partial, ignore_errors=True)
        raise
    os.replace(pending, truth_path)
    return truth_path


def listed_files(truth: dict[str, Any], name: str = CORPUS_DIR) -> dict[str, int | None]:
    """Files the truth lists under one output folder (path relative to it → bytes; None: not recorded).

    A truth from before the field cohort lists nothing under ``field/`` or ``masks/``.
    """
    if name == CORPUS_DIR:
        return {f["rel_path"]: f["bytes"] for f in truth["files"]}
    if name == MASKS_DIR:
        return dict.fromkeys(truth.get("lab_masks", {}).get("files", {}).values())
    listed: dict[str, int | None] = {}
    for f in truth.get("field", {}).get("files", []):
        listed[f["rel_path"]] = f["bytes"]
        if f["mask_rel_path"]:
            listed[f["mask_rel_path"]] = None
    return listed


def _prove_ours(folder: Path, truth_path: Path, name: str = CORPUS_DIR) -> None:
    if not truth_path.exists():
        raise SyntheticCorpusConflict(
            f"{folder} exists but {truth_path.parent / TRUTH_NAME} does not: a half-written or foreign "
            f"corpus. Delete {folder} (it is not regenerated over automatically) and run again."
        )
    try:
        truth = load_truth(truth_path)
    except SyntheticTruthError as error:
        raise SyntheticCorpusConflict(f"{folder} cannot be proven to be generated: {error}") from None
    listed = listed_files(truth, name)
    foreign = sorted(rel for rel in _files_on_disk(folder) if rel not in listed)
    if foreign:
        raise SyntheticCorpusConflict(
            f"{folder} holds {len(foreign)} file(s) that {truth_path} does not list (e.g. {foreign[0]!r}); "
            f"refusing to delete it. Move those files away or delete {folder} yourself."
        )


def _files_on_disk(corpus: Path) -> list[str]:
    return sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*")
                  if p.is_file() or p.is_symlink())


def corpus_matches(out_dir: str | os.PathLike, params: dict[str, Any] | None) -> bool:
    """True when ``out_dir`` holds complete corpus, mask and field folders from these parameters (names
    and sizes checked)."""
    out_dir = Path(out_dir)
    truth_path = out_dir / TRUTH_NAME
    if not (all((out_dir / name).is_dir() for name in OUTPUT_DIRS) and truth_path.exists()):
        return False
    try:
        truth = load_truth(truth_path)
    except SyntheticTruthError:
        return False
    if truth["params_fingerprint"] != params_fingerprint(params):
        return False
    for name in OUTPUT_DIRS:
        expected, on_disk = listed_files(truth, name), _files_on_disk(out_dir / name)
        if set(on_disk) != set(expected) or any(
                expected[rel] is not None and (out_dir / name / rel).stat().st_size != expected[rel]
                for rel in on_disk):
            return False
    return True


def ensure_corpus(ctx: RunContext) -> Path:
    """The run's corpus root; for the synthetic corpus, generate it unless an identical one is there."""
    if not ctx.is_synthetic:
        if not ctx.corpus_root.is_dir():
            raise FileNotFoundError(f"corpus folder {ctx.corpus_root} does not exist")
        return ctx.corpus_root
    params = ctx.section("synthetic")
    out_dir = ctx.planted_truth_path.parent
    if not corpus_matches(out_dir, params):
        generate(out_dir, params)
    return ctx.corpus_root


def load_truth(path: str | os.PathLike) -> dict[str, Any]:
    """Read ``planted.json`` (or the folder holding it) and check it is this generator's truth."""
    path = Path(path)
    if path.is_dir():
        path = path / TRUTH_NAME
    if not path.exists():
        raise SyntheticTruthError(f"{path} does not exist: generate the synthetic corpus (ensure_corpus)")
    try:
        truth = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SyntheticTruthError(
            f"{path} is not valid JSON ({error}); delete its folder and regenerate") from None
    if not isinstance(truth, dict) or truth.get("generator") != GENERATOR or "files" not in truth:
        raise SyntheticTruthError(f"{path} is not ground truth written by {GENERATOR}")
    return truth


def planted_pairs(truth: dict[str, Any], kinds: Iterable[str] | None = None) -> set[frozenset[str]]:
    """Planted related pairs of corpus-relative paths.

    ``kinds``: any of :data:`PAIR_KINDS` (``byte_copy``, a transform, ``reshot``, ``reshot_<kind>``) or
    ``near_duplicate`` for every transform; default all.  ``reshot`` gives every pair within a re-shot
    family (root included); ``reshot_moved`` / ``_relit`` / ``_background`` give the pairs of a family's
    first photo with its re-shots of that kind.  Label-conflict copies are included under their kind.
    """
    wanted = set(PAIR_KINDS if kinds is None else kinds)
    if "near_duplicate" in wanted:
        wanted = (wanted - {"near_duplicate"}) | set(TRANSFORMS)
    unknown = wanted - set(PAIR_KINDS)
    if unknown:
        raise ValueError(
            f"unknown pair kind(s) {sorted(unknown)}; known: {', '.join(PAIR_KINDS)}, near_duplicate")
    pairs: set[frozenset[str]] = set()
    families: dict[int, list[str]] = {}
    for f in truth["files"]:
        if f["origin"] == "byte_copy" and "byte_copy" in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
        elif f["origin"] == "near_duplicate" and f["transform"] in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
        if f["family"] is not None:
            families.setdefault(f["family"], []).append(f["rel_path"])
        if f["origin"] == "reshot" and f"reshot_{f.get('reshot_kind') or 'moved'}" in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
    if "reshot" in wanted:
        for members in families.values():
            pairs.update(frozenset((a, b)) for i, a in enumerate(members) for b in members[i + 1:])
    return pairs


def planted_groups(truth: dict[str, Any]) -> list[set[str]]:
    """Connected groups (size >= 2) of all planted relations: what a leak-free split must keep together."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    pairs = [tuple(pair) for pair in planted_pairs(truth)]
    names = sorted({name for pair in pairs for name in pair})
    index = {name: i for i, name in enumerate(names)}
    rows = [index[a] for a, _ in pairs]
    cols = [index[b] for _, b in pairs]
    graph = coo_matrix((np.ones(len(pairs)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(graph, directed=False)
    groups: dict[int, set[str]] = {}
    for name, label in zip(names, labels, strict=True):
        groups.setdefault(int(label), set()).add(name)
    return sorted(groups.values(), key=lambda g: sorted(g))


def label_conflicts(truth: dict[str, Any]) -> set[frozenset[str]]:
    """Pairs where a copy of an image is filed under a different class than its original."""
    return {frozenset((f["parent"], f["rel_path"])) for f in truth["files"] if f["label_conflict"]}
