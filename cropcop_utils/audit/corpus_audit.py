"""The whole audit of one corpus (:func:`audit_corpus`): which images are the same picture, or the same
specimen, and does that leak?  :mod:`.chapter` writes what it finds to the run folder.

Relationships between admitted images, strongest first:

* ``exact_bytes`` — identical files (the manifest's SHA-256).
* ``exact_pixels`` — different files, identical decoded pixels (same image re-saved with other metadata):
  SHA-256 of the RGB array (after EXIF orientation) and its size.
* ``near`` — candidate-then-verify.  Five sources propose pairs (:mod:`.candidates`): pHash within
  ``audit.phash_radius`` (searched to ``audit.table_radius`` for the threshold table), the pHash of the
  eight flips and quarter turns within ``audit.dihedral_radius``, nearest neighbours in the ImageNet
  EfficientNet-Lite0 embedding (``audit.embedding_k``, ``audit.embedding_min_cosine``) and nearest
  neighbours by a turn-invariant ring spectrum (``audit.rings_k``, ``audit.rings_min_correlation``)
  and by a bag of ORB visual words (``audit.words_k``, ``audit.words_vocabulary``);
  pHash and dihedral candidates are capped at ``audit.max_neighbours`` partners per image.  Four
  verifiers score the candidates: the registered, subject-weighted SSIM (:mod:`.verifier`,
  ``audit.verify_threshold``), ORB + RANSAC homography inliers confirmed by the SSIM after alignment
  (:mod:`.geometry`, ``audit.geometry_min_inliers``, ``audit.geometry_min_ratio``,
  ``audit.geometry_min_ssim``) and, for pairs neither accepts, the SSIM of the two leaves laid on each
  other by their silhouettes (:mod:`.leaf_align`, ``audit.leaf_min_ssim``), and, for open pairs with some
  evidence, SIFT on the leaf fitted by one similarity (:mod:`.reshot`, ``audit.reshot_*``: the same leaf
  photographed again).  A proposed pair that any
  verifier accepts is *trusted*; every score, and who proposed and who confirmed it, is recorded either
  way.

A pair is recorded once, with its strongest kind.  Near candidates are searched between distinct pixel
contents only (a byte copy adds no information) and expanded back to every file holding them.

Trusted relationships form leakage groups (connected components, ``scipy.sparse.csgraph``).  The
inherited partition (the corpus's own train/val/test folders) is rejected when any trusted relationship
crosses it.  On the synthetic corpus every figure is checked against the planted truth, per planted
kind and per candidate source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .candidates import NearCandidates, near_candidates
from .config import settings
from .errors import AuditInputError
from .hashing import HASH_COLUMNS, ImageHashes, hash_images
from .relations import (
    NEAR_COLUMNS,
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
    decision_settings,
    family_recall,
    geometry_calibration,
    leaf_calibration,
    recall_by_source,
    reshot_calibration,
    threshold_table,
    verifier_calibration,
)
from .verdicts import apply_verdicts

# --------------------------------------------------------------------------- the whole audit
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


def near_table(candidates: NearCandidates, groups: PixelGroups, cfg: dict[str, Any]) -> pd.DataFrame:
    """Every proposed near pair expanded to file positions (``i``, ``j``) with :data:`NEAR_COLUMNS`."""
    decision = decision_settings(cfg)
    chosen = candidates.any_source
    accepted = candidates.accepted(*decision)
    geo = candidates.geometry
    done = geo.done

    def asked(values: np.ndarray, dtype: str) -> pd.api.extensions.ExtensionArray:
        return pd.array(np.where(done, values, None), dtype=dtype)

    per_pair = pd.DataFrame({
        "proposed_by": candidates.proposed_by(), "verified_by": candidates.verified_by(*decision),
        "dihedral_distance": candidates.dihedral_distance,
        "dihedral_transform": candidates.dihedral_transform,
        "cosine": pd.array(np.where(np.isnan(candidates.cosine), None, candidates.cosine), dtype="Float64"),
        "verify_score": pd.array(np.where(candidates.scored, candidates.ssim, None), dtype="Float64"),
        "geometry_matches": asked(geo.matches, "Int64"), "geometry_inliers": asked(geo.inliers, "Int64"),
        "geometry_ratio": asked(geo.ratio, "Float64"), "geometry_mirrored": asked(geo.mirrored, "boolean"),
        "geometry_ssim": pd.array(np.where(np.isnan(candidates.aligned_ssim), None, candidates.aligned_ssim),
                                  dtype="Float64"),
        "leaf_ssim": pd.array(np.where(np.isnan(candidates.leaf_ssim), None, candidates.leaf_ssim),
                              dtype="Float64"),
        **reshot_columns(candidates),
        "trusted": accepted,
    })[chosen].reset_index(drop=True)
    expanded, source = groups.expand(candidates.pairs[chosen])
    near = per_pair.iloc[source].reset_index(drop=True)
    near.insert(0, "j", expanded[:, 1] if len(expanded) else np.zeros(0, np.int64))
    near.insert(0, "i", expanded[:, 0] if len(expanded) else np.zeros(0, np.int64))
    return near[["i", "j", *NEAR_COLUMNS]]


def reshot_columns(candidates: NearCandidates) -> dict[str, pd.api.extensions.ExtensionArray]:
    """The re-shot verifier's record per candidate pair (null where it was not asked)."""
    scores = candidates.reshot
    done = scores.done

    def asked(values: np.ndarray, dtype: str) -> pd.api.extensions.ExtensionArray:
        return pd.array(np.where(done & np.isfinite(values.astype(float)), values, None), dtype=dtype)

    return {"reshot_matches": asked(scores.matches, "Int64"),
            "reshot_inliers": asked(scores.inliers, "Int64"),
            "reshot_scale": asked(scores.scale, "Float64"), "reshot_angle": asked(scores.angle, "Float64"),
            "reshot_mirrored": pd.array(np.where(done, scores.mirrored, None), dtype="boolean")}


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
    by_source: pd.DataFrame | None = None
    geometry_table: pd.DataFrame | None = None
    leaf_table: pd.DataFrame | None = None
    reshot_table: pd.DataFrame | None = None
    seconds: dict[str, float] | None = None
    verdicts: dict[str, Any] | None = None  # what a reviewer's verdicts changed (:mod:`.verdicts`)

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
    hashes: ImageHashes | None = None,
    verdicts: pd.DataFrame | None = None,
) -> AuditResult:
    """The whole audit of admitted ``rows`` (row_id, rel_path, class_name, inherited_split, sha256).

    ``hashes``: the rows' fingerprints when already computed (:func:`~.hashing.hash_images` at these
    settings, in row order); a fingerprint depends on its image alone, so the cross-set audit
    (:mod:`.cross_sets`) reuses the lab's instead of decoding the lab corpus twice.

    ``verdicts``: a reviewer's judged pairs (:func:`~.verdicts.read_verdicts`), folded into the
    relationships before the groups, crossings and decision (:func:`~.verdicts.apply_verdicts`)."""
    cfg = settings(cfg or {})
    workers = int(workers or cfg["workers"] or os.cpu_count() or 1)
    rows = rows.reset_index(drop=True)
    embed_side = int(cfg["embedding_px"]) if int(cfg["embedding_k"]) > 0 else 0
    if hashes is None:
        hashes = hash_images(corpus_root, rows["rel_path"], rows["sha256"], workers, progress,
                             max_image_pixels, embed_side)
    elif len(hashes.pixel_sha256) != len(rows):
        raise AuditInputError(f"{len(hashes.pixel_sha256)} fingerprints given for {len(rows)} rows")
    exact = exact_pairs(rows["sha256"], hashes.pixel_sha256)
    pixel_groups = PixelGroups.from_digests(hashes.pixel_sha256)
    rel_paths = rows["rel_path"].tolist()
    candidates = near_candidates(hashes, pixel_groups.representatives, cfg, progress, workers,
                                 paths=lambda k: os.path.join(corpus_root, rel_paths[k]))
    relationships = relationship_table(rows, hashes, exact, near_table(candidates, pixel_groups, cfg))
    relationships, verdict_report = apply_verdicts(relationships, rows, hashes, verdicts)
    groups = leakage_groups(rows["row_id"], relationships)
    stats = group_stats(groups, rows)
    crossings = crossing_counts(relationships)
    truth = Truth.from_planted(truth_json, rows["rel_path"].tolist()) if truth_json is not None else None
    table = threshold_table(candidates, pixel_groups, exact, cfg, truth)
    calibration = verifier_calibration(candidates, pixel_groups, exact, cfg, truth)
    by_source = recall_by_source(candidates, pixel_groups, exact, cfg, truth) if truth is not None else None
    geometry_table = geometry_calibration(candidates, pixel_groups, exact, cfg, truth) \
        if truth is not None else None
    leaf_table = leaf_calibration(candidates, pixel_groups, exact, cfg, truth) if truth is not None else None
    reshot_table = reshot_calibration(candidates, pixel_groups, exact, cfg, truth) \
        if truth is not None else None
    return AuditResult(rows, hashes, exact, pixel_groups, candidates, relationships, groups, stats, crossings,
                       inherited_decision(rows, crossings, stats), table, calibration, truth, cfg, by_source,
                       geometry_table, leaf_table=leaf_table, reshot_table=reshot_table,
                       verdicts=verdict_report)
