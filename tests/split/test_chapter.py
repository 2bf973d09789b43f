"""Chapter 3 (split): grouped stratified assignment, what the chapter records, its plot and notebook."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from split.split_runs import TARGET, make_run, planted_corpus, write_upstream

from cropcop_utils import split
from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter


# --------------------------------------------------------------------------- the frozen split
def test_split_is_deterministic_and_input_order_free(frozen, tmp_path):
    ctx, record = frozen
    # The same corpus and groups listed in another order, and an audit that judged no inherited partition.
    again = split.run_chapter(make_run(tmp_path / "again", shuffle=3, audit_record={"chapter": "audit"}))
    assert (tmp_path / "again/split/split.parquet").read_bytes() == \
        (ctx.run_dir / "split/split.parquet").read_bytes()
    for name in ("split/split.parquet", "split/class_map.json", "split/quarantine.parquet"):
        assert again["fingerprints"][name] == record["fingerprints"][name]
    assert record["inherited_partition"]["rejected"] is True  # recorded, and the split is made either way
    assert again["inherited_partition"]["rejected"] is None
    other_seed = split.run_chapter(make_run(tmp_path / "seed", overrides={"split": {"seed": 1}}))
    assert other_seed["fingerprints"]["split/split.parquet"] != record["fingerprints"]["split/split.parquet"]


def test_zero_crossings_on_planted_groups(frozen):
    ctx, record = frozen
    admitted, _ = planted_corpus()
    assert admitted["group_id"].value_counts().max() >= 40  # large groups are planted, not just pairs
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet").merge(
        admitted[["row_id", "group_id"]].rename(columns={"group_id": "planted"}), on="row_id")
    assert rows.groupby("planted")["split"].nunique().max() == 1
    assert record["crossings"]["ok"] and record["crossings"]["groups_across_splits"] == 0
    assert record["crossings"]["trusted_pairs_checked"] > 0
    assert record["groups"]["largest"] >= 40
    assert list(pd.read_parquet(ctx.run_dir / "split/split.parquet").columns) == split.SPLIT_COLUMNS


def test_stratification_within_tolerance(frozen):
    ctx, record = frozen
    for name, share in TARGET.items():
        assert abs(record["fractions"][name] - share) < 0.02, record["fractions"]
    table = pd.DataFrame(record["per_class"]).set_index("class_name")
    for name, row in table[table["total"] >= 150].iterrows():
        for part, share in TARGET.items():
            assert abs(row[f"{part}_frac"] - share) < 0.05, (name, part, row.to_dict())
    assert (table[list(TARGET)] >= 1).all().all()  # every surviving class reaches every split
    assert record["method"]["n_folds"] == 20 and record["method"]["folds_per_split"] == {
        "train": 14, "val": 3, "test": 3}
    assert sorted(sum(record["method"]["selected_folds"].values(), [])) == list(range(20))


def test_every_admitted_row_is_split_or_quarantined_once(frozen):
    ctx, record = frozen
    admitted, rejected = planted_corpus()
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    held = pd.read_parquet(ctx.run_dir / "split/quarantine.parquet")
    assert not rows["row_id"].duplicated().any()
    assert set(rows["row_id"]).isdisjoint(held["row_id"])
    assert set(rows["row_id"]) | set(held["row_id"]) == set(admitted["row_id"])
    assert rejected["row_id"].iloc[0] not in set(rows["row_id"]) | set(held["row_id"])
    assert record["rows_split"] + record["rows_quarantined"] == len(admitted)
    assert sum(record["totals"].values()) == len(rows)
    table = pd.DataFrame(record["per_class"])
    assert table[list(TARGET)].sum().to_dict() == record["totals"]


def test_small_class_is_quarantined_and_class_map_reindexed(frozen):
    ctx, record = frozen
    corpus_map = json.loads((ctx.run_dir / "corpus/class_map.json").read_text())
    frozen_map = json.loads((ctx.run_dir / "split/class_map.json").read_text())
    assert [(q["name"], q["reason"]) for q in record["quarantined_classes"]] == [
        ("Tomato___one_leaf", "fewer_groups_than_splits")]
    names = [c["name"] for c in frozen_map["classes"]]
    assert "Tomato___one_leaf" not in names and names == sorted(names)
    assert [c["index"] for c in frozen_map["classes"]] == list(range(len(names)))
    assert frozen_map["fingerprint"] == evidence.sha256_json(frozen_map["classes"])
    assert frozen_map["fingerprint"] != corpus_map["fingerprint"]
    assert {q["name"]: q["stage"] for q in frozen_map["quarantined_classes"]} == {
        "Tomato___single": "corpus", "Tomato___one_leaf": "split"}
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    assert (rows["label"] == rows["class_name"].map(names.index)).all()
    held = pd.read_parquet(ctx.run_dir / "split/quarantine.parquet")
    assert set(held["class_name"]) == {"Tomato___one_leaf"}
    assert set(held["reason"]) == {"fewer_groups_than_splits"}


def test_profile_minimum_per_split_quarantines(tmp_path):
    record = split.run_chapter(make_run(tmp_path / "run", overrides={"split": {"min_per_split": 3}}))
    reasons = {q["name"]: q["reason"] for q in record["quarantined_classes"]}
    assert reasons["Tomato___rare_pest"] == "below_min_per_split"  # 8 images < 3 x 3 splits
    table = pd.DataFrame(record["per_class"])
    assert (table[list(TARGET)] >= 3).all().all()


def test_label_conflict_group_stays_together(frozen):
    ctx, record = frozen
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    dup = rows[rows["rel_path"].str.contains("/dup_")]
    assert len(dup) == 7 and dup["split"].nunique() == 1 and dup["group_id"].nunique() == 1
    assert set(dup["class_name"]) == {"Tomato___Late_blight", "Tomato___Early_blight"}  # labels kept
    assert record["groups"]["label_conflict"] == 1
    assert split.majority_class(dup)[dup["group_id"].iloc[0]] == "Tomato___Late_blight"


def test_inherited_verdict_reader():
    decision = {"decision": "accept", "rejected": False, "reason": "no trusted relationship crosses"}
    assert split.inherited_verdict({"chapter": "audit", "figures": {"inherited_partition": decision}}) == {
        **decision, "source": "audit/audit.json: figures.inherited_partition"}
    flat = {"inherited_partition": {"decision": "none", "rejected": None, "reason": "flat layout"}}
    assert split.inherited_verdict(flat)["rejected"] is None
    assert split.inherited_verdict({"figures": {}})["reason"] == "audit/audit.json records no verdict"


def test_groups_that_miss_admitted_rows_are_refused(tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke")
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected)
    groups = pd.read_parquet(ctx.run_dir / "audit/groups.parquet").iloc[5:]
    Chapter(ctx.run_dir, "audit").write_parquet("audit/groups.parquet", groups)
    with pytest.raises(split.SplitInputError, match="audit/groups.parquet does not cover"):
        split.run_chapter(ctx)


def test_plot_split_support(frozen):
    _, record = frozen
    fig = split.plot_split_support(pd.DataFrame(record["per_class"]), TARGET)
    try:
        left, right = fig.axes
        assert left.get_xscale() == "log"
        assert len(right.patches) == 3 * len(record["per_class"])
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


# --------------------------------------------------------------------------- the notebook
@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    run_dir = Path(smoke_book["run_dir"])
    out = smoke_book["book_dir"] / "03_split.ipynb"
    record = json.loads((run_dir / "split/split.json").read_text())
    assert record["crossings"]["ok"] and sum(record["totals"].values()) == record["rows_split"]
    # The generator's single-image class never reaches the split's class map.
    assert len(record["corpus_quarantined_classes"]) + len(record["quarantined_classes"]) >= 1
    planted = record["planted_check"]  # planted byte copies are found by the audit and kept together
    assert planted["pairs_by_kind"]["byte_copy"]["pairs"] > 0
    assert planted["pairs_by_kind"]["byte_copy"]["across_splits"] == 0
    split.load_frozen(Chapter(run_dir, "after"))
    text = out.read_text()
    assert "Zero crossings" in text and "Traceback" not in text
