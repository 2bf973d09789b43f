"""Chapter 2 — Audit: which images are the same picture, or the same specimen, and does that leak?

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
  pHash and dihedral candidates are capped at ``audit.max_neighbours`` partners per image.  Three
  verifiers score the candidates: the registered, subject-weighted SSIM (:mod:`.verifier`,
  ``audit.verify_threshold``), ORB + RANSAC homography inliers confirmed by the SSIM after alignment
  (:mod:`.geometry`, ``audit.geometry_min_inliers``, ``audit.geometry_min_ratio``,
  ``audit.geometry_min_ssim``) and, for pairs neither accepts, the SSIM of the two leaves laid on each
  other by their silhouettes (:mod:`.leaf_align`, ``audit.leaf_min_ssim``).  A proposed pair that any
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
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..evidence import Chapter, atomic_write_bytes
from . import embedding, geometry, leaf_align, verifier
from .candidates import SOURCES, NearCandidates, near_candidates
from .errors import AuditInputError
from .figures import (
    gallery_sample,
    plot_group_sizes,
    plot_pair_gallery,
    plot_recall_by_source,
    plot_threshold_evidence,
    plot_verifier_calibration,
    review_pairs,
    review_sample,
)
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
    radius_reason,
    recall_by_source,
    threshold_table,
    verifier_calibration,
)

DEFAULTS: dict[str, Any] = {
    "hash_size": 8,           # 8x8 = 64-bit pHash / dHash
    "workers": None,          # hashing processes (None: all cores)
    "phash_radius": 12,       # near candidates trusted up to this pHash distance (evidence in the chapter)
    "table_radius": 16,       # the threshold table covers pHash radius 0..table_radius
    "max_neighbours": 4,      # candidates kept per image and source (nearest by pHash, then dHash)
    "dihedral_radius": 8,     # flips / quarter turns: bits between pHash(a) and a symmetry's pHash of b
    "embedding_k": 6,         # nearest embedding neighbours proposed per image (0: no embedding source)
    "embedding_min_cosine": 0.6,  # ... when at least this similar
    "embedding_px": 128,      # side of the loading contract's square the embedding network sees
    "rings_k": 4,             # nearest ring-spectrum neighbours proposed per image (0: no rings source)
    "rings_min_correlation": 0.85,  # ... when their spectra correlate at least this much
    "words_k": 3,             # nearest bag-of-ORB-words neighbours proposed per image (0: no words source)
    "words_vocabulary": 256,  # visual words (k-means centres of the audited ORB descriptors)
    "verify_threshold": 0.90,  # SSIM that confirms a candidate (calibrated on synthetic truth)
    "geometry_min_inliers": 24,  # RANSAC homography inliers that confirm a candidate
    "geometry_min_ratio": 0.7,   # ... when at least this share of the matches
    "geometry_min_ssim": 0.6,    # ... and b warped onto a by the homography reaches this SSIM
    "support_ssim": 0.85,     # a hash-close pair is also trusted when SSIM reaches this ...
    "support_inliers": 14,    # ... and the homography has this many inliers (both verifiers lean yes)
    "leaf_min_ssim": 0.92,    # leaf-aligned SSIM confirming a pair the others left open (> 1: off)
    "leaf_review_ssim": 0.80,  # rejected pairs from this leaf-aligned SSIM up are listed for a human look
    "geometry_review_inliers": 20,  # ... and those with this many RANSAC inliers at geometry_min_ratio
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
    if not 0 <= int(merged["dihedral_radius"]) < 64:
        raise AuditInputError(f"audit.dihedral_radius must lie in 0..63, got {merged['dihedral_radius']}")
    if int(merged["max_neighbours"]) < 1:
        raise AuditInputError("audit.max_neighbours must be at least 1")
    if int(merged["embedding_k"]) < 0 or not -1 <= float(merged["embedding_min_cosine"]) <= 1:
        raise AuditInputError("audit.embedding_k must be >= 0 and audit.embedding_min_cosine in [-1, 1]")
    if int(merged["rings_k"]) < 0 or not -1 <= float(merged["rings_min_correlation"]) <= 1:
        raise AuditInputError("audit.rings_k must be >= 0 and audit.rings_min_correlation in [-1, 1]")
    if int(merged["words_k"]) < 0 or int(merged["words_vocabulary"]) < 2:
        raise AuditInputError("audit.words_k must be >= 0 and audit.words_vocabulary at least 2")
    if int(merged["embedding_px"]) < 32:
        raise AuditInputError("audit.embedding_px must be at least 32")
    if int(merged["geometry_min_inliers"]) < geometry.MIN_MATCHES or not 0 <= float(
            merged["geometry_min_ratio"]) <= 1 or not -1 <= float(merged["geometry_min_ssim"]) <= 1:
        raise AuditInputError(f"audit.geometry_min_inliers must be >= {geometry.MIN_MATCHES}, "
                              "audit.geometry_min_ratio in [0, 1] and audit.geometry_min_ssim in [-1, 1]")
    if not -1 <= float(merged["leaf_min_ssim"]) <= 2 or not -1 <= float(merged["leaf_review_ssim"]) <= 2:
        raise AuditInputError("audit.leaf_min_ssim and audit.leaf_review_ssim must lie in [-1, 2] (above 1 "
                              "turns the leaf verifier off)")
    if int(merged["geometry_review_inliers"]) < 0:
        raise AuditInputError("audit.geometry_review_inliers must be >= 0 (above geometry_min_inliers, the "
                              "review list holds no geometric near misses)")
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
        "trusted": accepted,
    })[chosen].reset_index(drop=True)
    expanded, source = groups.expand(candidates.pairs[chosen])
    near = per_pair.iloc[source].reset_index(drop=True)
    near.insert(0, "j", expanded[:, 1] if len(expanded) else np.zeros(0, np.int64))
    near.insert(0, "i", expanded[:, 0] if len(expanded) else np.zeros(0, np.int64))
    return near[["i", "j", *NEAR_COLUMNS]]


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
    seconds: dict[str, float] | None = None

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
    rows = rows.reset_index(drop=True)
    embed_side = int(cfg["embedding_px"]) if int(cfg["embedding_k"]) > 0 else 0
    hashes = hash_images(corpus_root, rows["rel_path"], rows["sha256"], workers, progress, max_image_pixels,
                         embed_side)
    exact = exact_pairs(rows["sha256"], hashes.pixel_sha256)
    pixel_groups = PixelGroups.from_digests(hashes.pixel_sha256)
    candidates = near_candidates(hashes, pixel_groups.representatives, cfg, progress, workers)
    relationships = relationship_table(rows, hashes, exact, near_table(candidates, pixel_groups, cfg))
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
    return AuditResult(rows, hashes, exact, pixel_groups, candidates, relationships, groups, stats, crossings,
                       inherited_decision(rows, crossings, stats), table, calibration, truth, cfg, by_source,
                       geometry_table, leaf_table=leaf_table)


GALLERY_COLUMNS = ["rel_path_a", "rel_path_b", "proposed_by", "verified_by", "phash_distance",
                   "dhash_distance", "verify_score", "geometry_inliers", "trusted"]


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts: numpy scalars as Python numbers, missing values as null."""
    import json

    return json.loads(table.to_json(orient="records"))


def _review(review: pd.DataFrame, cfg: dict[str, Any], rel_paths: list[str],
            truth: Truth | None) -> dict[str, Any]:
    """The review list in numbers: how many rejected pairs, how many cross, by reason, and with a planted
    truth how many of them are planted relatives (the rest are look-alikes)."""
    flags = {r: review[f"review_{r}"].to_numpy(dtype=bool) for r in ("leaf", "geometry")}
    crosses = review["crosses_split"].to_numpy(dtype=bool)
    out: dict[str, Any] = {"min_leaf_ssim": float(cfg["leaf_review_ssim"]),
                           "min_inliers": int(cfg["geometry_review_inliers"]),
                           "min_ratio": float(cfg["geometry_min_ratio"]),
                           "pairs": int(len(review)), "crossing": int(review["crosses_split"].sum()),
                           "by_reason": {r: int(flag.sum()) for r, flag in flags.items()},
                           "crossing_by_reason": {r: int((f & crosses).sum()) for r, f in flags.items()},
                           "evidence": "audit/relationships.parquet (trusted = False; leaf_ssim, "
                                       "geometry_inliers, geometry_ratio)"}
    if truth is not None:
        index = {rel: k for k, rel in enumerate(rel_paths)}
        ends = zip(review["rel_path_a"], review["rel_path_b"], strict=True)
        related = np.array([truth.related(index[a], index[b]) for a, b in ends], dtype=bool)
        out["planted_related"] = int(related.sum())
        out["planted_related_by_reason"] = {r: int((flag & related).sum()) for r, flag in flags.items()}
    return out


def crossings_by_source(relationships: pd.DataFrame) -> dict[str, Any]:
    """Trusted pairs and trusted crossings of the inherited split by kind and by proposing source."""
    trusted = relationships[relationships["trusted"]]
    out: dict[str, Any] = {}
    for name, part in (("trusted", trusted), ("crossing", trusted[trusted["crosses_split"]])):
        sources = {s: int(part["proposed_by"].str.split("+").map(lambda names, s=s: s in names).sum())
                   for s in ("exact", *SOURCES)}
        only = {s: int((part["proposed_by"] == s).sum()) for s in SOURCES}
        out[name] = {"by_kind": {k: int(v) for k, v in part["kind"].value_counts().sort_index().items()},
                     "by_source": sources, "by_source_only": only,
                     "by_verifier": {k: int(v) for k, v in part["verified_by"].value_counts().sort_index()
                                     .items()}}
    return out


def run_chapter(ctx: Any, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Audit the admitted corpus: write ``audit/{hashes,relationships,groups,threshold_table,
    verifier_calibration}.parquet`` (and on the synthetic corpus ``recall_by_source``,
    ``geometry_calibration`` and ``leaf_calibration``), the gallery and plots, and ``audit/audit.json``."""
    import matplotlib.pyplot as plt

    started = time.perf_counter()
    cpu_started = time.process_time()
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
    if result.hashes.features is not None:
        saved = embedding.features_bytes(rows["row_id"].astype(str).tolist(), result.hashes.features,
                                         int(cfg["embedding_px"]))
        atomic_write_bytes(ch.path(embedding.FEATURES_FILE), saved)
        ch.record_output(embedding.FEATURES_FILE)
    if result.by_source is not None:
        ch.write_parquet("audit/recall_by_source.parquet", result.by_source)
        ch.write_parquet("audit/geometry_calibration.parquet", result.geometry_table)
        ch.write_parquet("audit/leaf_calibration.parquet", result.leaf_table)

    sample = gallery_sample(result.relationships, int(cfg["gallery_pairs"]))
    plots = {"gallery": ("audit/gallery.png", plot_pair_gallery(sample, ctx.corpus_root, threshold)),
             "group_sizes": ("audit/group_sizes.png", plot_group_sizes(result.groups)),
             "threshold_evidence": ("audit/threshold_evidence.png",
                                    plot_threshold_evidence(result.table, radius))}
    review = review_pairs(result.relationships, float(cfg["leaf_review_ssim"]),
                          int(cfg["geometry_review_inliers"]), float(cfg["geometry_min_ratio"]))
    if len(review):
        first = review_sample(review, int(cfg["gallery_pairs"]))
        plots["review"] = ("audit/review.png", plot_pair_gallery(first, ctx.corpus_root, threshold))
    if result.truth is not None:
        plots["verifier_calibration"] = ("audit/verifier_calibration.png",
                                         plot_verifier_calibration(result.calibration, threshold))
        plots["recall_by_source"] = ("audit/recall_by_source.png", plot_recall_by_source(result.by_source))
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
        "by_source": crossings_by_source(relationships),
        "label_conflicts": {
            "count": int(len(conflicts)),
            "pairs": conflicts[["rel_path_a", "class_a", "rel_path_b", "class_b", "kind"]].head(200)
            .to_dict("records"),
        },
        "review": _review(review, cfg, rows["rel_path"].tolist(), result.truth),
        "groups": result.stats,
        "crossings": result.crossings,
        "inherited_partition": result.decision,
        "chosen_radius": {"phash_radius": radius, "reason": radius_reason(result.table, radius, threshold),
                          "evidence": "audit/threshold_table.parquet"},
        "verifier": {"threshold": threshold, "max_neighbours": int(cfg["max_neighbours"]),
                     "candidate_radius": int(cfg["table_radius"]), "thumbnail": verifier.THUMB,
                     "angles": list(verifier.ANGLES), "scales": list(verifier.SCALES),
                     "geometry": {"min_inliers": int(cfg["geometry_min_inliers"]),
                                  "min_ratio": float(cfg["geometry_min_ratio"]),
                                  "min_ssim": float(cfg["geometry_min_ssim"]), "side": geometry.SIDE,
                                  "support_ssim": float(cfg["support_ssim"]),
                                  "support_inliers": int(cfg["support_inliers"]),
                                  "features": geometry.FEATURES, "ransac_px": geometry.RANSAC_PX,
                                  "estimator": {"screen": geometry.SCREEN, "refit": geometry.CONFIRM,
                                                "refit_from_inliers": geometry.SCREEN_INLIERS}},
                     "leaf": {"min_ssim": float(cfg["leaf_min_ssim"]), "side": leaf_align.SIDE,
                              "scored": int(np.isfinite(candidates.leaf_ssim).sum()),
                              "asked": "proposed pairs neither other verifier accepted"},
                     "candidates_found": int(len(candidates.pairs)),
                     "candidates_verified": int((candidates.scored | candidates.geometry_done).sum()),
                     "ssim_scored": int(candidates.scored.sum()),
                     "geometry_scored": int(candidates.geometry_done.sum()),
                     "proposed": {s: int(candidates.proposed[s].sum()) for s in SOURCES}},
        "embedding": ({"weights": embedding.weights_description(), "side": int(cfg["embedding_px"]),
                       "k": int(cfg["embedding_k"]), "min_cosine": float(cfg["embedding_min_cosine"])}
                      if hashes.embedding is not None else None),
        "synthetic": result.truth_check(truth_json) if truth_json is not None else None,
        "recall_by_source": result.by_source.to_dict("records") if result.by_source is not None else None,
        "gallery": _records(sample[GALLERY_COLUMNS]),
        "plots": {name: rel for name, (rel, _) in plots.items()},
        "timings": {
            "hashing_seconds": round(hashes.seconds, 2), "hashing_workers": hashes.workers,
            "images_per_second": round(len(rows) / hashes.seconds, 1) if hashes.seconds else None,
            "embedding_cpu_seconds": round(hashes.embed_seconds, 2),
            "hashing_stage_cpu_seconds": {k: round(v, 2) for k, v in hashes.stage_seconds.items()},
            "embedding_images_per_cpu_second": (round(len(rows) / hashes.embed_seconds, 1)
                                                if hashes.embed_seconds else None),
            "pair_search_seconds": round(candidates.timings["phash_search_seconds"], 2),
            **{k: round(v, 2) for k, v in candidates.timings.items()},
            "verify_seconds": round(sum(candidates.timings.get(k, 0.0)
                                        for k in ("ssim_seconds", "geometry_seconds", "leaf_seconds")), 2),
            "total_seconds": round(seconds, 2),
            "main_process_cpu_seconds": round(time.process_time() - cpu_started, 2),
        },
        "settings": cfg,
    }
    return ch.finish(figures=figures)
