"""The frozen split: the read-back crossing check, load_frozen's refusals and read_frozen."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from split.split_runs import TARGET, fresh_copy

from cropcop_utils import split
from cropcop_utils.core import evidence
from cropcop_utils.core.evidence import Chapter, FingerprintMismatch


# --------------------------------------------------------------------------- the crossing check
def test_crossing_check_fails_on_a_leaky_split(frozen):
    ctx, _ = frozen
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    groups = pd.read_parquet(ctx.run_dir / "audit/groups.parquet")
    held = pd.read_parquet(ctx.run_dir / "split/quarantine.parquet")
    split.check_zero_crossings(rows, groups, quarantined=held)  # the frozen split passes
    biggest = rows["group_id"].value_counts().index[0]
    leaky = rows.copy()
    victim = leaky.index[leaky["group_id"] == biggest][0]
    leaky.loc[victim, "split"] = "test" if leaky.loc[victim, "split"] != "test" else "train"
    with pytest.raises(split.LeakageError, match=f"group {biggest} in"):
        split.check_zero_crossings(leaky, groups)
    # The split's own group column is not trusted: relabelling the moved row's group hides nothing.
    leaky.loc[victim, "group_id"] = -1
    report = split.check_zero_crossings(leaky, groups, raise_on_failure=False)
    assert [g["group_id"] for g in report.crossing_groups] == [biggest] and not report.ok


def test_crossing_check_catches_trusted_pairs_and_bookkeeping(frozen):
    ctx, _ = frozen
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    groups = pd.read_parquet(ctx.run_dir / "audit/groups.parquet")
    held = pd.read_parquet(ctx.run_dir / "split/quarantine.parquet")
    a, b = rows[rows["split"] == "train"].iloc[0], rows[rows["split"] == "test"].iloc[0]
    pair = pd.DataFrame([{"row_id_a": a.row_id, "row_id_b": b.row_id, "kind": "near", "trusted": True}])
    with pytest.raises(split.LeakageError, match="trusted audit pairs"):
        split.check_zero_crossings(rows, groups, relationships=pair)
    assert split.check_zero_crossings(rows, groups, relationships=pair.assign(trusted=False)).ok
    with pytest.raises(split.SplitIntegrityError, match="appear twice"):
        split.check_zero_crossings(pd.concat([rows, rows.iloc[:1]]), groups)
    with pytest.raises(split.SplitIntegrityError, match="neither split nor quarantined"):
        split.check_zero_crossings(rows.iloc[1:], groups, quarantined=held)
    with pytest.raises(split.SplitIntegrityError, match="both split and quarantined"):
        split.check_zero_crossings(rows, groups, quarantined=pd.concat([held, rows.iloc[:1]]))


# --------------------------------------------------------------------------- load_frozen
def test_load_frozen_verifies_and_records_inputs(frozen):
    ctx, record = frozen
    ch = Chapter(ctx.run_dir, "probes")
    fz = split.load_frozen(ch)
    assert set(split.FROZEN_FILES) <= set(ch.inputs) and "split/split.json" in ch.inputs
    assert {k: ch.inputs[k] for k in split.FROZEN_FILES} == record["fingerprints"]
    assert {name: len(fz.rows_for(name)) for name in TARGET} == record["totals"]
    assert fz.class_names == [c["name"] for c in fz.class_map["classes"]] and fz.crossings.ok
    with pytest.raises(KeyError):
        fz.rows_for("holdout")


@pytest.mark.parametrize("victim", ["audit/groups.parquet", "split/class_map.json",
                                    "corpus/manifest.parquet", "split/split.parquet"])
def test_load_frozen_refuses_a_changed_artifact(frozen, tmp_path, victim):
    run_dir = fresh_copy(frozen, tmp_path)
    recorded = json.loads((run_dir / "split/split.json").read_text())["fingerprints"][victim]
    stage = victim.split("/")[0]
    if victim.endswith(".parquet"):  # an upstream rerun: rewritten AND re-registered
        frame = pd.read_parquet(run_dir / victim)
        column = "group_id" if "group_id" in frame else "class_name"
        frame.loc[frame.index[0], column] = frame[column].iloc[-1]
        Chapter(run_dir, stage).write_parquet(victim, frame)
    else:  # a hand edit
        class_map = json.loads((run_dir / victim).read_text())
        class_map["classes"][0]["name"] = "Tomato___renamed"
        evidence.atomic_write_json(run_dir / victim, class_map)
    with pytest.raises(FingerprintMismatch) as caught:
        split.load_frozen(Chapter(run_dir, "training"))
    message = str(caught.value)
    assert message.startswith(victim) and recorded[:16] in message
    assert evidence.sha256_file(run_dir / victim)[:16] in message
    assert "rerun chapter 'split'" in message and "'training' refuses" in message


def test_load_frozen_rechecks_crossings_behind_consistent_fingerprints(frozen, tmp_path):
    run_dir = fresh_copy(frozen, tmp_path)
    rows = pd.read_parquet(run_dir / "split/split.parquet")
    biggest = rows["group_id"].value_counts().index[0]
    victim = rows.index[rows["group_id"] == biggest][0]
    rows.loc[victim, "split"] = "val" if rows.loc[victim, "split"] != "val" else "train"
    # A forged freeze: new split file, split.json fingerprints and registry all updated to match.
    ch = Chapter(run_dir, "split")
    record = json.loads((run_dir / "split/split.json").read_text())
    record["fingerprints"]["split/split.parquet"] = ch.write_parquet("split/split.parquet", rows)
    ch.write_json("split/split.json", record)
    with pytest.raises(split.LeakageError, match=f"group {biggest}"):
        split.load_frozen(Chapter(run_dir, "training"))


def test_load_frozen_without_a_split_says_what_to_run(tmp_path):
    with pytest.raises(FingerprintMismatch, match="run chapter 'split'"):
        split.load_frozen(Chapter(tmp_path, "probes"))


def test_read_frozen_reads_back_as_a_later_chapter_would(frozen, tmp_path):
    ctx, record = frozen
    before = (ctx.run_dir / "split/split.json").read_bytes()
    fz, verified = split.read_frozen(ctx.run_dir)
    assert isinstance(fz, split.FrozenSplit) and fz.crossings.ok
    # every frozen file re-hashed, each as recorded (and split.json itself, which lists them)
    assert {k: verified[k] for k in record["fingerprints"]} == record["fingerprints"]
    assert set(verified) == {*record["fingerprints"], "split/split.json"}
    assert fz.split_json["fingerprints"] == record["fingerprints"]
    assert {name: len(fz.rows_for(name)) for name in TARGET} == record["totals"]
    pd.testing.assert_frame_equal(split.read_frozen(str(ctx.run_dir))[0].rows, fz.rows)
    assert (ctx.run_dir / "split/split.json").read_bytes() == before  # reading writes nothing
    run_dir = fresh_copy(frozen, tmp_path)
    rows = pd.read_parquet(run_dir / "split/split.parquet")
    rows.iloc[:-1].to_parquet(run_dir / "split/split.parquet")  # a hand edit behind the fingerprints
    with pytest.raises(FingerprintMismatch, match="split/split.parquet does not match"):
        split.read_frozen(run_dir)
