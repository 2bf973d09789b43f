"""The field cohort: photographs of the lab classes taken in the field, scanned under the corpus contract.

Layout (``--field PATH``)::

    PATH/<lab class>/<image>            one folder per lab class, named exactly as the lab class
    PATH/labels.csv                     optional: path,source_label,lab_class (path relative to PATH)
    PATH/masks/<lab class>/<stem>.png   optional: the leaf's true mask (white = leaf) of <class>/<stem>.*

Every file under ``PATH`` except ``labels.csv`` and ``masks/`` is *seen* and ends in exactly one of
four places, so ``files_seen == admitted + quarantined + left_out + not_sampled``:

* **quarantined** — the corpus chapter's file checks and reasons (:mod:`cropcop_utils.corpus`:
  ``os_junk``, ``hidden``, ``outside_layout``, ``zero_byte``, ``not_an_image``, ``decompression_bomb``,
  ``truncated``, ``unreadable``), decoded exactly as :mod:`cropcop_utils.core.imaging` decodes for a model;
  plus ``labels_csv_conflict`` (``labels.csv`` files it under another lab class than its folder).
* **left out** — a file in a class folder with no lab counterpart (``no_lab_class``); such folders are
  listed in ``unmatched_classes``.
* **admitted** — a row of ``rows`` with its lab label.
* **not sampled** — only with ``field_transfer.sample_fraction`` (a real cohort; the synthetic one is
  generated at the profile's size and never sampled): the file's content SHA-256 falls outside the
  fraction, by the corpus chapter's rule (:func:`cropcop_utils.corpus.in_sample`), so byte-identical
  copies are kept or dropped together and the same files are kept on every run.  Each is listed, with
  its hash, in ``not_sampled`` (``field/not_sampled.parquet``).

Lab classes with no admitted field image are ``untested_classes``: nothing is known about them outside
the lab.  ``source_label`` keeps the source's own label (``labels.csv``), so a class mapped by symptom
(Plant Pathology's ``frog_eye_leaf_spot`` filed under ``Apple_Black_rot``) can be reported on its own.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .. import corpus
from ..core.config import SYNTHETIC
from ..core.evidence import row_id as make_row_id
from ..corpus.scan import sample_entries

LABELS_NAME = "labels.csv"
MASKS_DIR = "masks"
LEFT_OUT_REASON = "no_lab_class"
LABEL_CONFLICT = "labels_csv_conflict"
# The corpus chapter's file-level reasons (class support does not apply: a field class is not trained).
REASONS = tuple(r for r in corpus.REASONS if r != corpus.CLASS_REASON) + (LABEL_CONFLICT,)
ROW_COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label", "mask_rel_path", "bytes",
               "sha256", "width", "height"]
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "reason", "detail"]
LEFT_OUT_COLUMNS = ["rel_path", "class_name", "reason"]
NOT_SAMPLED_COLUMNS = ["row_id", "rel_path", "class_name", "bytes", "sha256"]
NOT_SAMPLED = "field/not_sampled.parquet"
SAMPLE_KEY = "field_transfer.sample_fraction"
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


def field_root(ctx: Any) -> Path | None:
    """The run's field cohort folder (the synthetic one is generated with the corpus), or None."""
    root = ctx.field_root
    if root is None:
        return None
    if ctx.field == SYNTHETIC:
        from .. import synthetic

        synthetic.ensure_corpus(ctx)
    if not root.is_dir():
        raise FileNotFoundError(f"field cohort folder {root} does not exist")
    return root


def check_fraction(fraction: Any) -> float | None:
    """``field_transfer.sample_fraction`` as a float, or None (the whole cohort); refuses anything else."""
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise FieldSampleError(f"{SAMPLE_KEY} must be in (0, 1] or null, got {fraction!r}")
    return float(fraction)


def sample_fraction(ctx: Any) -> float | None:
    """The run's field sample fraction: the profile's ``field_transfer.sample_fraction`` for a real
    cohort; None for the synthetic one (generated at the profile's size, never sampled, like the
    synthetic corpus)."""
    fraction = check_fraction(ctx.section("field_transfer").get("sample_fraction"))
    return None if ctx.field == SYNTHETIC else fraction


def field_row_id(rel_path: str) -> str:
    """Row identity of a field image; prefixed so it never equals a lab row id of the same path."""
    return make_row_id(f"field/{rel_path}")


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
) -> FieldScan:
    """Scan every file of a field cohort (or its content-hash ``sample_fraction``) and match its class
    folders to ``lab_classes`` (label = index).

    Raises :class:`FieldSampleError` for a fraction outside (0, 1],
    :class:`cropcop_utils.corpus.CorpusLayoutError` when the folder holds no image at ``<class>/<image>``
    and ``ValueError`` for an unreadable ``labels.csv``.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise corpus.CorpusLayoutError(f"field cohort folder {root} does not exist or is not a folder")
    entries, empty = corpus.list_files(root, corpus.Layout("flat"))
    fraction = check_fraction(sample_fraction)
    seen = [e for e in entries if not _is_metadata(e.rel_path)]
    # the corpus chapter's content-hash rule; files outside the layout are kept (they are quarantined)
    entries, dropped = sample_entries(root, seen, fraction, keep_cross_split_copies=False)
    not_sampled = pd.DataFrame({"row_id": [field_row_id(r) for r in dropped["rel_path"]],
                                **{c: dropped[c].tolist() for c in NOT_SAMPLED_COLUMNS[1:]}},
                               columns=NOT_SAMPLED_COLUMNS).sort_values("rel_path").reset_index(drop=True)
    probes = corpus.probe_all(root, [e.rel_path for e in entries], max_image_pixels, workers, progress)
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
            quarantined.append({"row_id": field_row_id(rel), "rel_path": rel, "class_name": cls,
                                "reason": reason, "detail": detail})
            continue
        mask = masks.get(f"{cls}/{Path(rel).stem}")
        rows.append({"row_id": field_row_id(rel), "rel_path": rel, "class_name": cls, "label": index[cls],
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
        "sample": {"fraction": fraction, "key": SAMPLE_KEY, "rule": None if fraction is None else SAMPLE_RULE,
                   "sampled": len(entries),
                   "not_sampled_list": None if fraction is None else NOT_SAMPLED},
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
