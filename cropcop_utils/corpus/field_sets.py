"""Field image sets: folders of labelled field photographs in lab class folders, scanned under the corpus
contract (:func:`scan_field`).

Two kinds of set use it: the field cohort that chapter 10 only ever scores (``--field``, row ids
``field/<rel_path>``; :mod:`cropcop_utils.field.cohort`) and the field-train photos that chapter 1 admits for
training and selection (``--field-train``, row ids ``field_train/<rel_path>``; :mod:`.field_train`).  It
lives here, below both, so chapters 1 and 2 can scan a set without importing chapter 10.

Layout::

    PATH/<lab class>/<image>            one folder per lab class, named exactly as the lab class
    PATH/labels.csv                     optional: path,source_label,lab_class (path relative to PATH)
    PATH/masks/<lab class>/<stem>.png   optional: the leaf's true mask (white = leaf) of <class>/<stem>.*

Every file under ``PATH`` except ``labels.csv`` and ``masks/`` is *seen* and ends in exactly one of
four places, so ``files_seen == admitted + quarantined + left_out + not_sampled``: quarantined (the corpus
chapter's file-level reasons, plus ``labels_csv_conflict``), left out (``no_lab_class``: a folder with no
lab counterpart), admitted (a row with its lab label), or not sampled (outside a content-hash sample, by
the corpus chapter's rule :func:`cropcop_utils.corpus.in_sample`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.evidence import row_id as make_row_id
from .layout import CorpusLayoutError, Layout, list_files
from .probe import probe_all
from .quarantine import CLASS_REASON
from .quarantine import REASONS as CORPUS_REASONS
from .scan import sample_entries

LABELS_NAME = "labels.csv"
MASKS_DIR = "masks"
LEFT_OUT_REASON = "no_lab_class"
LABEL_CONFLICT = "labels_csv_conflict"
# The corpus chapter's file-level reasons (class support does not apply: a field class is not trained).
REASONS = tuple(r for r in CORPUS_REASONS if r != CLASS_REASON) + (LABEL_CONFLICT,)
ROW_COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label", "mask_rel_path", "bytes",
               "sha256", "width", "height"]
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "reason", "detail"]
LEFT_OUT_COLUMNS = ["rel_path", "class_name", "reason"]
NOT_SAMPLED_COLUMNS = ["row_id", "rel_path", "class_name", "bytes", "sha256"]
NOT_SAMPLED = "field/not_sampled.parquet"   # the cohort's list; a field-train scan names its own
SAMPLE_KEY = "field_transfer.sample_fraction"
COHORT_PREFIX = "field"  # row ids of the scored cohort: row_id("field/<rel_path>")
SAMPLE_RULE = "content SHA-256 / 2**256 < fraction"


class FieldSampleError(ValueError):
    """``field_transfer.sample_fraction`` is not a number in (0, 1] or null."""


@dataclass
class FieldScan:
    """What :func:`scan_field` found; ``summary`` holds the counts a chapter reports."""

    root: Path
    rows: pd.DataFrame
    quarantine: pd.DataFrame
    left_out: pd.DataFrame
    unmatched_classes: list[str]
    untested_classes: list[str]
    summary: dict[str, Any] = field(default_factory=dict)
    not_sampled: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NOT_SAMPLED_COLUMNS))


def check_fraction(fraction: Any, key: str = SAMPLE_KEY) -> float | None:
    """``field_transfer.sample_fraction`` as a float, or None (the whole cohort); refuses anything else."""
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise FieldSampleError(f"{key} must be in (0, 1] or null, got {fraction!r}")
    return float(fraction)


def field_row_id(rel_path: str, prefix: str = COHORT_PREFIX) -> str:
    """Row identity of a field image; prefixed so it never equals a lab row id (or another set's) of the
    same path."""
    return make_row_id(f"{prefix}/{rel_path}")


def read_labels(root: str | os.PathLike) -> pd.DataFrame | None:
    """``labels.csv`` as a frame (path, source_label, lab_class), or None when the cohort has none."""
    path = Path(root) / LABELS_NAME
    if not path.exists():
        return None
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a readable CSV ({error})") from None
    if "path" not in frame.columns:
        raise ValueError(f"{path}: needs a 'path' column (path,source_label,lab_class); has "
                         f"{list(frame.columns)}")
    for column in ("source_label", "lab_class"):
        if column not in frame.columns:
            frame[column] = ""
    frame["path"] = frame["path"].str.strip().str.replace("\\", "/", regex=False)
    duplicated = frame["path"][frame["path"].duplicated()]
    if len(duplicated):
        raise ValueError(f"{path}: {len(duplicated)} path(s) listed twice, e.g. {duplicated.iloc[0]!r}")
    return frame[["path", "source_label", "lab_class"]]


def _mask_files(root: Path) -> dict[str, str]:
    """``<class>/<stem>`` → mask path relative to the root, for every PNG under ``masks/``."""
    masks = root / MASKS_DIR
    if not masks.is_dir():
        return {}
    found = {}
    for path in sorted(masks.glob("*/*")):
        if path.is_file() and path.suffix.lower() == ".png" and not path.name.startswith("."):
            found[f"{path.parent.name}/{path.stem}"] = path.relative_to(root).as_posix()
    return found


def _is_metadata(rel_path: str) -> bool:
    return rel_path == LABELS_NAME or rel_path.split("/", 1)[0] == MASKS_DIR


def scan_field(
    root: str | os.PathLike,
    lab_classes: list[str],
    max_image_pixels: int | None = None,
    workers: int | None = 1,
    progress: bool = False,
    sample_fraction: float | None = None,
    row_prefix: str = COHORT_PREFIX,
    sample_key: str = SAMPLE_KEY,
    not_sampled_list: str = NOT_SAMPLED,
) -> FieldScan:
    """Scan every file of a field cohort (or its content-hash ``sample_fraction``) and match its class
    folders to ``lab_classes`` (label = index).

    ``row_prefix`` keeps each set's row ids apart (the cohort ``field``, field-train ``field_train``);
    ``sample_key`` names the profile key of ``sample_fraction`` in errors and the summary, and
    ``not_sampled_list`` the file the caller writes the not-sampled rows to.

    Raises :class:`FieldSampleError` for a fraction outside (0, 1],
    :class:`cropcop_utils.corpus.CorpusLayoutError` when the folder holds no image at ``<class>/<image>``
    and ``ValueError`` for an unreadable ``labels.csv``.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise CorpusLayoutError(f"field folder {root} does not exist or is not a folder")
    entries, empty = list_files(root, Layout("flat"))
    fraction = check_fraction(sample_fraction, sample_key)
    seen = [e for e in entries if not _is_metadata(e.rel_path)]
    # the corpus chapter's content-hash rule; files outside the layout are kept (they are quarantined)
    entries, dropped = sample_entries(root, seen, fraction, keep_cross_split_copies=False)
    not_sampled = pd.DataFrame({"row_id": [field_row_id(r, row_prefix) for r in dropped["rel_path"]],
                                **{c: dropped[c].tolist() for c in NOT_SAMPLED_COLUMNS[1:]}},
                               columns=NOT_SAMPLED_COLUMNS).sort_values("rel_path").reset_index(drop=True)
    probes = probe_all(root, [e.rel_path for e in entries], max_image_pixels, workers, progress)
    labels = read_labels(root)
    listed = {} if labels is None else {r.path: r for r in labels.itertuples(index=False)}
    masks = _mask_files(root)
    index = {name: i for i, name in enumerate(lab_classes)}

    rows, quarantined, left_out = [], [], []
    for entry, probe in zip(entries, probes, strict=True):
        rel, cls = entry.rel_path, entry.class_name
        reason, detail = entry.layout_reason, entry.layout_detail
        if reason is None and probe["decode_reason"] is not None:
            reason, detail = probe["decode_reason"], probe["error"]
        if cls is not None and cls not in index and entry.layout_reason not in ("os_junk", "hidden"):
            left_out.append({"rel_path": rel, "class_name": cls, "reason": LEFT_OUT_REASON})
            continue
        meta = listed.get(rel)
        if reason is None and meta is not None and meta.lab_class and meta.lab_class != cls:
            reason = LABEL_CONFLICT
            detail = f"labels.csv files it under {meta.lab_class!r}, its folder says {cls!r}"
        if reason is not None:
            quarantined.append({"row_id": field_row_id(rel, row_prefix), "rel_path": rel, "class_name": cls,
                                "reason": reason, "detail": detail})
            continue
        mask = masks.get(f"{cls}/{Path(rel).stem}")
        rows.append({"row_id": field_row_id(rel, row_prefix), "rel_path": rel, "class_name": cls,
                     "label": index[cls],
                     "source_label": meta.source_label if meta is not None and meta.source_label else cls,
                     "mask_rel_path": mask, "bytes": probe["bytes"], "sha256": probe["sha256"],
                     "width": probe["width"], "height": probe["height"]})

    frame = pd.DataFrame(rows, columns=ROW_COLUMNS).sort_values("rel_path").reset_index(drop=True)
    frame["label"] = frame["label"].astype(int)
    frame["mask_rel_path"] = frame["mask_rel_path"].astype(object).where(frame["mask_rel_path"].notna(), None)
    quarantine = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS).sort_values("rel_path")
    left = pd.DataFrame(left_out, columns=LEFT_OUT_COLUMNS).sort_values("rel_path")
    folders = {e.class_name for e in seen if e.class_name is not None} | {
        Path(e).name for e in empty if Path(e).name != MASKS_DIR}
    unmatched = sorted(folders - set(index))
    untested = [c for c in lab_classes if c not in set(frame["class_name"])]
    seen_paths = {e.rel_path for e in seen}
    seen_keys = {f"{e.class_name}/{Path(e.rel_path).stem}" for e in seen}
    reasons = Counter(quarantine["reason"])
    per_source: dict[str, dict[str, int]] = {}
    for (cls, source), n in frame.groupby(["class_name", "source_label"]).size().items():
        per_source.setdefault(cls, {})[source] = int(n)
    summary = {
        "files_seen": len(seen),
        "admitted": len(frame),
        "quarantined": len(quarantine),
        "left_out": len(left),
        "not_sampled": len(not_sampled),
        "identity_holds": len(seen) == len(frame) + len(quarantine) + len(left) + len(not_sampled),
        "sample": {"fraction": fraction, "key": sample_key, "rule": None if fraction is None else SAMPLE_RULE,
                   "sampled": len(entries),
                   "not_sampled_list": None if fraction is None else not_sampled_list},
        "quarantine_reasons": {r: reasons[r] for r in REASONS if reasons[r]},
        "per_class": {c: int(n) for c, n in frame["class_name"].value_counts().sort_index().items()},
        "per_source_label": per_source,
        "lab_classes": len(lab_classes),
        "matched_classes": len(frame["class_name"].unique()),
        "unmatched_classes": unmatched,
        "untested_classes": untested,
        "empty_class_folders": sorted(e for e in empty if Path(e).name != MASKS_DIR),
        "labels_csv": labels is not None,
        "labels_csv_entries": 0 if labels is None else len(labels),
        "labels_csv_without_file": sorted(set(listed) - seen_paths),
        "with_mask": int(frame["mask_rel_path"].notna().sum()),
        "masks_without_image": sorted(m for key, m in masks.items() if key not in seen_keys),
    }
    return FieldScan(root=root, rows=frame, quarantine=quarantine.reset_index(drop=True),
                     left_out=left.reset_index(drop=True), unmatched_classes=unmatched,
                     untested_classes=untested, summary=summary, not_sampled=not_sampled)
