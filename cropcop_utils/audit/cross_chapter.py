"""Chapter 2's second audit, across sources: which sets the run has, and what the cross-set audit writes.

A run has field sets when it was opened with ``--field-train`` (chapter 1 admitted those photos into
``corpus/field_train.parquet``) or with a real field cohort (``--field PATH``; the synthetic cohort is
made by the same generator as the synthetic corpus, so auditing it against the lab says nothing).  Then,
after the lab audit, :func:`run_cross_sets` audits lab ∪ field-train ∪ cohorts (:mod:`.cross_sets`) and
writes ``audit/cross_sets.parquet``, ``audit/cross_groups.parquet``, a gallery of trusted pairs across
sets (``audit/cross_gallery.png``) and of the review list's pairs across sets (``audit/cross_review.png``).

A cohort is scanned as chapter 10 scans it (:func:`cropcop_utils.corpus.field_sets.scan_field`, row ids
``field/<rel_path>``, ``field_transfer.sample_fraction`` honoured), so its rows here are chapter 10's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..core.config import SYNTHETIC
from ..core.evidence import Chapter
from ..core.sources import FIELD_TRAIN, LAB
from ..corpus.field_sets import SAMPLE_KEY, scan_field
from ..corpus.field_train import ROWS as FIELD_TRAIN_ROWS
from ..corpus.field_train import lab_class_names
from .corpus_audit import AuditResult
from .cross_sets import (
    AuditSet,
    CrossAudit,
    audit_sets,
    cohort_set_name,
    cross_block,
    cross_review,
    gallery_pairs,
)
from .errors import AuditInputError
from .figures import plot_pair_gallery

CROSS_PAIRS = "audit/cross_sets.parquet"
CROSS_GROUPS = "audit/cross_groups.parquet"


def cohort_folders(ctx: Any) -> list[tuple[str, Path, str]]:
    """The run's real field cohorts (``--field``, once or more): ``(short name, folder, row-id prefix)``."""
    return [(c.name, Path(c.folder), c.row_prefix) for c in ctx.field_cohorts if c.folder != SYNTHETIC]


def field_sets(ch: Chapter, ctx: Any, workers: int | None = None, progress: bool = False) -> list[AuditSet]:
    """The run's non-lab sets: field-train (as chapter 1 admitted it), then each real cohort (scanned)."""
    sets = []
    if ctx.field_train_root is not None:
        if not ch.path(FIELD_TRAIN_ROWS).exists():
            raise AuditInputError(f"the run has a field-train folder ({ctx.field_train_root}) but no "
                                  f"{FIELD_TRAIN_ROWS}; rerun chapter 'corpus'")
        sets.append(AuditSet(FIELD_TRAIN, Path(ctx.field_train_root), ch.read_parquet(FIELD_TRAIN_ROWS)))
    folders = cohort_folders(ctx)
    if folders:
        names = lab_class_names(ch.read_json("corpus/class_map.json"))  # a cohort's folders match them
        fraction = ctx.section("field_transfer").get("sample_fraction")
        for name, folder, prefix in folders:
            if not folder.is_dir():
                raise AuditInputError(f"--field {folder}: the field cohort folder does not exist")
            scan = scan_field(folder, names, max_image_pixels=ctx.section("corpus").get("max_image_pixels"),
                              workers=workers, progress=progress, sample_fraction=fraction,
                              row_prefix=prefix, sample_key=SAMPLE_KEY)
            keys = ("files_seen", "admitted", "quarantined", "left_out", "not_sampled", "identity_holds")
            accounting = {**{k: scan.summary[k] for k in keys},
                          "sample_fraction": scan.summary["sample"]["fraction"]}
            sets.append(AuditSet(cohort_set_name(name), scan.root, scan.rows, accounting))
    return sets


def _plot_frame(pairs: pd.DataFrame, audit: CrossAudit) -> pd.DataFrame:
    """Pairs as :func:`plot_pair_gallery` reads them: absolute paths, classes, the set as the split."""
    paths = audit.paths()
    return pairs.assign(
        rel_path_a=[paths[key] for key in zip(pairs["set_a"], pairs["rel_path_a"], strict=True)],
        rel_path_b=[paths[key] for key in zip(pairs["set_b"], pairs["rel_path_b"], strict=True)],
        class_a=pairs["class_name_a"], class_b=pairs["class_name_b"], split_a=pairs["set_a"],
        split_b=pairs["set_b"])


def run_cross_sets(ch: Chapter, ctx: Any, lab_rows: pd.DataFrame, lab: AuditResult, others: list[AuditSet],
                   cfg: dict[str, Any], workers: int | None = None,
                   progress: bool = False) -> dict[str, Any] | None:
    """Audit the lab with the run's field sets (:func:`field_sets`) and write the cross-set tables and
    galleries; the ``cross_sets`` block of ``audit.json``, or None when the run has no field set."""
    import matplotlib.pyplot as plt

    if not others:
        return None
    sets = [AuditSet(LAB, Path(ctx.corpus_root), lab_rows), *others]
    audit = audit_sets(sets, cfg, workers, progress, ctx.section("corpus").get("max_image_pixels"),
                       lab_hashes=lab.hashes)
    ch.write_parquet(CROSS_PAIRS, audit.table)
    ch.write_parquet(CROSS_GROUPS, audit.groups)
    n, threshold = int(cfg["gallery_pairs"]), float(cfg["verify_threshold"])
    plots = {}
    for name, pairs in (("gallery", gallery_pairs(audit.table, n)),
                        ("review", cross_review(audit.table, cfg).head(n))):
        if len(pairs):
            rel_path = f"audit/cross_{name}.png"
            figure = plot_pair_gallery(_plot_frame(pairs, audit), "/", threshold)
            ch.save_figure(figure, rel_path, dpi=100)
            plt.close(figure)
            plots[name] = rel_path
    return cross_block(audit, cfg, plots)
