"""Chapter 3: the frozen, stratified, leakage-group-aware train/val/test split.

This module holds the chapter's inputs (the admitted rows with their leakage groups) and outputs (the
re-indexed class map, the per-class table, the inherited-partition verdict, the synthetic planted check,
the support plot) and :func:`run_chapter`, which plans, writes, reads back and checks the split.  The
method is in :mod:`.plan`; the checks every later chapter repeats are in :mod:`.frozen`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core.config import RunContext
from ..core.evidence import Chapter, sha256_file, sha256_json, verify_artifact
from .field_train import (
    CORPUS_FIELD_TRAIN,
    CROSS_GROUPS,
    FIELD_TRAIN_EXCLUDED,
    FIELD_TRAIN_FILES,
    FIELD_TRAIN_SPLIT,
    check_field_train,
    field_train_block,
    plan_field_train,
)
from .frozen import FROZEN_FILES, SPLITS, check_zero_crossings
from .plan import SplitInputError, SplitPlan, parse_fractions, plan_split, require_groups

SPLIT_COLUMNS = ["row_id", "rel_path", "class_name", "label", "group_id", "split"]
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "group_id", "reason"]


# --------------------------------------------------------------------------- inputs and outputs
def admitted_rows(manifest: pd.DataFrame, groups: pd.DataFrame, corpus_map: dict[str, Any]) -> pd.DataFrame:
    """The admitted manifest rows with their leakage group; refuses when corpus and audit disagree."""
    admitted = manifest[manifest["admitted"].astype(bool)][["row_id", "rel_path", "class_name"]]
    if admitted["row_id"].duplicated().any():
        raise SplitInputError("corpus/manifest.parquet lists an admitted row_id twice; rerun chapter "
                              "'corpus' (01_corpus).")
    require_groups(admitted["row_id"], groups, "audit/groups.parquet",
                   "the admitted rows of corpus/manifest.parquet")
    known = {c["name"] for c in corpus_map["classes"]}
    unknown = sorted(set(admitted["class_name"]) - known)
    if unknown:
        raise SplitInputError(f"admitted classes {unknown} are missing from corpus/class_map.json; rerun "
                              "chapter 'corpus' (01_corpus).")
    return admitted.merge(groups[["row_id", "group_id"]], on="row_id", how="left", validate="one_to_one")


def frozen_class_map(corpus_map: dict[str, Any], plan: SplitPlan) -> dict[str, Any]:
    """corpus/class_map.json re-indexed over the classes that survived the split."""
    support = plan.assignment["class_name"].value_counts()
    survivors = sorted(support.index)
    by_name = {c["name"]: c for c in corpus_map["classes"]}
    classes = [{**by_name[name], "index": i, "support": int(support[name])}
               for i, name in enumerate(survivors)]
    upstream = [dict(q, stage="corpus") for q in corpus_map.get("quarantined_classes", [])]
    here = [{"name": q["name"], "reason": q["reason"], "support": q["support"], "stage": "split"}
            for q in plan.quarantined_classes]
    return {"fingerprint": sha256_json(classes), "classes": classes, "quarantined_classes": upstream + here}


def per_class_table(rows: pd.DataFrame, class_names: list[str]) -> pd.DataFrame:
    """Rows per class per split with each class's shares, in label order."""
    table = pd.crosstab(rows["class_name"], rows["split"]).reindex(index=class_names, columns=list(SPLITS),
                                                                   fill_value=0)
    table["total"] = table.sum(axis=1)
    for name in SPLITS:
        table[f"{name}_frac"] = (table[name] / table["total"]).round(4)
    table.insert(0, "label", range(len(class_names)))
    return table.rename_axis("class_name").reset_index()


def inherited_verdict(audit_json: dict[str, Any]) -> dict[str, Any]:
    """Whether the audit rejected the corpus's own train/test partition (the split is remade either way).

    The audit records ``{"decision": "accept"|"reject"|"none", "rejected": bool|None, "reason"}`` under
    ``figures.inherited_partition`` of ``audit/audit.json``.
    """
    for where, record in (("figures.", audit_json.get("figures") or {}), ("", audit_json)):
        entry = record.get("inherited_partition") if isinstance(record, dict) else None
        if isinstance(entry, dict) and "rejected" in entry:
            rejected = None if entry["rejected"] is None else bool(entry["rejected"])
            return {"rejected": rejected, "decision": entry.get("decision"), "reason": entry.get("reason"),
                    "source": f"audit/audit.json: {where}inherited_partition"}
    return {"rejected": None, "decision": None, "reason": "audit/audit.json records no verdict",
            "source": "audit/audit.json"}


def planted_check(rows: pd.DataFrame, truth: dict[str, Any]) -> dict[str, Any]:
    """Synthetic corpus only: do the planted relations (copies, near duplicates, re-shots) stay together?

    This judges the audit's grouping and the split together: a planted relation the audit missed can
    cross splits without any audit group crossing.
    """
    from ..synthetic import PAIR_KINDS, planted_groups, planted_pairs

    split_of = dict(zip(rows["rel_path"], rows["split"], strict=True))
    groups = [[m for m in g if m in split_of] for g in planted_groups(truth)]
    groups = [g for g in groups if len(g) > 1]
    across = [sorted(g) for g in groups if len({split_of[m] for m in g}) > 1]
    by_kind = {}
    for kind in PAIR_KINDS:
        pairs = [tuple(p) for p in planted_pairs(truth, [kind]) if all(m in split_of for m in p)]
        by_kind[kind] = {"pairs": len(pairs),
                         "across_splits": sum(split_of[a] != split_of[b] for a, b in pairs)}
    return {"planted_groups": len(groups), "planted_groups_across_splits": len(across),
            "examples_across": across[:5], "pairs_by_kind": by_kind}


def plot_split_support(table: pd.DataFrame, fractions: dict[str, float] | None = None) -> Any:
    """Per class: total support (log scale) and how it divides into train / val / test (stacked shares)."""
    import matplotlib.pyplot as plt

    table = table.sort_values("total", kind="stable")
    y = np.arange(len(table))
    height = max(2.5, 0.28 * len(table) + 1.2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, height), sharey=True,
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    colours = {"train": "#4c72b0", "val": "#dd8452", "test": "#55a868"}
    start = np.ones(len(table))  # the log axis starts at one image
    for name in SPLITS:  # stacked counts: each segment from the previous cumulative total
        stop = start + table[name].to_numpy()
        left.barh(y, stop - start, left=start, color=colours[name], label=name)
        start = stop
    left.set_xscale("log")
    left.set_xlabel("images per class (log scale)")
    left.set_yticks(y, table["class_name"], fontsize=7)
    share = np.zeros(len(table))
    for name in SPLITS:
        part = (table[name] / table["total"]).to_numpy()
        right.barh(y, part, left=share, color=colours[name], label=name)
        share += part
    for cut in np.cumsum([fractions[s] for s in SPLITS[:-1]]) if fractions else []:
        right.axvline(cut, color="black", linestyle="--", linewidth=0.8)
    right.set_xlim(0, 1)
    right.set_xlabel("share of the class in each split (dashed: target)")
    right.legend(loc="lower right", fontsize=7, ncols=3)
    fig.suptitle("How each class's support divides across the frozen split")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- chapter
def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Make, freeze and check the split; options override the profile's ``split`` section."""
    params = {**ctx.section("split"), **options}
    fractions = parse_fractions(params.get("fractions", {"train": 0.70, "val": 0.15, "test": 0.15}))
    seed = int(params.get("seed", ctx.params.get("seed", 0)))
    min_per_split = int(params.get("min_per_split", 1))

    ch = Chapter(ctx.run_dir, "split")
    manifest = ch.read_parquet("corpus/manifest.parquet")
    corpus_map = ch.read_json("corpus/class_map.json")
    relationships = ch.read_parquet("audit/relationships.parquet")
    groups = ch.read_parquet("audit/groups.parquet")
    audit_json = ch.read_json("audit/audit.json")

    plan = plan_split(admitted_rows(manifest, groups, corpus_map), fractions, seed, min_per_split)
    class_map = frozen_class_map(corpus_map, plan)
    class_names = [c["name"] for c in class_map["classes"]]
    label_of = {name: i for i, name in enumerate(class_names)}
    split_rows = (plan.assignment.assign(label=lambda d: d["class_name"].map(label_of).astype("int64"))
                  [SPLIT_COLUMNS].sort_values("rel_path", kind="stable").reset_index(drop=True))
    held = plan.quarantined_rows[QUARANTINE_COLUMNS].sort_values("rel_path", kind="stable")

    ch.write_json("split/class_map.json", class_map)
    ch.write_parquet("split/split.parquet", split_rows)
    ch.write_parquet("split/quarantine.parquet", held.reset_index(drop=True))

    # The verdict comes from the files as written, re-read from disk, not from the frames in memory.
    for rel_path in ("split/split.parquet", "split/quarantine.parquet", "audit/groups.parquet"):
        verify_artifact(ctx.run_dir, rel_path)
    crossings = check_zero_crossings(pd.read_parquet(ch.path("split/split.parquet")),
                                     pd.read_parquet(ch.path("audit/groups.parquet")),
                                     quarantined=pd.read_parquet(ch.path("split/quarantine.parquet")),
                                     relationships=relationships)

    table = per_class_table(split_rows, class_names)
    fig = plot_split_support(table, fractions)
    ch.save_figure(fig, "split/support.png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)

    totals = {name: int((split_rows["split"] == name).sum()) for name in SPLITS}
    train = table.set_index("class_name")["train"]
    group_sizes = groups["group_id"].value_counts()
    conflict = plan.assignment.groupby("group_id")["class_name"].nunique()
    field_train = split_field_train(ctx, ch, params, seed, class_names)
    frozen_files = FROZEN_FILES + (FIELD_TRAIN_FILES if field_train is not None else ())
    fingerprints = {rel: (ch.outputs.get(rel) or ch.inputs[rel]) for rel in frozen_files}
    planted = None
    if ctx.is_synthetic and ctx.planted_truth_path.exists():
        from ..synthetic import load_truth

        ch.inputs["synthetic/planted.json"] = sha256_file(ctx.planted_truth_path)
        planted = planted_check(split_rows, load_truth(ctx.planted_truth_path))
    return ch.finish(
        figures={"support": "split/support.png"},
        method={"splitter": "sklearn.model_selection.StratifiedGroupKFold", "shuffle": True, "seed": seed,
                "stratify_by": "majority class of each leakage group", "n_folds": plan.n_folds,
                "folds_per_split": plan.folds_per_split, "selected_folds": plan.selected_folds,
                "min_per_split": min_per_split},
        target_fractions=fractions,
        totals=totals,
        fractions={k: round(v / max(1, len(split_rows)), 6) for k, v in totals.items()},
        rows_split=len(split_rows),
        rows_quarantined=len(held),
        per_class=table.to_dict("records"),
        train_support_ratio={"largest": int(train.max()), "smallest": int(train.min()),
                             "largest_class": str(train.idxmax()), "smallest_class": str(train.idxmin()),
                             "ratio": round(float(train.max() / train.min()), 3)},
        quarantined_classes=plan.quarantined_classes,
        corpus_quarantined_classes=corpus_map.get("quarantined_classes", []),
        repairs=plan.repairs,
        groups={"total": int(len(group_sizes)), "multi_row": int((group_sizes > 1).sum()),
                "largest": int(group_sizes.max()) if len(group_sizes) else 0,
                "label_conflict": int((conflict > 1).sum())},
        crossings={**crossings.to_dict(), "checked_from": ["split/split.parquet", "split/quarantine.parquet",
                                                           "audit/groups.parquet",
                                                           "audit/relationships.parquet"]},
        inherited_partition=inherited_verdict(audit_json),
        class_map_fingerprint=class_map["fingerprint"],
        fingerprints=fingerprints,
        planted_check=planted,
        field_train=field_train,
    )


def split_field_train(ctx: RunContext, ch: Chapter, params: dict[str, Any], seed: int,
                      class_names: list[str]) -> dict[str, Any] | None:
    """Split the run's field-train rows (``--field-train``) after the lab split; None without them.

    Writes ``split/field_train.parquet`` and ``split/field_train_excluded.parquet``, re-reads them from
    disk for the crossing check and returns the ``field_train`` block of ``split/split.json``."""
    if ctx.field_train is None:
        return None
    if not ch.path(CORPUS_FIELD_TRAIN).exists():
        raise SplitInputError(f"the run has --field-train {ctx.field_train} but {CORPUS_FIELD_TRAIN} is "
                              "missing; rerun chapter 'corpus' (01_corpus).")
    if not ch.path(CROSS_GROUPS).exists():
        raise SplitInputError(f"the run has --field-train {ctx.field_train} but {CROSS_GROUPS} is missing; "
                              "rerun chapter 'audit' (02_audit), which groups field-train with the lab "
                              "corpus.")
    field_rows = ch.read_parquet(CORPUS_FIELD_TRAIN)
    cross_groups = ch.read_parquet(CROSS_GROUPS)
    lab_rows = pd.read_parquet(ch.path("split/split.parquet"))
    plan = plan_field_train(field_rows, cross_groups, lab_rows, class_names,
                            params.get("field_train_fractions"), seed)
    ch.write_parquet(FIELD_TRAIN_SPLIT, plan.rows)
    ch.write_parquet(FIELD_TRAIN_EXCLUDED, plan.excluded)
    for rel_path in (FIELD_TRAIN_SPLIT, FIELD_TRAIN_EXCLUDED, CROSS_GROUPS, CORPUS_FIELD_TRAIN):
        verify_artifact(ctx.run_dir, rel_path)
    check = check_field_train(pd.read_parquet(ch.path(FIELD_TRAIN_SPLIT)),
                              pd.read_parquet(ch.path(FIELD_TRAIN_EXCLUDED)),
                              pd.read_parquet(ch.path(CORPUS_FIELD_TRAIN)),
                              pd.read_parquet(ch.path(CROSS_GROUPS)), lab_rows)
    return {"folder": ctx.field_train, **field_train_block(plan, check, class_names, seed)}
