"""Chapter 1 — Corpus: scan every file, quarantine what cannot be used, name the classes.

This module holds the chapter's tables (support per class and per inherited split, imbalance), the
synthetic corpus's planted cross-check and :func:`run_chapter`, which writes the chapter's evidence.
The layouts, the quarantine reasons, the probe and the scan have modules of their own (see the
package docstring).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..core.evidence import Chapter, sha256_file, sha256_json
from . import taxonomy
from .field_train import run_field_train
from .figures import plot_class_support, plot_contract_examples
from .layout import NO_SPLIT, SPLITS
from .quarantine import CLASS_REASON, REASONS, reason_counts
from .scan import scan_corpus


# --------------------------------------------------------------------------- tables
def support_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per class folder: files seen, admissible (passed file checks), admitted, status."""
    frame = manifest[manifest["class_name"].notna()]
    admissible = frame["admitted"] | (frame["quarantine_reason"] == CLASS_REASON)
    table = pd.DataFrame({
        "files_seen": frame.groupby("class_name").size(),
        "admissible": frame[admissible].groupby("class_name").size(),
        "admitted": frame[frame["admitted"]].groupby("class_name").size(),
    }).fillna(0).astype(int)
    table["status"] = ["admitted" if n else "quarantined" for n in table["admitted"]]
    total = table["admitted"].sum()
    table["share_of_admitted"] = table["admitted"] / total if total else 0.0
    table = table.rename_axis("class_name").reset_index()
    return table.sort_values(["admissible", "class_name"], ascending=[False, True]).reset_index(drop=True)


def split_support_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """Admitted images per class × inherited split, with a total column."""
    admitted = manifest[manifest["admitted"]]
    table = pd.crosstab(admitted["class_name"], admitted["inherited_split"])
    order = [s for s in (*SPLITS, NO_SPLIT) if s in table.columns]
    table = table.reindex(columns=order).fillna(0).astype(int)
    table["total"] = table.sum(axis=1)
    table.columns.name = None
    return table.rename_axis("class_name").reset_index()


def imbalance(support: Mapping[str, int]) -> dict[str, Any]:
    """Largest and smallest class and their ratio over the given (admitted) supports."""
    if not support:
        return {"largest_class": None, "largest_support": 0, "smallest_class": None, "smallest_support": 0,
                "largest_to_smallest": None}
    ordered = sorted(support.items(), key=lambda kv: (-kv[1], kv[0]))
    (big, n_big), (small, n_small) = ordered[0], ordered[-1]
    return {"largest_class": big, "largest_support": int(n_big), "smallest_class": small,
            "smallest_support": int(n_small), "largest_to_smallest": n_big / n_small}


# --------------------------------------------------------------------------- synthetic cross-check
def planted_check(manifest: pd.DataFrame, truth: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the synthetic generator's ``planted.json`` with what the scan found.

    Checked: every planted file was seen (and nothing else); each planted broken file is quarantined
    for the planted reason and no unbroken file is quarantined for a file-level reason; the singleton
    class is quarantined as below minimum support; the EXIF orientations read match the planted ones;
    the naming rules give the planted crop / condition / type / pest / fruit of every class.
    """
    files = {f["rel_path"]: f for f in truth["files"]}
    by_path = manifest.set_index("rel_path")
    seen = set(by_path.index)
    broken = [{"rel_path": rel, "planted": f["broken_kind"],
               "found": by_path.at[rel, "quarantine_reason"] if rel in seen else "not_seen"}
              for rel, f in sorted(files.items()) if f.get("broken_kind")]
    file_level = set(REASONS) - {CLASS_REASON}
    unplanted = sorted(rel for rel, reason in by_path["quarantine_reason"].items()
                       if reason in file_level and not (rel in files and files[rel].get("broken_kind")))
    singletons = sorted(c["name"] for c in truth.get("classes", []) if c.get("singleton"))
    weak = sorted(set(manifest.loc[manifest["quarantine_reason"] == CLASS_REASON, "class_name"]))
    orientation_mismatch = []
    for rel, f in sorted(files.items()):
        if rel in seen and by_path.at[rel, "decode_status"] == "ok":
            found = by_path.at[rel, "exif_orientation"]
            found = None if pd.isna(found) else int(found)
            if (f.get("exif_orientation") or 1) != (found or 1):
                orientation_mismatch.append({"rel_path": rel, "planted": f.get("exif_orientation"),
                                             "found": found})
    taxonomy_mismatch = []
    for c in truth.get("classes", []):
        info = taxonomy.classify(c["name"])
        got = {k: getattr(info, k) for k in ("crop", "condition", "type", "pest", "fruit")}
        want = {k: c.get(k) for k in got}
        if got != want:
            taxonomy_mismatch.append({"name": c["name"], "planted": want, "rules": got})
    result = {
        "planted_files": len(files),
        "missing_from_scan": sorted(set(files) - seen),
        "not_in_planted": sorted(seen - set(files)),
        "planted_broken": len(broken),
        "broken_matched": sum(b["found"] == b["planted"] for b in broken),
        "broken": broken,
        "quarantined_not_planted": unplanted,
        "planted_singleton_classes": singletons,
        "quarantined_small_classes": weak,
        "exif_rotated_planted": sum((f.get("exif_orientation") or 1) != 1 for f in files.values()),
        "exif_orientation_mismatches": orientation_mismatch,
        "taxonomy_mismatches": taxonomy_mismatch,
    }
    result["all_match"] = (not result["missing_from_scan"] and not result["not_in_planted"]
                           and result["broken_matched"] == len(broken) and not unplanted
                           and singletons == weak and not orientation_mismatch and not taxonomy_mismatch)
    return result


# --------------------------------------------------------------------------- chapter
def _counts(series: pd.Series, top: int | None = None) -> dict[str, int]:
    counts = series.value_counts(dropna=False)
    return {str(k): int(v) for k, v in (counts.head(top) if top else counts).items()}


def run_chapter(ctx: Any, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Scan the run's corpus and write ``corpus/{manifest,quarantine}.parquet``, ``class_map.json``,
    ``class_support.png``, ``contract_examples.png`` and ``corpus.json``; returns the chapter record.
    With ``--field-train`` the field-train folder is scanned against the class map too
    (:mod:`.field_train`; the ``field_train`` block of ``corpus.json``).

    ``workers`` defaults to the profile's ``audit.workers``, else the CPU count.
    """
    ch = Chapter(ctx.run_dir, "corpus")
    if ctx.is_synthetic:
        from .. import synthetic

        synthetic.ensure_corpus(ctx)
    settings = ctx.section("corpus")
    min_support = int(settings.get("min_class_support", 2))
    max_pixels = settings.get("max_image_pixels")
    workers = workers or ctx.section("audit").get("workers") or os.cpu_count()
    # The synthetic corpus is generated at the profile's size (synthetic.*): it is never sampled.
    fraction = None if ctx.is_synthetic else settings.get("sample_fraction")
    keep_copies = bool(settings.get("sample_keeps_cross_split_copies", True))
    result = scan_corpus(ctx.corpus_root, min_support, max_pixels, workers, progress, fraction, keep_copies)
    manifest, not_sampled = result.manifest, result.not_sampled

    ch.write_parquet("corpus/manifest.parquet", manifest)
    ch.write_parquet("corpus/quarantine.parquet", result.quarantine)
    if fraction is not None:
        ch.write_parquet("corpus/not_sampled.parquet", not_sampled)
    ch.write_json("corpus/class_map.json", result.class_map)
    supports = support_table(manifest)
    figure = plot_class_support(supports, min_support)
    ch.save_figure(figure, "corpus/class_support.png", dpi=110)
    if manifest["admitted"].any():
        examples = plot_contract_examples(manifest, result.root, int(ctx.section("image").get("size", 64)))
        ch.save_figure(examples, "corpus/contract_examples.png", dpi=110)

    admitted = manifest[manifest["admitted"]]
    admitted_support = {c["name"]: c["support"] for c in result.class_map["classes"]}
    per_split = split_support_table(manifest).set_index("class_name")
    figures: dict[str, Any] = {
        "corpus_root": str(result.root),
        "data": ctx.data,
        "layout": result.layout.kind,
        "layout_description": result.layout.describe(),
        "split_folders": result.layout.split_folders,
        "files_seen": len(manifest) + len(not_sampled),
        "admitted": int(manifest["admitted"].sum()),
        "quarantined": int((~manifest["admitted"]).sum()),
        "not_sampled": len(not_sampled),
        "sample": {"fraction": fraction, "keeps_cross_split_copies": keep_copies,
                   "not_sampled_list": "corpus/not_sampled.parquet" if fraction is not None else None,
                   "rule": None if fraction is None else "content SHA-256 / 2**256 < fraction"},
        "identity_holds": len(manifest) + len(not_sampled)
        == int(manifest["admitted"].sum()) + len(result.quarantine) + len(not_sampled),
        "skipped": 0,
        "quarantine_reasons": reason_counts(manifest),
        "min_class_support": min_support,
        "max_image_pixels": max_pixels,
        "n_classes_seen": int(len(supports)),
        "n_classes_admitted": len(result.class_map["classes"]),
        "quarantined_classes": result.class_map["quarantined_classes"],
        "empty_class_folders": result.empty_class_folders,
        **imbalance(admitted_support),
        "per_split": {s: int(n) for s, n in admitted["inherited_split"].value_counts().items()},
        "per_class_split": {c: {s: int(n) for s, n in row.items() if s != "total"}
                            for c, row in per_split.iterrows()},
        "formats": _counts(admitted["format"]),
        "modes": _counts(admitted["mode"]),
        "sizes_top10": _counts(admitted["width"].astype(str) + "x" + admitted["height"].astype(str), 10),
        "n_distinct_sizes": int(admitted[["width", "height"]].drop_duplicates().shape[0]),
        "exif_orientations": _counts(admitted["exif_orientation"].astype("string").fillna("untagged")),
        "class_map_fingerprint": result.class_map["fingerprint"],
        "corpus_fingerprint": sha256_json(sorted(zip(admitted["rel_path"], admitted["sha256"], strict=True))),
        "taxonomy": taxonomy.taxonomy_summary(result.class_map),
        "scan": {"workers": result.workers, "seconds": round(result.seconds, 2),
                 "files_per_second": round(len(manifest) / result.seconds, 1) if result.seconds else None},
        "support_plot": "corpus/class_support.png",
        "contract_examples_plot": "corpus/contract_examples.png" if manifest["admitted"].any() else None,
        "field_train": run_field_train(ctx, ch, result.class_map, workers, progress),
    }
    if ctx.is_synthetic:
        from .. import synthetic

        truth_path = ctx.planted_truth_path
        ch.inputs["synthetic/planted.json"] = sha256_file(truth_path)
        figures["planted_check"] = planted_check(manifest, synthetic.load_truth(truth_path))
    return ch.finish(figures=figures)
