"""Field-train photos in chapter 3: they follow their lab relatives' split (a lab test relative excludes
them), the other groups are cut whole into train/val by class, and every later chapter reads them back
verified through ``FrozenSplit.rows_for(..., field_train=True)``."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from split.split_runs import field_train_tables, make_field_run, planted_corpus

from cropcop_utils import split
from cropcop_utils.core.evidence import Chapter, FingerprintMismatch, atomic_write_parquet
from cropcop_utils.core.sources import FIELD_TRAIN, LAB
from cropcop_utils.split import field_train as ft


@pytest.fixture(scope="module")
def field_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("field_split")
    ctx = make_field_run(base / "run", base / "orchard_train")
    return ctx, split.run_chapter(ctx)


def _expected_follow(run_dir) -> pd.DataFrame:
    """Each field-train row with the splits of the split lab rows in its cross group (from the files)."""
    cross = pd.read_parquet(run_dir / ft.CROSS_GROUPS)
    lab = pd.read_parquet(run_dir / "split/split.parquet")[["row_id", "split"]]
    lab_splits = (cross[cross["set"] == "lab"].merge(lab, on="row_id")
                  .groupby("group_id")["split"].agg(lambda s: tuple(sorted(set(s)))))
    field = cross[cross["set"] == FIELD_TRAIN][["row_id", "group_id"]]
    return field.assign(lab_splits=field["group_id"].map(lab_splits))


def test_field_train_rows_follow_their_lab_relatives(field_run):
    ctx, _ = field_run
    run = ctx.run_dir
    rows = pd.read_parquet(run / ft.FIELD_TRAIN_SPLIT)
    excluded = pd.read_parquet(run / ft.FIELD_TRAIN_EXCLUDED)
    assert list(rows.columns) == ft.FIELD_COLUMNS and set(rows["split"]) == {"train", "val"}
    assert (rows["source"] == FIELD_TRAIN).all()
    expected = _expected_follow(run).set_index("row_id")
    split_of = rows.set_index("row_id")["split"]
    reason_of = excluded.set_index("row_id")["reason"]
    followed = expected.dropna()
    kinds = {"train": 0, "val": 0, "test": 0, "across": 0}
    for row_id, lab_splits in followed["lab_splits"].items():
        if "test" in lab_splits:
            assert reason_of[row_id] == "lab_test_relative"
            kinds["test"] += 1
        elif len(lab_splits) > 1:
            assert reason_of[row_id] == "lab_relatives_across_splits"
            kinds["across"] += 1
        else:
            assert split_of[row_id] == lab_splits[0]
            kinds[lab_splits[0]] += 1
    assert kinds["train"] and kinds["test"]  # the planted run exercises both (val and across: if drawn)
    one_leaf = excluded[excluded["class_name"] == "Tomato___one_leaf"]
    assert len(one_leaf) == 2 and set(one_leaf["reason"]) == {"class_not_in_split"}
    corpus_rows = pd.read_parquet(run / ft.CORPUS_FIELD_TRAIN)
    assert sorted(rows["row_id"].tolist() + excluded["row_id"].tolist()) == sorted(corpus_rows["row_id"])


def test_free_groups_are_cut_whole_and_stratified(field_run):
    ctx, record = field_run
    rows = pd.read_parquet(ctx.run_dir / ft.FIELD_TRAIN_SPLIT)
    cross = pd.read_parquet(ctx.run_dir / ft.CROSS_GROUPS).set_index("row_id")["group_id"]
    per_group = rows.assign(group=rows["row_id"].map(cross)).groupby("group")["split"].nunique()
    assert (per_group == 1).all() and (rows["group_id"] == rows["row_id"].map(cross)).all()
    free = rows[rows["row_id"].isin(_expected_follow(ctx.run_dir).query("lab_splits.isna()")["row_id"])]
    share = free.groupby("class_name")["split"].apply(lambda s: (s == "val").mean())
    assert share.between(0.05, 0.30).all(), share  # 15 % target per class, groups of 1-4 photos
    block = record["field_train"]
    assert block["target_fractions"] == {"train": 0.85, "val": 0.15}
    assert block["totals"]["train"] + block["totals"]["val"] == block["rows_split"] == len(rows)
    assert sum(block["excluded_by_reason"].values()) == block["rows_excluded"]
    assert block["crossings"]["ok"] and block["crossings"]["groups_across_splits"] == 0
    assert block["per_class"]["Tomato___healthy"]["val"] > 0
    labels = json.loads((ctx.run_dir / "split/class_map.json").read_text())["classes"]
    assert (rows["label"] == rows["class_name"].map({c["name"]: c["index"] for c in labels})).all()


def test_plan_is_deterministic_and_refuses_bad_fractions_and_uncovered_rows():
    admitted, _ = planted_corpus()
    field, cross = field_train_tables(admitted)
    lab = admitted.assign(split=[("train", "val", "test")[k % 3] for k in range(len(admitted))])
    names = sorted(set(admitted["class_name"]) - {"Tomato___one_leaf"})
    one = ft.plan_field_train(field, cross, lab, names, None, seed=0)
    two = ft.plan_field_train(field.sample(frac=1, random_state=1), cross.sample(frac=1, random_state=2),
                              lab, names, None, seed=0)
    pd.testing.assert_frame_equal(one.rows, two.rows)
    pd.testing.assert_frame_equal(one.excluded, two.excluded)
    with pytest.raises(split.SplitInputError, match="field_train_fractions must give train and val"):
        ft.plan_field_train(field, cross, lab, names, {"train": 0.7, "val": 0.15, "test": 0.15}, seed=0)
    with pytest.raises(split.SplitInputError, match="does not cover the field-train rows.*02_audit"):
        ft.plan_field_train(field, cross[cross["row_id"] != field["row_id"].iloc[3]], lab, names, None, 0)


def test_read_back_check_catches_a_field_group_across_splits_or_beside_lab_test(field_run):
    ctx, _ = field_run
    run = ctx.run_dir
    rows = pd.read_parquet(run / ft.FIELD_TRAIN_SPLIT)
    args = (pd.read_parquet(run / ft.FIELD_TRAIN_EXCLUDED), pd.read_parquet(run / ft.CORPUS_FIELD_TRAIN),
            pd.read_parquet(run / ft.CROSS_GROUPS), pd.read_parquet(run / "split/split.parquet"))
    assert ft.check_field_train(rows, *args)["ok"]
    multi = rows.groupby("group_id").filter(lambda g: len(g) > 1)
    leaky = rows.copy()
    victim = multi.index[0]
    leaky.loc[victim, "split"] = "val" if leaky.loc[victim, "split"] == "train" else "train"
    with pytest.raises(split.LeakageError, match="field_train.parquet leaks"):
        ft.check_field_train(leaky, *args)
    excluded, corpus_rows, cross, lab = args
    test_relative = excluded[excluded["reason"] == "lab_test_relative"].iloc[:1]
    smuggled = pd.concat([rows, test_relative.assign(split="train", label=0, source=FIELD_TRAIN)])
    with pytest.raises(split.LeakageError):
        ft.check_field_train(smuggled, excluded.iloc[1:], corpus_rows, cross, lab)
    lost = ft.check_field_train(rows.iloc[1:], *args, raise_on_failure=False)
    assert not lost["ok"] and lost["unaccounted_rows"] == 1


def test_rows_for_adds_the_field_train_rows_of_the_split(field_run):
    ctx, record = field_run
    frozen = split.load_frozen(Chapter(ctx.run_dir, "training"))
    field = pd.read_parquet(ctx.run_dir / ft.FIELD_TRAIN_SPLIT)
    for name in ("train", "val"):
        lab = frozen.rows_for(name)
        both = frozen.rows_for(name, field_train=True)
        assert "source" not in lab.columns and set(both["source"]) == {LAB, FIELD_TRAIN}
        same = both[both["source"] == LAB].drop(columns="source").reset_index(drop=True)
        assert same.drop(columns="group_id").equals(lab.drop(columns="group_id"))
        assert (same["group_id"] == "lab:" + lab["group_id"].astype(str)).all()
        assert both.loc[both["source"] == FIELD_TRAIN, "group_id"].str.startswith("cross:").all()
        assert set(both.loc[both["source"] == FIELD_TRAIN, "row_id"]) == set(
            field.loc[field["split"] == name, "row_id"])
    test = frozen.rows_for("test", field_train=True)
    assert (test["source"] == LAB).all() and len(test) == record["totals"]["test"]
    for rel in ft.FIELD_TRAIN_FILES:
        assert frozen.split_json["fingerprints"][rel] == record["fingerprints"][rel]


def test_lab_split_is_unchanged_by_field_train(field_run, tmp_path):
    ctx, record = field_run
    from split.split_runs import make_run

    plain = split.run_chapter(make_run(tmp_path / "plain"))
    assert plain["field_train"] is None
    assert pd.read_parquet(tmp_path / "plain/split/split.parquet").equals(
        pd.read_parquet(ctx.run_dir / "split/split.parquet"))
    frozen = split.load_frozen(Chapter(tmp_path / "plain", "training"))
    with pytest.raises(ValueError, match="--field-train"):
        frozen.rows_for("train", field_train=True)


def test_load_frozen_refuses_an_altered_field_train_split(field_run, tmp_path):
    import shutil

    ctx, _ = field_run
    run = tmp_path / "run"
    shutil.copytree(ctx.run_dir, run)
    rows = pd.read_parquet(run / ft.FIELD_TRAIN_SPLIT)
    atomic_write_parquet(run / ft.FIELD_TRAIN_SPLIT, rows.assign(split="train"))
    with pytest.raises(FingerprintMismatch, match="split/field_train.parquet"):
        split.load_frozen(Chapter(run, "training"))
