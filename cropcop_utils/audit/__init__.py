"""Chapter 2 — Audit: which images are the same picture, or the same specimen, and does that leak?

The chapter's code, by topic:

* :mod:`.config` — the ``audit`` profile section over :data:`DEFAULTS`, validated.
* :mod:`.corpus_audit` — the whole audit of a corpus (:func:`audit_corpus`): admitted rows, hashes,
  candidates and verifiers, relationships, groups and the evidence tables (:class:`AuditResult`).
* :mod:`.chapter` — ``run_chapter``: writes ``audit/`` (tables, plots, ``audit.json``).
* :mod:`.cross_sets` — the lab, field-train and field cohorts audited as one corpus (:func:`audit_sets`): the
  relationships across sets, their groups and the ``cross_sets`` block; :mod:`.cross_chapter` gathers a
  run's sets and writes ``audit/cross_*``.
* :mod:`.hashing` — per-image fingerprints: content digests, pHash / dHash, verifier thumbnails.
* :mod:`.pairs` — every pair of 64-bit hashes within a Hamming radius (multi-index hashing).
* :mod:`.candidates` — near candidates, capped per image, and their verifier scores.
* :mod:`.verifier` — the registered, subject-weighted SSIM that confirms or refutes a candidate.
* :mod:`.geometry` — ORB + RANSAC homography: the verifier for turned, sheared and warped copies.
* :mod:`.leaf_align` — the two leaves laid on each other by their silhouettes, then SSIM.
* :mod:`.reshot` — SIFT on the leaf and one similarity: the same leaf photographed again;
  :mod:`.reshot_report` says what it did on a corpus.
* :mod:`.relations` — exact pairs, pixel groups, the relationship table, leakage groups, the decision.
* :mod:`.truth` — the synthetic corpus's planted truth and the evidence for radius and thresholds.
* :mod:`.figures` — the gallery and plots.
* :mod:`.verdicts` — the review list as a sheet to fill (``audit/review.csv``) and a reviewer's verdicts
  given back (``audit.review_verdicts``): ``same`` pairs trusted before the groups form.
* :mod:`.chapter_prose` and :mod:`.cross_prose` — the chapter's paragraphs, rendered from ``audit.json``.
"""

from .candidates import NearCandidates, cap_neighbours, near_candidates
from .chapter import run_chapter
from .chapter_prose import (
    by_source_table,
    by_source_text,
    leaf_calibration_text,
    recall_table,
    recall_text,
    relationships_text,
    review_text,
    thresholds_without_truth_text,
    timings_text,
    truth_text,
    verdicts_text,
)
from .config import DEFAULTS, settings
from .corpus_audit import MANIFEST_NEEDS, AuditResult, admitted_rows, audit_corpus
from .cross_prose import cross_sets_table, cross_sets_text
from .cross_sets import AuditSet, CrossAudit, audit_sets
from .errors import AuditInputError
from .hashing import HASH_COLUMNS, ImageHashes, fingerprint_image, hash_images, pixel_digest
from .relations import (
    KINDS,
    NO_SPLIT,
    RELATIONSHIP_COLUMNS,
    PixelGroups,
    crossing_counts,
    exact_pairs,
    group_stats,
    inherited_decision,
    leakage_groups,
    relationship_table,
)
from .reshot_report import reshot_text
from .truth import Truth, calibrated_threshold, family_recall, radius_reason, threshold_table
from .verdicts import apply_verdicts, read_verdicts, review_sheet

__all__ = [
    "DEFAULTS", "HASH_COLUMNS", "KINDS", "MANIFEST_NEEDS", "NO_SPLIT", "RELATIONSHIP_COLUMNS",
    "AuditInputError", "AuditResult", "AuditSet", "CrossAudit", "ImageHashes", "NearCandidates",
    "PixelGroups", "Truth", "admitted_rows", "audit_corpus", "audit_sets", "by_source_table",
    "by_source_text", "calibrated_threshold",
    "cap_neighbours", "cross_sets_table", "cross_sets_text", "crossing_counts", "leaf_calibration_text",
    "recall_table", "recall_text", "relationships_text", "review_text", "thresholds_without_truth_text",
    "timings_text", "truth_text", "verdicts_text", "apply_verdicts", "read_verdicts", "review_sheet",
    "exact_pairs", "family_recall", "fingerprint_image", "group_stats", "hash_images", "inherited_decision",
    "leakage_groups", "near_candidates", "pixel_digest", "radius_reason", "relationship_table", "run_chapter",
    "reshot_text", "settings", "threshold_table",
]
