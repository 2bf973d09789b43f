"""What the synthetic corpus holds, decided before anything is drawn: parameters, classes and counts.

:func:`resolve_params` validates the profile's ``synthetic`` section over :data:`DEFAULTS`;
:func:`class_sizes` gives the geometric long tail of originals per class; ``_plan`` decides every file
(class, inherited split, source, which originals get byte copies, near duplicates, re-shot families,
label conflicts, broken and EXIF-rotated files) and its name.  The transform parameters of each near
duplicate are drawn here too (``_knobs``), so rendering consumes no shared randomness.  Separate from
:mod:`.generator`, which renders, writes and proves the files this plan lists.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import SyntheticParamsError
from .planting import RESHOT_KINDS, TRANSFORMS
from .world import CLASS_BY_NAME, CLASSES, SOURCES

SPLITS = ("train", "val", "test")

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
