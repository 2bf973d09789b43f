"""Field-train photos (``--field-train``): labelled field photographs the run may train and select on,
scanned in chapter 1 by the corpus rules against the lab class map.

The folder has the field layout (:mod:`.field_sets`: ``<lab class>/<images>``, optional ``labels.csv``).
Every file is admitted (``corpus/field_train.parquet``), quarantined (``corpus/field_train_quarantine
.parquet``: the corpus chapter's file-level reasons plus ``labels_csv_conflict``), left out
(``corpus/field_train_left_out.parquet``: a folder with no lab class) or, under
``corpus.field_train_sample_fraction`` (when the profile does not set it: ``corpus.sample_fraction``, the lab
corpus's content-hash sample, so a sampled book samples both sources alike), not sampled
(``corpus/field_train_not_sampled.parquet``).  Row ids are ``row_id("field_train/<rel_path>")``; labels
are indices in ``corpus/class_map.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.evidence import Chapter, sha256_json
from ..core.sources import FIELD_TRAIN
from .field_sets import FieldScan, scan_field

ROWS = "corpus/field_train.parquet"
QUARANTINE = "corpus/field_train_quarantine.parquet"
LEFT_OUT = "corpus/field_train_left_out.parquet"
NOT_SAMPLED = "corpus/field_train_not_sampled.parquet"
ROW_COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label", "sha256", "width", "height"]
SAMPLE_KEY = "corpus.sample_fraction"


def lab_class_names(class_map: dict[str, Any]) -> list[str]:
    """The lab class map's names in label order."""
    return [c["name"] for c in sorted(class_map["classes"], key=lambda c: c["index"])]


def scan_field_train(root: str | Path, class_map: dict[str, Any], max_image_pixels: int | None = None,
                     workers: int | None = 1, progress: bool = False,
                     sample_fraction: float | None = None, sample_key: str = SAMPLE_KEY) -> FieldScan:
    """Scan a field-train folder against the lab class map (label = the class map's index)."""
    return scan_field(root, lab_class_names(class_map), max_image_pixels, workers, progress, sample_fraction,
                      row_prefix=FIELD_TRAIN, sample_key=sample_key, not_sampled_list=NOT_SAMPLED)


def write_field_train(ch: Chapter, scan: FieldScan, class_map: dict[str, Any]) -> dict[str, Any]:
    """Write the scan's tables and return the ``field_train`` block of ``corpus/corpus.json``."""
    rows = scan.rows[ROW_COLUMNS]
    ch.write_parquet(ROWS, rows)
    ch.write_parquet(QUARANTINE, scan.quarantine)
    ch.write_parquet(LEFT_OUT, scan.left_out)
    sampled = scan.summary["sample"]["fraction"] is not None
    if sampled:
        ch.write_parquet(NOT_SAMPLED, scan.not_sampled)
    summary = scan.summary
    return {
        "folder": str(scan.root),
        "source": FIELD_TRAIN,
        **{k: summary[k] for k in ("files_seen", "admitted", "quarantined", "left_out", "not_sampled",
                                   "identity_holds", "sample", "quarantine_reasons", "per_class",
                                   "per_source_label", "lab_classes", "matched_classes", "unmatched_classes",
                                   "untested_classes", "empty_class_folders", "labels_csv",
                                   "labels_csv_entries", "labels_csv_without_file")},
        "class_map_fingerprint": class_map["fingerprint"],
        "fingerprint": sha256_json(sorted(zip(rows["rel_path"], rows["sha256"], strict=True))),
        "files": {"rows": ROWS, "quarantine": QUARANTINE, "left_out": LEFT_OUT,
                  "not_sampled": NOT_SAMPLED if sampled else None},
    }


def run_field_train(ctx: Any, ch: Chapter, class_map: dict[str, Any], workers: int | None,
                    progress: bool) -> dict[str, Any] | None:
    """Chapter 1's field-train pass: None when the run has no ``--field-train`` folder."""
    if ctx.field_train_root is None:
        return None
    settings = ctx.section("corpus")
    name = "field_train_sample_fraction" if "field_train_sample_fraction" in settings else "sample_fraction"
    scan = scan_field_train(ctx.field_train_root, class_map, settings.get("max_image_pixels"), workers,
                            progress, settings.get(name), f"corpus.{name}")
    return write_field_train(ch, scan, class_map)
