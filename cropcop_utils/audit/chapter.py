"""Chapter 2 — Audit: which images are the same picture, or the same specimen, and does that leak?

Relationships between admitted images, strongest first:

* ``exact_bytes`` — identical files (the manifest's SHA-256).
* ``exact_pixels`` — different files, identical decoded pixels (same image re-saved with other metadata):
  SHA-256 of the RGB array (after EXIF orientation) and its size.
* ``near`` — candidate-then-verify.  64-bit pHash (and dHash as a second opinion, both ``imagehash``)
  propose pairs: every pair within ``audit.table_radius`` (the exact all-pairs search of
  :mod:`cropcop_utils.hamming`), capped at ``audit.max_neighbours`` nearest partners per image (by
  pHash, then dHash) so uniform backdrops cannot flood the verifier.  :mod:`cropcop_utils.verifier`
  then scores each candidate with a registered, subject-weighted SSIM; only pairs within
  ``audit.phash_radius`` whose score reaches ``audit.verify_threshold`` are *trusted*.  Both scores are
  recorded either way.

A pair is recorded once, with its strongest kind.  Near candidates are searched between distinct pixel
contents only (a byte copy adds no information) and expanded back to every file holding them.

Trusted relationships form leakage groups (connected components, ``scipy.sparse.csgraph``).  The
inherited partition (the corpus's own train/val/test folders) is rejected when any trusted relationship
crosses it.  On the synthetic corpus every figure is checked against the planted truth.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..evidence import Chapter
from . import verifier
from .candidates import NearCandidates, near_candidates
from .errors import AuditInputError
from .figures import (
    gallery_sample,
    plot_group_sizes,
    plot_pair_gallery,
    plot_threshold_evidence,
    plot_verifier_calibration,
)
from .hashing import HASH_COLUMNS, ImageHashes, hash_images
from .relations import (
    PixelGroups,
    crossing_counts,
    exact_pairs,
    group_stats,
    inherited_decision,
    leakage_groups,
    relationship_table,
)
from .truth import (
    Truth,
    calibrated_threshold,
    family_recall,
    radius_reason,
    threshold_table,
    verifier_calibration,
)

DEFAULTS: dict[str, Any] = {
    "hash_size": 8,           # 8x8 = 64-bit pHash / dHash
    "workers": None,          # hashing processes (None: all cores)
    "phash_radius": 12,       # near candidates trusted up to this pHash distance (evidence in the chapter)
    "table_radius": 16,       # the threshold table covers pHash radius 0..table_radius
    "max_neighbours": 4,      # candidates kept per image (nearest by pHash, then dHash)
    "verify_threshold": 0.87,  # verifier score that confirms a candidate (calibrated on synthetic truth)
    "verify_batch": 512,
    "gallery_pairs": 12,
}


# --------------------------------------------------------------------------- settings
def settings(ctx_or_section: Any) -> dict[str, Any]:
    """The ``audit`` profile section over :data:`DEFAULTS`, validated."""
    section = ctx_or_section.section("audit") if hasattr(ctx_or_section, "section") else ctx_or_section
    merged = {**DEFAULTS, **(section or {})}
    unknown = set(merged) - set(DEFAULTS)
    if unknown:
        raise AuditInputError(f"unknown audit setting(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    if merged["hash_size"] != 8:
        raise AuditInputError("audit.hash_size must be 8: the pair search works on 64-bit hashes")
    if not 0 <= merged["phash_radius"] <= merged["table_radius"] < 64:
        raise AuditInputError("audit radii must satisfy 0 <= phash_radius <= table_radius < 64, got "
                              f"{merged['phash_radius']} and {merged['table_radius']}")
    if int(merged["max_neighbours"]) < 1:
        raise AuditInputError("audit.max_neighbours must be at least 1")
    return merged


# --------------------------------------------------------------------------- the chapter
MANIFEST_NEEDS = ("row_id", "rel_path", "class_name", "inherited_split", "sha256", "admitted")


def admitted_rows(manifest: pd.DataFrame) -> pd.DataFrame:
    """The manifest's admitted rows, in manifest order, with the columns the audit needs."""
    missing = [c for c in MANIFEST_NEEDS if c not in manifest.columns]
    if missing:
        raise AuditInputError(f"corpus/manifest.parquet lacks column(s) {missing}; rerun chapter 'corpus'")
    rows = manifest[manifest["admitted"].astype(bool)].reset_index(drop=True)
    if rows.empty:
        raise AuditInputError("corpus/manifest.parquet admits no image: nothing to audit; check the corpus")
    return rows[list(MANIFEST_NEEDS)]


@dataclass
class AuditResult:
    """Everything the audit computes for one corpus (``run_chapter`` writes it to the run folder)."""

    rows: pd.DataFrame
    hashes: ImageHashes
    exact: pd.DataFrame
    pixel_groups: PixelGroups
    candidates: NearCandidates
    relationships: pd.DataFrame
    groups: pd.DataFrame
    stats: dict[str, Any]
    crossings: dict[str, int]
    decision: dict[str, Any]
    table: pd.DataFrame
    calibration: pd.DataFrame
    truth: Truth | None
    settings: dict[str, Any]

    def hash_table(self) -> pd.DataFrame:
        return pd.DataFrame({"row_id": self.rows["row_id"], "phash": self.hashes.phash,
                             "dhash": self.hashes.dhash,
                             "pixel_sha256": self.hashes.pixel_sha256})[HASH_COLUMNS]

    def truth_check(self, truth_json: dict[str, Any]) -> dict[str, Any]:
        """Trusted relationships against the planted truth (recall per kind, precision, families)."""
        from .. import synthetic

        assert self.truth is not None
        index = {r: k for k, r in enumerate(self.rows["rel_path"])}
        trusted = self.relationships[self.relationships["trusted"]]
        pairs = {(min(index[a], index[b]), max(index[a], index[b])): kind
                 for a, b, kind in zip(trusted["rel_path_a"], trusted["rel_path_b"], trusted["kind"],
                                       strict=True)}
        near = {pair for pair, kind in pairs.items() if kind == "near"}
        planted_conflicts = synthetic.label_conflicts(truth_json)
        conflicts = trusted[trusted["label_conflict"]]
        found = {frozenset(pair)
                 for pair in zip(conflicts["rel_path_a"], conflicts["rel_path_b"], strict=True)}
        return {**self.truth.evaluate(set(pairs), near),
                "reshot_families": family_recall(truth_json, self.rows["rel_path"].tolist(), self.groups),
                "label_conflicts_planted": len(planted_conflicts),
                "label_conflicts_found": len(planted_conflicts & found),
                "calibrated_threshold": calibrated_threshold(self.calibration)}


def audit_corpus(
    rows: pd.DataFrame,
    corpus_root: str | os.PathLike,
    cfg: dict[str, Any] | None = None,
    workers: int | None = None,
    progress: bool = False,
    truth_json: dict[str, Any] | None = None,
    max_image_pixels: int | None = None,
) -> AuditResult:
    """The whole audit of admitted ``rows`` (row_id, rel_path, class_name, inherited_split, sha256)."""
    cfg = settings(cfg or {})
    workers = int(workers or cfg["workers"] or os.cpu_count() or 1)
    radius, threshold = int(cfg["phash_radius"]), float(cfg["verify_threshold"])
    rows = rows.reset_index(drop=True)
    hashes = hash_images(corpus_root, rows["rel_path"], rows["sha256"], workers, progress, max_image_pixels)
    exact = exact_pairs(rows["sha256"], hashes.pixel_sha256)
    pixel_groups = PixelGroups.from_digests(hashes.pixel_sha256)
    candidates = near_candidates(hashes, pixel_groups.representatives, int(cfg["table_radius"]),
                                 int(cfg["max_neighbours"]), int(cfg["verify_batch"]), progress, workers)
    score = np.full(len(candidates.pairs), -np.inf)
    score[candidates.capped] = candidates.scores.score
    chosen = candidates.capped & (candidates.phash_distance <= radius)
    near_pairs, source = pixel_groups.expand(candidates.pairs[chosen])
    relationships = relationship_table(rows, hashes, exact, near_pairs, score[chosen][source], threshold)
    groups = leakage_groups(rows["row_id"], relationships)
    stats = group_stats(groups, rows)
    crossings = crossing_counts(relationships)
    truth = Truth.from_planted(truth_json, rows["rel_path"].tolist()) if truth_json is not None else None
    table = threshold_table(candidates, pixel_groups, exact, threshold, int(cfg["table_radius"]), truth)
    calibration = verifier_calibration(candidates, pixel_groups, exact, radius, truth)
    return AuditResult(rows, hashes, exact, pixel_groups, candidates, relationships, groups, stats, crossings,
                       inherited_decision(rows, crossings, stats), table, calibration, truth, cfg)


def run_chapter(ctx: Any, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Audit the admitted corpus: write ``audit/{hashes,relationships,groups,threshold_table,
    verifier_calibration}.parquet``, the gallery and plots, and ``audit/audit.json``."""
    import matplotlib.pyplot as plt

    started = time.perf_counter()
    ch = Chapter(ctx.run_dir, "audit")
    cfg = settings(ctx)
    rows = admitted_rows(ch.read_parquet("corpus/manifest.parquet"))
    truth_json = None
    if ctx.is_synthetic:
        from .. import synthetic
        from ..evidence import sha256_file

        truth_json = synthetic.load_truth(ctx.planted_truth_path)
        ch.inputs["synthetic/planted.json"] = sha256_file(ctx.planted_truth_path)
    result = audit_corpus(rows, ctx.corpus_root, cfg, workers, progress, truth_json,
                          ctx.section("corpus").get("max_image_pixels"))
    radius, threshold = int(cfg["phash_radius"]), float(cfg["verify_threshold"])
    ch.write_parquet("audit/hashes.parquet", result.hash_table())
    ch.write_parquet("audit/relationships.parquet", result.relationships)
    ch.write_parquet("audit/groups.parquet", result.groups)
    ch.write_parquet("audit/threshold_table.parquet", result.table)
    ch.write_parquet("audit/verifier_calibration.parquet", result.calibration)

    sample = gallery_sample(result.relationships, int(cfg["gallery_pairs"]))
    plots = {"gallery": ("audit/gallery.png", plot_pair_gallery(sample, ctx.corpus_root, threshold)),
             "group_sizes": ("audit/group_sizes.png", plot_group_sizes(result.groups)),
             "threshold_evidence": ("audit/threshold_evidence.png",
                                    plot_threshold_evidence(result.table, radius))}
    if result.truth is not None:
        plots["verifier_calibration"] = ("audit/verifier_calibration.png",
                                         plot_verifier_calibration(result.calibration, threshold))
    for rel_path, figure in plots.values():
        ch.save_figure(figure, rel_path, dpi=100)
        plt.close(figure)

    relationships, candidates, hashes = result.relationships, result.candidates, result.hashes
    trusted = relationships[relationships["trusted"]]
    conflicts = trusted[trusted["label_conflict"]]
    near = relationships["kind"] == "near"
    seconds = time.perf_counter() - started
    figures = {
        "rows_audited": int(len(rows)),
        "distinct_pixel_contents": int(len(result.pixel_groups.representatives)),
        "relationships": {
            "exact_bytes": int((relationships["kind"] == "exact_bytes").sum()),
            "exact_pixels": int((relationships["kind"] == "exact_pixels").sum()),
            "near_trusted": int((near & relationships["trusted"]).sum()),
            "near_rejected": int((near & ~relationships["trusted"]).sum()),
            "trusted": int(len(trusted)),
        },
        "label_conflicts": {
            "count": int(len(conflicts)),
            "pairs": conflicts[["rel_path_a", "class_a", "rel_path_b", "class_b", "kind"]].head(200)
            .to_dict("records"),
        },
        "groups": result.stats,
        "crossings": result.crossings,
        "inherited_partition": result.decision,
        "chosen_radius": {"phash_radius": radius, "reason": radius_reason(result.table, radius, threshold),
                          "evidence": "audit/threshold_table.parquet"},
        "verifier": {"threshold": threshold, "max_neighbours": int(cfg["max_neighbours"]),
                     "candidate_radius": int(cfg["table_radius"]), "thumbnail": verifier.THUMB,
                     "angles": list(verifier.ANGLES), "scales": list(verifier.SCALES),
                     "candidates_found": int(len(candidates.pairs)),
                     "candidates_verified": int(candidates.capped.sum())},
        "synthetic": result.truth_check(truth_json) if truth_json is not None else None,
        "gallery": sample[["rel_path_a", "rel_path_b", "phash_distance", "dhash_distance", "verify_score",
                           "trusted"]].to_dict("records"),
        "plots": {name: rel for name, (rel, _) in plots.items()},
        "timings": {
            "hashing_seconds": round(hashes.seconds, 2), "hashing_workers": hashes.workers,
            "images_per_second": round(len(rows) / hashes.seconds, 1) if hashes.seconds else None,
            "pair_search_seconds": round(candidates.search_seconds, 2),
            "verify_seconds": round(candidates.verify_seconds, 2), "total_seconds": round(seconds, 2),
        },
        "settings": cfg,
    }
    return ch.finish(figures=figures)
