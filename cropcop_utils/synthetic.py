"""The embedded default corpus: a seeded generator of a plant-health image folder with planted truth.

``generate(out_dir, params)`` writes ``out_dir/corpus/{train,val,test}/<class>/img_NNNNNN.jpg`` (real
JPEG files with EXIF) and, last, ``out_dir/planted.json``: every file, where it came from and what was
planted in it — byte copies, near duplicates (re-encoded, resized, cropped, brightness-shifted), re-shot
families, label conflicts, broken files, EXIF-rotated files, a single-image class and a long class tail.
The audit, split and probe chapters are tested against that truth.

Why a hand-written renderer: no image library generates labelled leaf photographs, and the book must
run offline without downloading a data set.  Leaves are drawn with PIL at twice the output size and
downsampled once (anti-aliasing); all randomness comes from ``numpy.random.default_rng`` seeded per
image, so the same parameters give byte-identical files on any run.

Safety: the corpus is built in a temporary sibling folder and renamed into place, then ``planted.json``
is written atomically, so ``planted.json`` present means the corpus is complete.  ``generate`` replaces
an existing ``corpus/`` only when it can prove it wrote it (its ``planted.json`` is ours and lists every
file there); a half-written or foreign folder is refused with :class:`SyntheticCorpusConflict`.

``planted.json``: {generator, generator_version, seed, params (resolved), params_fingerprint, sources,
classes: [{name, crop, condition, type, pest, fruit, singleton, preferred_source, count (files in its
folders), originals}], files: [{rel_path (POSIX, relative to corpus/), class, split, source, origin
(original|byte_copy|near_duplicate|reshot|broken|singleton), parent (rel_path of the original or
null), parent_class, transform (reencode|resize|crop|brightness|null), transform_params, family (re-shot
family id; the family's original carries it too), broken_kind (zero_byte|truncated|not_an_image|null),
exif_orientation (1, 6, 8; null when there is no EXIF), label_conflict, crosses_split, render ({uid,
shot} for :func:`render_upright`), bytes, sha256}], summary}.
"""

from __future__ import annotations

import datetime as _dt
import functools
import io
import json
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageOps
from tqdm import tqdm

from .config import RunContext
from .evidence import atomic_write_json, sha256_bytes, sha256_json

GENERATOR = "cropcop_utils.synthetic"
GENERATOR_VERSION = "1.0.0"
CORPUS_DIR = "corpus"
TRUTH_NAME = "planted.json"
PENDING_NAME = ".planted.json.pending"  # the truth of a corpus being moved into place
PARTIAL_PREFIX = ".corpus.partial-"
SPLITS = ("train", "val", "test")
TRANSFORMS = ("reencode", "resize", "crop", "brightness")
PAIR_KINDS = ("byte_copy", *TRANSFORMS, "reshot")

DEFAULTS: dict[str, Any] = {
    "seed": 20261130,
    "image_px": 64,                 # side of the generated (square) JPEG files
    "largest_class": 150,           # originals in the largest class
    "tail_ratio": 50,               # largest / smallest class (singleton excluded)
    "min_class_size": 3,            # the smallest non-singleton class never has fewer originals
    "preferred_source_share": 0.75,  # share of a class's originals taken with its preferred source
    "split_fractions": {"train": 0.70, "val": 0.15, "test": 0.15},
    "byte_copy_fraction": 0.03,     # of originals
    "near_duplicate_fraction": 0.06,  # of originals, spread evenly over the four transforms
    "reshot_fraction": 0.03,        # of originals that end up in re-shot families (roots + re-shots)
    "crossing_fraction": 0.3,       # of each leakage kind that crosses the inherited split
    "label_conflicts": 2,           # copies filed under another class of the same crop
    "oriented_fraction": 0.01,      # originals stored rotated with EXIF orientation 6 or 8
}


class SyntheticError(RuntimeError):
    """Base class of the generator's errors."""


class SyntheticParamsError(SyntheticError, ValueError):
    """The ``synthetic`` profile section has an unknown key or an out-of-range value."""


class SyntheticCorpusConflict(SyntheticError):
    """``corpus/`` exists but cannot be proven to be a complete corpus written by this generator."""


class SyntheticTruthError(SyntheticError):
    """``planted.json`` is missing or is not this generator's ground truth."""


# --------------------------------------------------------------------------- the world being drawn
@dataclass(frozen=True)
class SourceSpec:
    """An acquisition setup: its background, frame, JPEG quality and camera, all correlated with class."""

    name: str
    make: str
    model: str
    quality: int
    background: tuple[int, int, int]
    border: str                     # "frame" (coloured band) or "vignette" (dark corners)
    border_colour: tuple[int, int, int]
    border_frac: float              # frame width (or vignette strength) relative to the image side
    shadow: float                   # drop-shadow darkness under the subject
    gradient: float                 # top-to-bottom light fall-off: EXIF orientation changes it
    noise: float                    # sensor noise (std, grey levels) at output size


SOURCES: dict[str, SourceSpec] = {s.name: s for s in (
    SourceSpec("lab_bench", "Canon", "Canon EOS 80D", 92, (214, 212, 204), "frame", (62, 62, 66), 0.035,
               0.28, 16.0, 2.0),
    SourceSpec("field_phone", "samsung", "SM-G991B", 76, (108, 90, 62), "vignette", (0, 0, 0), 0.55,
               0.35, 10.0, 6.0),
    SourceSpec("greenhouse_cam", "Raspberry Pi", "RP_imx477", 84, (118, 134, 152), "frame", (24, 126, 112),
               0.05, 0.22, 14.0, 4.0),
    SourceSpec("flatbed_scan", "EPSON", "Perfection V600", 95, (26, 26, 32), "frame", (236, 234, 226), 0.065,
               0.0, 6.0, 1.5),
)}


@dataclass(frozen=True)
class CropSpec:
    """Shape and colour of a crop's leaf (or fruit) in leaf-local coordinates, as fractions of the canvas."""

    shape: str                      # profile leaves: ovate/elliptic/cordate/strap; palmate; banana
    colour: tuple[int, int, int]
    length: float = 0.8
    width: float = 0.4
    teeth: float = 0.0              # marginal teeth per leaf side
    tooth_amp: float = 0.0
    wobble: float = 0.02            # slow irregularity of the margin
    laterals: int = 6               # lateral vein pairs


CROPS: dict[str, CropSpec] = {
    "tomato": CropSpec("ovate", (62, 128, 48), 0.78, 0.44, teeth=7, tooth_amp=0.10, wobble=0.05, laterals=5),
    "apple": CropSpec("elliptic", (50, 106, 42), 0.80, 0.40, teeth=22, tooth_amp=0.025, laterals=8),
    "grape": CropSpec("palmate", (80, 142, 60)),
    "bean": CropSpec("cordate", (92, 156, 66), 0.74, 0.56, wobble=0.03, laterals=5),
    "corn": CropSpec("strap", (96, 154, 54), 0.98, 0.16, teeth=16, tooth_amp=0.025, wobble=0.015),
    "banana": CropSpec("banana", (234, 200, 62)),
}


@dataclass(frozen=True)
class ClassSpec:
    name: str
    crop: str
    condition: str
    type: str                       # healthy | broad | specific
    source: str                     # preferred acquisition source
    pest: bool = False
    fruit: bool = False
    singleton: bool = False


# In size order, largest first: the geometric long tail is dealt out along this list.  The singleton
# class (one image, to be quarantined by the corpus chapter) comes last and is not part of the tail.
CLASSES: tuple[ClassSpec, ...] = (
    ClassSpec("tomato_late_blight", "tomato", "late_blight", "specific", "field_phone"),
    ClassSpec("tomato_healthy", "tomato", "healthy", "healthy", "lab_bench"),
    ClassSpec("corn_common_rust", "corn", "common_rust", "specific", "field_phone"),
    ClassSpec("apple_scab", "apple", "scab", "specific", "field_phone"),
    ClassSpec("grape_black_rot", "grape", "black_rot", "specific", "greenhouse_cam"),
    ClassSpec("tomato_early_blight", "tomato", "early_blight", "specific", "greenhouse_cam"),
    ClassSpec("bean_fungal_disease", "bean", "fungal_disease", "broad", "greenhouse_cam"),
    ClassSpec("apple_healthy", "apple", "healthy", "healthy", "flatbed_scan"),
    ClassSpec("corn_nutrient_deficiency", "corn", "nutrient_deficiency", "broad", "lab_bench"),
    ClassSpec("grape_healthy", "grape", "healthy", "healthy", "lab_bench"),
    ClassSpec("tomato_mosaic_virus", "tomato", "mosaic_virus", "specific", "lab_bench"),
    ClassSpec("banana_healthy_fruit", "banana", "healthy_fruit", "healthy", "flatbed_scan", fruit=True),
    ClassSpec("bean_healthy", "bean", "healthy", "healthy", "field_phone"),
    ClassSpec("apple_cedar_rust", "apple", "cedar_rust", "specific", "flatbed_scan"),
    ClassSpec("banana_disease_fruit", "banana", "disease_fruit", "broad", "lab_bench", fruit=True),
    ClassSpec("tomato_spider_mites", "tomato", "spider_mites", "specific", "greenhouse_cam", pest=True),
    ClassSpec("grape_mites", "grape", "mites", "broad", "greenhouse_cam", pest=True),
    ClassSpec("apple_powdery_mildew", "apple", "powdery_mildew", "specific", "flatbed_scan", singleton=True),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}


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
    for fam in range(n_fam):
        crossing = fam < crossing_count(n_fam)
        root = take(train_only=crossing)
        root.family = fam
        members = int(rng.integers(1, 4))
        for shot in range(1, members + 1):
            split = other_split() if crossing and shot == members else root.split
            when = _later(root.when, shot * int(rng.integers(2, 40)))
            items.append(_Item(root.cls, split, "reshot", source=root.source, uid=root.uid, shot=shot,
                               parent=root, family=fam, when=when))

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
    if transform == "crop":
        # 3-8% of each side removed, shared roughly evenly between its two edges (a re-framing crop).
        total, share = rng.uniform(0.03, 0.08, 2), rng.uniform(0.4, 0.6, 2)
        edges = [round(float(x), 4) for x in (total[0] * share[0], total[1] * share[1],
                                               total[0] * (1 - share[0]), total[1] * (1 - share[1]))]
        return {"left": edges[0], "top": edges[1], "right": edges[2], "bottom": edges[3],
                "resize_back": bool(rng.random() < 0.5), "quality": quality}
    sign = 1 if rng.random() < 0.5 else -1
    return {"factor": round(1 + sign * float(rng.uniform(0.08, 0.15)), 4), "quality": quality}


# --------------------------------------------------------------------------- drawing
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
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)), cv.alpha


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
                   shot: int = 0) -> Image.Image:
    """Draw one photograph as it should be seen (before any EXIF rotation of the stored pixels).

    The subject (shape, colours, lesions), its pose and the backdrop's layout depend only on
    ``(seed, uid)``; ``shot > 0`` re-photographs the same leaf on the same bench — a few pixels and
    degrees off, with fresh lighting and sensor noise — which is what a re-shot family is.
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
    if shot:
        angle += math.radians(shot_rng.choice([-1, 1]) * shot_rng.uniform(3, 8))
        shift = shift + shot_rng.uniform(-1, 1, 2) * 0.04 * size
        scale *= shot_rng.uniform(0.97, 1.03)
    # A re-shot keeps the backdrop's layout (same bench, same spot) but not its noise or lighting.
    bg = _background(pose_rng, src, size)

    # One affine resample for rotation + scale + shift (PIL wants the output-to-input mapping).
    c, s = math.cos(angle) / scale, math.sin(angle) / scale
    ox, oy = size / 2 + shift[0], size / 2 + shift[1]
    coeffs = (c, s, size / 2 - c * ox - s * oy, -s, c, size / 2 + s * ox - c * oy)
    layer.putalpha(alpha)
    # Bilinear is enough: the canvas is downsampled 2x with a Lanczos filter afterwards.
    placed = layer.transform((size, size), Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR)
    alpha_t = placed.getchannel("A")
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
    return _finish(shot_rng, src, small, float(shot_rng.uniform(0.95, 1.05)))


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
        img = ImageOps.exif_transpose(opened).convert("RGB")
    w, h = img.size
    if transform == "resize":
        return img.resize((max(8, round(w * knobs["factor"])), max(8, round(h * knobs["factor"]))),
                          Image.Resampling.LANCZOS)
    if transform == "crop":
        box = (round(knobs["left"] * w), round(knobs["top"] * h), w - round(knobs["right"] * w),
               h - round(knobs["bottom"] * h))
        cropped = img.crop(box)
        return cropped.resize((w, h), Image.Resampling.BICUBIC) if knobs["resize_back"] else cropped
    if transform == "brightness":
        return ImageEnhance.Brightness(img).enhance(knobs["factor"])
    return img  # reencode: same pixels, another quality


_NOT_AN_IMAGE = (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
                 b"<body><h1>Not Found</h1><p>The requested image was not found on this server.</p>"
                 b"</body></html>\n")


def _render_all(items: list[_Item], p: dict[str, Any]) -> dict[int, bytes]:
    data: dict[int, bytes] = {}
    drawn = [it for it in items if it.uid >= 0]
    for it in tqdm(drawn, desc="synthetic corpus", unit="img", disable=None):
        upright = render_upright(p["seed"], p["image_px"], it.cls, it.source, it.uid, it.shot)
        blob = _encode(_store_rotated(upright, it.orientation or 1), SOURCES[it.source].quality,
                       it.source, it.when, it.orientation or 1)
        data[id(it)] = blob[: int(0.4 * len(blob))] if it.broken_kind == "truncated" else blob
    for it in items:
        if it.origin == "byte_copy":
            data[id(it)] = data[id(it.parent)]
        elif it.origin == "near_duplicate":
            img = _derive(data[id(it.parent)], it.transform, it.knobs)
            data[id(it)] = _encode(img, it.knobs["quality"], it.source, it.when, 1)
        elif it.broken_kind == "zero_byte":
            data[id(it)] = b""
        elif it.broken_kind == "not_an_image":
            data[id(it)] = _NOT_AN_IMAGE
    return data


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
        "broken_kind": it.broken_kind,
        "exif_orientation": it.orientation,
        "label_conflict": it.label_conflict,
        "crosses_split": bool(parent is not None and parent.split != it.split),
        "render": {"uid": it.uid, "shot": it.shot} if it.uid >= 0 else None,
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
        "largest_smallest_ratio": max(tail) / min(tail) if tail else None,
    }


def _truth(items: list[_Item], data: dict[int, bytes], p: dict[str, Any]) -> dict[str, Any]:
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
    }


# --------------------------------------------------------------------------- public API
def generate(out_dir: str | os.PathLike, params: dict[str, Any] | None) -> Path:
    """Write ``out_dir/corpus/...`` and then ``out_dir/planted.json``; return the planted.json path.

    An existing ``corpus/`` is replaced only if its ``planted.json`` is this generator's and lists every
    file in it; otherwise :class:`SyntheticCorpusConflict` is raised and nothing is touched.
    """
    p = resolve_params(params)
    out_dir = Path(out_dir)
    corpus, truth_path, pending = out_dir / CORPUS_DIR, out_dir / TRUTH_NAME, out_dir / PENDING_NAME
    if corpus.exists():
        _prove_ours(corpus, truth_path if truth_path.exists() else pending)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(PARTIAL_PREFIX + "*"):  # left by a killed run; the prefix is ours
        shutil.rmtree(stale, ignore_errors=True)

    items = _plan(p)
    data = _render_all(items, p)
    partial = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=out_dir))
    try:
        for it in items:
            target = partial / it.rel_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[id(it)])
        # The pending truth lists the new files, so a run killed while swapping folders leaves a
        # corpus that the next run can still prove it wrote.
        atomic_write_json(pending, _truth(items, data, p))
        if truth_path.exists():
            truth_path.unlink()  # from here until the last line there is no planted.json: "incomplete"
        if corpus.exists():
            shutil.rmtree(corpus)
        os.replace(partial, corpus)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    os.replace(pending, truth_path)
    return truth_path


def _prove_ours(corpus: Path, truth_path: Path) -> None:
    if not truth_path.exists():
        raise SyntheticCorpusConflict(
            f"{corpus} exists but {truth_path.parent / TRUTH_NAME} does not: a half-written or foreign "
            f"corpus. Delete {corpus} (it is not regenerated over automatically) and run again."
        )
    try:
        truth = load_truth(truth_path)
    except SyntheticTruthError as error:
        raise SyntheticCorpusConflict(f"{corpus} cannot be proven to be generated: {error}") from None
    listed = {f["rel_path"] for f in truth["files"]}
    foreign = sorted(rel for rel in _files_on_disk(corpus) if rel not in listed)
    if foreign:
        raise SyntheticCorpusConflict(
            f"{corpus} holds {len(foreign)} file(s) that {truth_path} does not list (e.g. {foreign[0]!r}); "
            f"refusing to delete it. Move those files away or delete {corpus} yourself."
        )


def _files_on_disk(corpus: Path) -> list[str]:
    return sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*")
                  if p.is_file() or p.is_symlink())


def corpus_matches(out_dir: str | os.PathLike, params: dict[str, Any] | None) -> bool:
    """True when ``out_dir`` holds a complete corpus from these parameters (names and sizes checked)."""
    out_dir = Path(out_dir)
    corpus, truth_path = out_dir / CORPUS_DIR, out_dir / TRUTH_NAME
    if not (corpus.is_dir() and truth_path.exists()):
        return False
    try:
        truth = load_truth(truth_path)
    except SyntheticTruthError:
        return False
    if truth["params_fingerprint"] != params_fingerprint(params):
        return False
    expected = {f["rel_path"]: f["bytes"] for f in truth["files"]}
    on_disk = _files_on_disk(corpus)
    return set(on_disk) == set(expected) and all(
        (corpus / rel).stat().st_size == expected[rel] for rel in on_disk)


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

    ``kinds``: any of ``byte_copy``, ``reencode``, ``resize``, ``crop``, ``brightness``, ``reshot``, or
    ``near_duplicate`` for all four transforms; default all.  Re-shot families give every pair within
    the family (root included).  Label-conflict copies are included under their kind.
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
