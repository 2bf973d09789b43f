"""The scan: list, sample, probe and quarantine every file under a corpus root and build the class map
(:func:`scan_corpus`), with the columns of the manifest and of the not-sampled list.

Sampling (``corpus.sample_fraction``, folder corpora only): a file whose content SHA-256, read as a
fraction of 2**256, is at or above the fraction is *not sampled*: listed in ``not_sampled.parquet``
instead of the manifest, so ``files_seen == admitted + quarantined + not_sampled``.  Byte-identical
copies share a hash, so they are in or out together; with ``corpus.sample_keeps_cross_split_copies``
every copy whose bytes also occur in another inherited split is kept, so the leakage the audit exists
to find is never sampled away.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.evidence import row_id as make_row_id
from ..core.evidence import sha256_file
from . import taxonomy
from .layout import NO_SPLIT, FileEntry, Layout, _storable, detect_layout, list_files
from .probe import _probe_inside
from .quarantine import CLASS_REASON, QUARANTINE_COLUMNS

MANIFEST_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "bytes", "sha256", "format",
                    "width", "height", "mode", "exif_orientation", "exif_make", "exif_model",
                    "decode_status", "error", "admitted", "quarantine_reason", "is_link"]
NOT_SAMPLED_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "bytes", "sha256"]


class CorpusSampleError(ValueError):
    """``corpus.sample_fraction`` is not a number in (0, 1] (or null for the whole corpus)."""


# --------------------------------------------------------------------------- scan
@dataclass
class ScanResult:
    root: Path
    layout: Layout
    manifest: pd.DataFrame
    quarantine: pd.DataFrame
    class_map: dict[str, Any]
    empty_class_folders: list[str]
    seconds: float
    workers: int
    not_sampled: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NOT_SAMPLED_COLUMNS))


def in_sample(sha256_hex: str, fraction: float | None) -> bool:
    """Whether content with this SHA-256 is in a ``fraction`` sample (None: everything is)."""
    # The hash read as a number in [0, 1): uniform, deterministic, equal for byte-identical copies.
    return fraction is None or int(sha256_hex, 16) < fraction * 2**256


def sample_entries(root: Path, entries: list[FileEntry], fraction: float | None,
                   keep_cross_split_copies: bool = True) -> tuple[list[FileEntry], pd.DataFrame]:
    """The entries the sample keeps, and the not-sampled in-layout files (hashed, listed)."""
    if fraction is None:
        return entries, pd.DataFrame(columns=NOT_SAMPLED_COLUMNS)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise CorpusSampleError(f"corpus.sample_fraction must be in (0, 1] or null, got {fraction!r}")
    hashed: dict[str, tuple[str, int]] = {}
    for entry in entries:
        if entry.layout_reason is None:
            try:
                path = root / entry.rel_path
                hashed[entry.rel_path] = (sha256_file(path), path.stat().st_size)
            except OSError:
                continue  # kept: the probe quarantines it as unreadable, with the error
    splits_of: dict[str, set[str]] = {}
    for entry in entries:
        if entry.rel_path in hashed:
            splits_of.setdefault(hashed[entry.rel_path][0], set()).add(entry.inherited_split)
    kept, left_out = [], []
    for entry in entries:
        sha, size = hashed.get(entry.rel_path, (None, None))
        if sha is None or in_sample(sha, float(fraction)) or (
                keep_cross_split_copies and len(splits_of[sha] - {NO_SPLIT}) > 1):
            kept.append(entry)
        else:
            rel_path = _storable(entry.rel_path)[0]
            left_out.append({"row_id": make_row_id(rel_path), "rel_path": rel_path,
                             "class_name": entry.class_name, "inherited_split": entry.inherited_split,
                             "bytes": size, "sha256": sha})
    return kept, pd.DataFrame(left_out, columns=NOT_SAMPLED_COLUMNS)


def scan_corpus(
    root: str | os.PathLike,
    min_class_support: int = 2,
    max_image_pixels: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    sample_fraction: float | None = None,
    keep_cross_split_copies: bool = True,
) -> ScanResult:
    """Scan, probe and quarantine every file under ``root`` (or its content-hash sample); build the
    class map."""
    root = Path(root).resolve()
    start = time.perf_counter()
    layout = detect_layout(root)
    entries, empty_classes = list_files(root, layout)
    entries, not_sampled = sample_entries(root, entries, sample_fraction, keep_cross_split_copies)
    probes = _probe_inside(root, entries, max_image_pixels, workers, progress)

    rows = []
    details = []
    for entry, probe in zip(entries, probes, strict=True):
        rel_path, utf8 = _storable(entry.rel_path)
        reason, detail = entry.layout_reason, entry.layout_detail
        if reason is None and not utf8:
            reason, detail = "unreadable", "file name is not valid UTF-8; rename the file"
        if reason is None and probe["decode_reason"] is not None:
            reason, detail = probe["decode_reason"], probe["error"]
        row = {k: probe[k] for k in MANIFEST_COLUMNS if k in probe}
        rows.append({**row, "row_id": make_row_id(rel_path), "rel_path": rel_path,
                     "class_name": None if entry.class_name is None else _storable(entry.class_name)[0],
                     "inherited_split": entry.inherited_split, "quarantine_reason": reason,
                     "is_link": entry.is_link})
        details.append(detail)
    manifest = pd.DataFrame(rows)
    manifest["detail"] = details

    # Class support counts only the files that passed every file-level check.
    eligible = manifest[manifest["quarantine_reason"].isna() & manifest["class_name"].notna()]
    support = eligible.groupby("class_name").size()
    weak = support[support < min_class_support]
    weak_rows = manifest["quarantine_reason"].isna() & manifest["class_name"].isin(weak.index)
    manifest.loc[weak_rows, "quarantine_reason"] = CLASS_REASON
    manifest.loc[weak_rows, "detail"] = manifest.loc[weak_rows, "class_name"].map(
        lambda c: f"class {c!r} has {int(support[c])} admissible image(s) < corpus.min_class_support "
                  f"{min_class_support}")
    manifest["admitted"] = manifest["quarantine_reason"].isna()
    manifest = _typed_manifest(manifest)

    quarantine = manifest.loc[~manifest["admitted"]].rename(columns={"quarantine_reason": "reason"})
    quarantine = quarantine[QUARANTINE_COLUMNS].reset_index(drop=True)
    manifest = manifest[MANIFEST_COLUMNS]

    admitted_support = support[support >= min_class_support]
    weak_classes = [{"name": c, "reason": CLASS_REASON, "support": int(n)} for c, n in weak.items()]
    classes_with_files = set(manifest["class_name"].dropna())
    weak_classes += [{"name": c, "reason": CLASS_REASON, "support": 0}
                     for c in sorted(({Path(e).name for e in empty_classes} | classes_with_files)
                                     - set(support.index))]
    class_map = taxonomy.build_class_map(admitted_support.to_dict(), weak_classes)
    return ScanResult(root=root, layout=layout, manifest=manifest, quarantine=quarantine,
                      class_map=class_map, empty_class_folders=empty_classes,
                      seconds=time.perf_counter() - start,
                      workers=max(1, int(workers or os.cpu_count() or 1)), not_sampled=not_sampled)


def _typed_manifest(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values("rel_path", kind="stable").reset_index(drop=True)
    for column in ("bytes", "width", "height", "exif_orientation"):
        frame[column] = pd.array(frame[column], dtype="Int64")
    for column in ("class_name", "sha256", "format", "mode", "exif_make", "exif_model", "error",
                   "quarantine_reason", "detail"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    frame["admitted"] = frame["admitted"].astype(bool)
    frame["is_link"] = frame["is_link"].astype(bool)
    return frame
