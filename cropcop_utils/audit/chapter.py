"""Chapter 2 — Audit: ``run_chapter`` and its record.

It reads ``corpus/manifest.parquet``, runs the whole audit (:func:`~.corpus_audit.audit_corpus`, where
the relationships, candidate sources and verifiers are described) under the settings of
:mod:`.config`, and writes ``audit/`` — the hash, relationship, group and calibration tables, the
gallery and plots, and ``audit/audit.json`` with its figures (review list, crossings by source,
verifier settings, timings).  With field sets (``--field-train``, a real ``--field``) it then audits them
together with the lab (:mod:`.cross_chapter`): ``audit/cross_sets.parquet``, ``audit/cross_groups.parquet``
and the ``cross_sets`` block.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd

from ..core.evidence import Chapter, atomic_write_bytes
from . import embedding, geometry, leaf_align, verifier
from .candidates import SOURCES
from .config import settings
from .corpus_audit import admitted_rows, audit_corpus
from .cross_chapter import field_sets, run_cross_sets
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
from .reshot_report import SHOWN as RESHOT_SHOWN
from .reshot_report import added_sample, only_reshot, rejected_scored, reshot_block
from .truth import Truth, radius_reason
from .verdicts import SHEET, take_given, unjudged, write_sheet

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
        from ..core.evidence import sha256_file

        truth_json = synthetic.load_truth(ctx.planted_truth_path)
        ch.inputs["synthetic/planted.json"] = sha256_file(ctx.planted_truth_path)
    # a reviewer's verdict file is checked (and kept) first: a typo in it stops the chapter before the audit
    given, given_file = take_given(ch, cfg["review_verdicts"], rows["rel_path"])
    # the field sets are read and scanned first: a missing input stops the chapter before the long lab
    # audit, and the scan's pool forks from a process that has not yet started native thread pools
    others = field_sets(ch, ctx, workers, progress)
    result = audit_corpus(rows, ctx.corpus_root, cfg, workers, progress, truth_json,
                          ctx.section("corpus").get("max_image_pixels"), verdicts=given)
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
        if result.reshot_table is not None and len(result.reshot_table):
            ch.write_parquet("audit/reshot_calibration.parquet", result.reshot_table)

    sample = gallery_sample(result.relationships, int(cfg["gallery_pairs"]))
    plots = {"gallery": ("audit/gallery.png", plot_pair_gallery(sample, ctx.corpus_root, threshold)),
             "group_sizes": ("audit/group_sizes.png", plot_group_sizes(result.groups)),
             "threshold_evidence": ("audit/threshold_evidence.png",
                                    plot_threshold_evidence(result.table, radius))}
    # judged pairs are not asked again; the whole list goes out as a sheet to fill (audit/review.csv)
    review = unjudged(review_pairs(result.relationships, float(cfg["leaf_review_ssim"]),
                                   int(cfg["geometry_review_inliers"]), float(cfg["geometry_min_ratio"])))
    write_sheet(ch, review)
    if len(review):
        first = review_sample(review, int(cfg["gallery_pairs"]))
        plots["review"] = ("audit/review.png", plot_pair_gallery(first, ctx.corpus_root, threshold))
    gallery_n = int(cfg["gallery_pairs"])
    added = added_sample(only_reshot(result.relationships), gallery_n)
    if len(added):
        plots["reshot_added"] = ("audit/reshot_added.png",
                                 plot_pair_gallery(added, ctx.corpus_root, threshold))
    missed = rejected_scored(result.relationships).head(gallery_n).reset_index(drop=True)
    if len(missed):
        plots["reshot_rejected"] = ("audit/reshot_rejected.png",
                                    plot_pair_gallery(missed, ctx.corpus_root, threshold))
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
        "review": {**_review(review, cfg, rows["rel_path"].tolist(), result.truth), "sheet": SHEET,
                   "verdicts": {**given_file, **(result.verdicts or {})}},
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
                     "reshot": reshot_block(result.relationships, cfg, candidates,
                                            candidates.timings.get("reshot_seconds", 0.0)),
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
        "reshot_gallery": {"added": _records(added[RESHOT_SHOWN]),
                           "rejected": _records(missed[RESHOT_SHOWN])},
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
                                        for k in ("ssim_seconds", "geometry_seconds", "leaf_seconds",
                                                  "reshot_seconds")), 2),
            "total_seconds": round(seconds, 2),
            "main_process_cpu_seconds": round(time.process_time() - cpu_started, 2),
        },
        "settings": cfg,
    }
    # after the lab audit, which is the same with or without field sets: the audit across sources
    figures["cross_sets"] = run_cross_sets(ch, ctx, rows, result, others, cfg, workers, progress)
    return ch.finish(figures=figures)
