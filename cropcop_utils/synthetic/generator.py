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
byte-identical files on any run.  The corpus is planned in :mod:`.plan` and its copies derived in
:mod:`.planting`; this module renders and encodes every file, writes the folders and the truth, and
reads the truth back (:func:`load_truth`; the planted relations in it: :mod:`.relations`).

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

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..core.config import RunContext, progress_wanted
from ..core.evidence import atomic_write_json, sha256_bytes, sha256_json
from .drawing import render_upright as render_upright  # re-exported: the planted truth names it
from .drawing import render_with_mask
from .errors import SyntheticCorpusConflict, SyntheticTruthError
from .field import encode_mask, render_cohort
from .plan import _Item, _plan, resolve_params
from .planting import _derive, _derive_mask, _encode, _store_rotated
from .world import CLASSES, SOURCES

GENERATOR = "cropcop_utils.synthetic"
GENERATOR_VERSION = "1.2.0"
CORPUS_DIR = "corpus"
FIELD_DIR = "field"    # the field cohort (chapter 10), beside the corpus so its scan is unchanged
MASKS_DIR = "masks"    # true leaf masks of the lab images: masks/<class>/<stem>.png
TRUTH_NAME = "planted.json"
PENDING_NAME = ".planted.json.pending"  # the truth of a corpus being moved into place
PARTIAL_PREFIX = ".corpus.partial-"
OUTPUT_DIRS = (CORPUS_DIR, FIELD_DIR, MASKS_DIR)


def params_fingerprint(params: dict[str, Any] | None) -> str:
    """SHA-256 of the resolved parameters and the generator version: equal means byte-identical files."""
    resolved = resolve_params(params)
    return sha256_json({"generator": GENERATOR, "version": GENERATOR_VERSION, "params": resolved})


# --------------------------------------------------------------------------- rendering every file
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
