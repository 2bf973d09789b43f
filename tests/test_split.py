"""Chapter 3 (split): grouped stratified assignment, read-back leakage checks, frozen fingerprints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cropcop_utils import config, evidence, split
from cropcop_utils.evidence import Chapter, FingerprintMismatch

TARGET = {"train": 0.70, "val": 0.15, "test": 0.15}


# --------------------------------------------------------------------------- fixtures
def planted_corpus(seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Admitted rows with planted leakage groups: singletons, pairs, some large groups, one
    label-conflict group, a two-image class (cannot reach three splits) and one unreadable file."""
    rng = np.random.default_rng(seed)
    sizes = {"Tomato___healthy": 420, "Tomato___Late_blight": 300, "Tomato___Early_blight": 180,
             "Tomato___Leaf_Mold": 90, "Tomato___Target_Spot": 40, "Tomato___mosaic_virus": 14,
             "Tomato___rare_pest": 8}
    rows, group = [], 0
    for name, n in sizes.items():
        left = n
        large = [40, 25] if n >= 300 else ([12] if n >= 90 else [])
        for size in large + [int(s) for s in rng.geometric(0.55, size=n)]:
            size = min(size, left)
            if size <= 0:
                break
            for k in range(size):
                rows.append((f"train/{name}/{name}_{group}_{k}.jpg", name, group))
            group, left = group + 1, left - size
    # A label-conflict group: the same leaf filed under two classes (majority Late_blight).
    rows += [(f"test/Tomato___Late_blight/dup_{k}.jpg", "Tomato___Late_blight", group) for k in range(5)]
    rows += [(f"test/Tomato___Early_blight/dup_{k}.jpg", "Tomato___Early_blight", group) for k in range(2)]
    group += 1
    rows += [(f"train/Tomato___one_leaf/{k}.jpg", "Tomato___one_leaf", group + k) for k in range(2)]
    frame = pd.DataFrame(rows, columns=["rel_path", "class_name", "group_id"])
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    return frame[["row_id", "rel_path", "class_name", "group_id"]], pd.DataFrame(
        [{"row_id": evidence.row_id("train/Tomato___healthy/broken.jpg"),
          "rel_path": "train/Tomato___healthy/broken.jpg", "class_name": "Tomato___healthy"}])


def write_upstream(run_dir: Path, admitted: pd.DataFrame, rejected: pd.DataFrame,
                   audit_record: dict | None = None, shuffle: int | None = None) -> None:
    """Write corpus/ and audit/ artifacts in the contract's schemas, registered like the real chapters."""
    seen = pd.concat([admitted.assign(admitted=True, quarantine_reason=None),
                      rejected.assign(admitted=False, quarantine_reason="truncated")], ignore_index=True)
    manifest = pd.DataFrame({
        "row_id": seen["row_id"], "rel_path": seen["rel_path"], "class_name": seen["class_name"],
        "inherited_split": seen["rel_path"].str.split("/").str[0], "bytes": 1000, "sha256": "0" * 64,
        "format": "JPEG", "width": 64, "height": 64, "mode": "RGB", "exif_orientation": 1,
        "exif_make": None, "exif_model": None,
        "decode_status": np.where(seen["admitted"], "ok", "error"), "error": None,
        "admitted": seen["admitted"], "quarantine_reason": seen["quarantine_reason"]})
    groups = admitted[["row_id", "group_id"]].copy()
    groups["group_size"] = groups["group_id"].map(groups["group_id"].value_counts())
    if shuffle is not None:  # the same content in another order must give the same split
        manifest = manifest.sample(frac=1, random_state=shuffle)
        groups = groups.sample(frac=1, random_state=shuffle)
    pairs = []
    for _, members in admitted.groupby("group_id"):
        for a, b in zip(members.itertuples(), members.iloc[1:].itertuples(), strict=False):
            pairs.append({"row_id_a": a.row_id, "row_id_b": b.row_id, "rel_path_a": a.rel_path,
                          "rel_path_b": b.rel_path, "kind": "exact_pixels", "phash_distance": 0,
                          "dhash_distance": 0, "verify_score": 1.0, "trusted": True,
                          "class_a": a.class_name, "class_b": b.class_name,
                          "label_conflict": a.class_name != b.class_name})
    singles = admitted.drop_duplicates("group_id").iloc[:6]  # untrusted near pairs between groups
    for a, b in zip(singles.iloc[::2].itertuples(), singles.iloc[1::2].itertuples(), strict=False):
        pairs.append({"row_id_a": a.row_id, "row_id_b": b.row_id, "rel_path_a": a.rel_path,
                      "rel_path_b": b.rel_path, "kind": "near", "phash_distance": 9, "dhash_distance": 11,
                      "verify_score": 0.4, "trusted": False, "class_a": a.class_name,
                      "class_b": b.class_name, "label_conflict": a.class_name != b.class_name})
    relationships = pd.DataFrame(pairs)
    relationships["split_a"] = relationships["rel_path_a"].str.split("/").str[0]
    relationships["split_b"] = relationships["rel_path_b"].str.split("/").str[0]
    relationships["crosses_split"] = relationships["split_a"] != relationships["split_b"]
    support = admitted["class_name"].value_counts()
    classes = [{"index": i, "name": name, "crop": "tomato", "condition": name.split("___")[1].lower(),
                "type": "healthy" if name.endswith("healthy") else "specific", "pest": "pest" in name,
                "fruit": False, "naming": "plantvillage", "support": int(support[name])}
               for i, name in enumerate(sorted(support.index))]
    corpus = Chapter(run_dir, "corpus")
    corpus.write_parquet("corpus/manifest.parquet", manifest)
    corpus.write_json("corpus/class_map.json", {
        "fingerprint": evidence.sha256_json(classes), "classes": classes,
        "quarantined_classes": [{"name": "Tomato___single", "reason": "class_below_min_support",
                                 "support": 1}]})
    audit = Chapter(run_dir, "audit")
    audit.write_parquet("audit/relationships.parquet", relationships)
    audit.write_parquet("audit/groups.parquet", groups)
    audit.write_json("audit/audit.json", audit_record if audit_record is not None else {
        "chapter": "audit", "figures": {"inherited_partition": {
            "decision": "reject", "rejected": True, "reason": "trusted relationships cross"}}})


def make_run(run_dir: Path, overrides: dict | None = None, **upstream) -> config.RunContext:
    ctx = config.open_run(run_dir, profile="smoke", overrides=overrides)
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected, **upstream)
    return ctx


@pytest.fixture(scope="module")
def frozen(tmp_path_factory) -> tuple[config.RunContext, dict]:
    ctx = make_run(tmp_path_factory.mktemp("split") / "run")
    return ctx, split.run_chapter(ctx)


def fresh_copy(frozen, tmp_path: Path) -> Path:
    ctx, _ = frozen
    target = tmp_path / "run"
    shutil.copytree(ctx.run_dir, target)
    return target


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


def test_repair_moves_whole_groups_or_quarantines():
    live = pd.DataFrame({
        "row_id": [f"r{i}" for i in range(11)],
        "class_name": ["A"] * 6 + ["B"] * 2 + ["C"] * 3,
        "group_id": [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        "split": ["train"] * 4 + ["val", "test", "train", "train", "train", "val", "test"]})
    fixed, repairs, quarantined = split._repair_coverage(live.copy(), min_per_split=1)
    # B (two groups, both in train) cannot reach all three splits without emptying one: quarantined.
    assert [(q["name"], q["reason"]) for q in quarantined] == [("B", "cannot_cover_every_split")]
    assert "B" not in set(fixed["class_name"]) and len(fixed) == 9
    assert [(r["class_name"], r["to"]) for r in repairs] == [("B", "val")]
    starving = live.assign(split=["train"] * 4 + ["val", "val", "train", "val", "train", "val", "test"])
    fixed, repairs, _ = split._repair_coverage(starving.copy(), min_per_split=1)
    # A lacks test: the smallest A group whose donor keeps an A row moves (group 2, not the pair).
    assert repairs[0] == {"class_name": "A", "group_id": 2, "from": "train", "to": "test", "rows": 1}
    assert fixed.groupby("group_id")["split"].nunique().max() == 1
    assert (pd.crosstab(fixed["class_name"], fixed["split"]) >= 1).all().all()


@pytest.mark.parametrize("seed,n_folds", [(0, 5), (1, 20)])
def test_vectorised_splitter_gives_sklearns_folds(seed, n_folds):
    from sklearn.model_selection import StratifiedGroupKFold

    rng = np.random.default_rng(seed)
    y, groups = rng.integers(0, 6, 400), rng.integers(0, 260, 400)
    folds = [[test.tolist() for _, test in cls(n_folds, shuffle=True, random_state=seed).split(
        np.zeros(400), y, groups)] for cls in (StratifiedGroupKFold, split.VectorisedStratifiedGroupKFold)]
    assert folds[0] == folds[1]
    assert split.GroupedSplitter is split.VectorisedStratifiedGroupKFold  # the fast path is in use


def test_folds_for_expresses_fractions():
    assert split.folds_for(TARGET) == (20, {"train": 14, "val": 3, "test": 3})
    assert split.folds_for({"train": 0.8, "val": 0.1, "test": 0.1}) == (10, {"train": 8, "val": 1, "test": 1})
    n, counts = split.folds_for({"train": 0.71, "val": 0.145, "test": 0.145})
    assert n == 20 and sum(counts.values()) == 20 and min(counts.values()) >= 1
    with pytest.raises(split.SplitInputError, match="sum to 1"):
        split.parse_fractions({"train": 0.7, "val": 0.2, "test": 0.2})
    with pytest.raises(split.SplitInputError, match="train, val and test"):
        split.parse_fractions({"train": 0.8, "test": 0.2})


def test_groups_that_miss_admitted_rows_are_refused(tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke")
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected)
    groups = pd.read_parquet(ctx.run_dir / "audit/groups.parquet").iloc[5:]
    Chapter(ctx.run_dir, "audit").write_parquet("audit/groups.parquet", groups)
    with pytest.raises(split.SplitInputError, match="audit/groups.parquet does not cover"):
        split.run_chapter(ctx)


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
    out = smoke_book["book_root"] / "book" / "03_split.ipynb"
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
