"""Every scored cohort of the run side by side (``--field`` given once or more).

The first cohort is *primary*: attribution, the background swap, the learning curve and chapter 11's
field figures use it, and its scores live in each state's ``field`` block as before.  Every further
cohort is scanned under the same corpus contract, scored by every state of every regime from the same
verified files, and reported on its own (``field/cohorts/<name>/``): accuracy, macro-F1, per-class recall
with intervals, the photos without a field-train relative, and the classes it leaves untested.  Nothing is
pooled across cohorts: a cohort from another source answers another question.

Each cohort says what it is to the adapted model (:func:`cropcop_utils.core.cohorts.relation`):
in-source, cross-source, undeclared (with the audit's count of photos related to field-train photos as
evidence), or, with no field-train folder, every cohort is scored zero-shot.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..core import cohorts as run_cohorts
from ..core.config import RunContext
from ..core.evidence import Chapter
from ..nets import states as state_models
from .relatives import field_train_relatives
from .scores import field_results

FOLDER = "field/cohorts"
COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label"]


def cohort_path(name: str, file: str) -> str:
    return f"{FOLDER}/{name}/{file}"


def relation_record(ctx: RunContext, cohort: run_cohorts.FieldCohort,
                    relatives: dict[str, set[str]] | None) -> dict[str, Any]:
    """What the cohort is to the adapted model, with the declaration and the audit's evidence."""
    related = None if relatives is None else len(relatives["trusted"] | relatives["near_miss"])
    return {
        "source": cohort.source,
        "field_train_source": ctx.field_train_source,
        "relation": run_cohorts.relation(cohort.source, ctx.field_train_source, ctx.field_train is not None),
        "photos_with_field_train_relative": related,
    }


def cohort_entry(ctx: RunContext, cohort: run_cohorts.FieldCohort, summary: dict[str, Any] | None,
                 relatives: dict[str, set[str]] | None, by_regime: dict[str, dict[str, Any]],
                 files: str) -> dict[str, Any]:
    """One cohort's block of ``field.json``'s ``cohorts`` list: where it is, what it is, its scan, and per
    regime and state the field results (the primary cohort's are the states' ``field`` blocks)."""
    return {
        "name": cohort.name,
        "folder": cohort.folder,
        "primary": cohort.primary,
        **relation_record(ctx, cohort, relatives),
        "n": None if summary is None else summary["admitted"],
        "untested_classes": None if summary is None else summary["untested_classes"],
        "scan": summary,
        "files": files,
        "regimes": by_regime,
    }


def score_further_cohorts(ch: Chapter, ctx: RunContext, items: list[Any],
                          loaded: dict[str, dict[str, state_models.LoadedState]], names: list[str],
                          params: dict[str, Any]) -> list[dict[str, Any]]:
    """Scan and score every cohort after the primary one; their entries for ``field.json``."""
    from .cohort import check_fraction, scan_field

    fraction = check_fraction(ctx.section("field_transfer").get("sample_fraction"))
    entries = []
    for cohort in ctx.field_cohorts[1:]:
        root = ctx.cohort_root(cohort)
        if not root.is_dir():
            raise FileNotFoundError(f"--field {cohort.folder}: the field cohort folder does not exist")
        scan = scan_field(root, names, max_image_pixels=ctx.section("corpus").get("max_image_pixels"),
                          sample_fraction=None if cohort.folder == run_cohorts.SYNTHETIC else fraction,
                          row_prefix=cohort.row_prefix,
                          not_sampled_list=cohort_path(cohort.name, "not_sampled.parquet"))
        rows = scan.rows
        ch.write_parquet(cohort_path(cohort.name, "cohort.parquet"), rows[COLUMNS])
        ch.write_parquet(cohort_path(cohort.name, "quarantine.parquet"), scan.quarantine)
        relatives = field_train_relatives(ch, ctx, cohort.name)
        seen = None if relatives is None else relatives["trusted"] | relatives["near_miss"]
        by_regime: dict[str, dict[str, Any]] = {}
        for regime in items:
            states = loaded[regime.name]
            records = (state_models.score_rows(states, rows, root, ctx.section("image"),
                                               int(params["batch_size"])) if len(rows) else {})
            by_regime[regime.name] = {}
            for state, record in records.items():
                path = regime.path(cohort_path(cohort.name, f"predictions_{state}.parquet"))
                ch.write_parquet(path, record)
                by_regime[regime.name][state] = field_results(record, rows, names, params, seen)
            for state in states:
                by_regime[regime.name].setdefault(state, None)
        entries.append(cohort_entry(ctx, cohort, scan.summary, relatives, by_regime,
                                    cohort_path(cohort.name, "")))
    return entries


def cohort_table(cohorts: list[dict[str, Any]], regime: str) -> pd.DataFrame:
    """One row per cohort and state of a regime: n, accuracy and macro-F1 with their intervals, the same
    on the photos without a field-train relative, and the cohort's relation to field-train."""
    rows = []
    for entry in cohorts:
        for state, result in (entry["regimes"].get(regime) or {}).items():
            row: dict[str, Any] = {"cohort": entry["name"], "relation": entry["relation"],
                                   "source": entry["source"], "state": state}
            for metric in ("accuracy", "macro_f1"):
                block = (result or {}).get(metric) or {}
                row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = (block.get("value"), block.get("lo"),
                                                                          block.get("hi"))
            effect = (result or {}).get("field_train_relatives")
            unrelated = (effect or {}).get("without_relative", {}).get("accuracy") or {}
            row["n"] = (result or {}).get("n")
            row["accuracy_without_relative"] = unrelated.get("value")
            row["n_without_relative"] = None if effect is None else effect["unrelated"]
            rows.append(row)
    return pd.DataFrame(rows)
