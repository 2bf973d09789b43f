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

The scanner itself lives in :mod:`cropcop_utils.corpus.field_sets` (chapter 1 scans field-train photos
with it too) and is re-exported here; this module adds what belongs to the run's scored cohort.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.config import SYNTHETIC
from ..corpus.field_sets import (
    LABEL_CONFLICT,
    LABELS_NAME,
    LEFT_OUT_COLUMNS,
    LEFT_OUT_REASON,
    MASKS_DIR,
    NOT_SAMPLED,
    NOT_SAMPLED_COLUMNS,
    QUARANTINE_COLUMNS,
    REASONS,
    ROW_COLUMNS,
    SAMPLE_KEY,
    SAMPLE_RULE,
    FieldSampleError,
    FieldScan,
    check_fraction,
    field_row_id,
    read_labels,
    scan_field,
)

__all__ = [
    "LABELS_NAME", "LABEL_CONFLICT", "LEFT_OUT_COLUMNS", "LEFT_OUT_REASON", "MASKS_DIR", "NOT_SAMPLED",
    "NOT_SAMPLED_COLUMNS", "QUARANTINE_COLUMNS", "REASONS", "ROW_COLUMNS", "SAMPLE_KEY", "SAMPLE_RULE",
    "FieldSampleError", "FieldScan", "check_fraction", "field_root", "field_row_id", "read_labels",
    "sample_fraction", "scan_field",
]


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


def sample_fraction(ctx: Any) -> float | None:
    """The run's field sample fraction: the profile's ``field_transfer.sample_fraction`` for a real
    cohort; None for the synthetic one (generated at the profile's size, never sampled, like the
    synthetic corpus)."""
    fraction = check_fraction(ctx.section("field_transfer").get("sample_fraction"))
    return None if ctx.field == SYNTHETIC else fraction
