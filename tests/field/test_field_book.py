"""Chapters 10 and 11 on real field photographs: the apple smoke book (``apple_field_smoke_book``, profile
smoke_field) runs with ``--field`` the real orchard cohort, sampled by content hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from cropcop_utils import book
from cropcop_utils.core import config
from cropcop_utils.corpus import in_sample
from cropcop_utils.field import cohort as field_cohort


@pytest.mark.slow
def test_chapters_10_and_11_run_on_a_content_hash_sample_of_real_orchard_photos(apple_field_smoke_book):
    run = Path(apple_field_smoke_book["run_dir"])
    orchard = Path(apple_field_smoke_book["field_root"]).resolve()
    assert apple_field_smoke_book["chapters"] == [c.name for c in book.CHAPTERS]
    fraction = config.load_profile("smoke_field")["field_transfer"]["sample_fraction"]
    field = json.loads((run / "field/field.json").read_text())
    assert field["status"] == "measured" and field["field_root"] == str(orchard)

    # the cohort is the real orchard photos of the sample, and every other photo is listed, with its hash
    c = field["cohort"]
    assert c["sample"]["fraction"] == fraction and c["identity_holds"]
    assert c["files_seen"] == c["admitted"] + c["quarantined"] + c["left_out"] + c["not_sampled"]
    on_disk = {p.relative_to(orchard).as_posix() for p in orchard.glob("*/*") if p.is_file()}
    assert c["files_seen"] == len(on_disk)
    rows = pd.read_parquet(run / "field/cohort.parquet")
    dropped = pd.read_parquet(run / field_cohort.NOT_SAMPLED)
    # measured: 74 of the 600 photos at fraction 0.12 (17-20 per class), 526 not sampled
    assert 60 <= len(rows) == c["admitted"] <= 100 and len(dropped) == c["not_sampled"]
    assert set(rows["rel_path"]) | set(dropped["rel_path"]) == on_disk
    assert not set(rows["rel_path"]) & set(dropped["rel_path"])
    for rel in rows["rel_path"]:
        assert in_sample(hashlib.sha256((orchard / rel).read_bytes()).hexdigest(), fraction), rel
    assert not any(in_sample(h, fraction) for h in dropped["sha256"])

    # classes map: the folder names are the lab classes, labels are their indices, labels.csv's own names kept
    classes = field["classes"]
    assert set(rows["class_name"]) == set(classes)
    assert not c["untested_classes"] and not c["unmatched_classes"]
    assert (rows["label"] == rows["class_name"].map(classes.index)).all()
    assert (rows["rel_path"].str.split("/").str[0] == rows["class_name"]).all()
    source = pd.read_csv(orchard / "labels.csv").set_index("path")["source_label"]
    assert (rows["source_label"] == rows["rel_path"].map(source)).all()
    black_rot = c["per_class"]["Apple_Black_rot"]
    assert c["per_source_label"]["Apple_Black_rot"] == {"frog_eye_leaf_spot": black_rot}  # by symptom

    # chapter 10's figures are computed on those photos, for every state
    for state, entry in field["states"].items():
        scored = pd.read_parquet(run / f"field/predictions_{state}.parquet")
        assert sorted(scored["row_id"]) == sorted(rows["row_id"]), state
        truth = scored["row_id"].map(rows.set_index("row_id")["label"])
        assert entry["field"]["n"] == len(rows)
        assert entry["field"]["accuracy"]["value"] == pytest.approx((scored["pred"] == truth).mean())
        assert field["figures"][f"{state}_field_accuracy"] == entry["field"]["accuracy"]["value"]
        assert field["swap"]["states"][state]["cells"]["field_field"]["n"] == len(rows)
    composites = pd.read_parquet(run / "field/composites.parquet")
    backdrops = composites.loc[composites["cell"] == "lab_field", "backdrop_rel_path"]
    assert len(backdrops) and set(backdrops) <= set(rows["rel_path"])  # field backdrops from the sample
    notebook = (Path(apple_field_smoke_book["book_dir"]) / "10_field.ipynb").read_text()
    assert f"{c['not_sampled']} not in the content-hash sample" in notebook

    # chapter 11 reports the field block on the same photos
    abstention = json.loads((run / "abstention/abstention.json").read_text())
    figures = abstention["figures"]
    assert figures["field_given"] and figures["field_note"] is None
    per_source = rows["source_label"].value_counts().to_dict()
    for state, entry in figures["states"].items():
        block = entry["field"]
        assert block["n"] == block["labelled"] == len(rows), state
        assert {k: v["n"] for k, v in block["by_source_label"].items()} == per_source
        scored = field["states"][state]["field"]["accuracy"]["value"]
        assert block["accuracy_all"]["value"] == pytest.approx(scored)  # the same predictions
    assert abstention["deployment"]["field"]["n"] == len(rows)


@pytest.mark.slow
def test_the_field_adapted_regime_runs_the_chain_beside_the_baseline(apple_field_smoke_book):
    run = Path(apple_field_smoke_book["run_dir"])
    split = json.loads((run / "split/split.json").read_text())
    field_split = pd.read_parquet(run / "split/field_train.parquet")
    counts = field_split["split"].value_counts().to_dict()
    assert set(counts) == {"train", "val"} and min(counts.values()) > 0

    # chapter 5: the adapted regime trained on lab + field train rows, was selected on lab + field val,
    # and says which field-train split it used; the baseline saw no field photo
    training = json.loads((run / "training/training.json").read_text())
    assert training["shipped_regime"] == "field_adapted" and set(training["regimes"]) == {"baseline",
                                                                                           "field_adapted"}
    assert training["field_train_splits"]["train"] == counts["train"]
    assert training["field_train_splits"]["val"] == counts["val"]
    adapted = training["regimes"]["field_adapted"]["models"]
    baseline = training["regimes"]["baseline"]["models"]
    lab_val = training["splits"]["val"]
    for kind in ("reference", "compact"):
        regime = adapted[kind]["hyperparameters"]["regime"]
        assert regime == {"name": "field_adapted",
                          "field_train_split_sha256": split["fingerprints"]["split/field_train.parquet"]}
        assert adapted[kind]["val_by_source"]["field_train"]["n"] == counts["val"]
        assert adapted[kind]["val_by_source"]["lab"]["n"] == lab_val
        assert baseline[kind]["val_by_source"] is None and "regime" not in baseline[kind]["hyperparameters"]
    val = pd.read_parquet(run / "training/compact/predictions_val.parquet")
    assert len(val) == lab_val + counts["val"]
    assert len(pd.read_parquet(run / "training/baseline/compact/predictions_val.parquet")) == lab_val

    # chapter 6 calibrates the adapted model on its own training rows, field photos among them
    calibration = pd.read_parquet(run / "ptq/calibration_rows.parquet")
    assert set(calibration["split"]) == {"train"} and "field_train" in set(calibration["source"])
    assert set(calibration.loc[calibration["source"] == "field_train", "row_id"]) <= set(
        field_split.loc[field_split["split"] == "train", "row_id"])

    # chapter 10: each state's cohort score also on the photos with no field-train relative
    field = json.loads((run / "field/field.json").read_text())
    groups = pd.read_parquet(run / "audit/cross_groups.parquet")
    assert field["field_train"]["folder"] == str(Path(apple_field_smoke_book["field_train_root"]).resolve())
    with_train = set(groups.loc[groups["set"] == "field_train", "group_id"])
    trusted = groups["set"].str.startswith("cohort:") & groups["group_id"].isin(with_train)
    assert field["field_train"]["trusted_relative"] == int(trusted.sum())
    for state, entry in field["states"].items():
        effect = entry["field"]["field_train_relatives"]
        assert effect["related"] == field["field_train"]["cohort_photos_with_relative"], state
        assert effect["related"] + effect["unrelated"] == entry["field"]["n"]
    assert set(field["regimes"]) == {"baseline", "field_adapted"} and field["regime"] == "field_adapted"

    # chapter 11 fits the adapted model's temperature and thresholds on its own val rows (lab + field)
    abstention = json.loads((run / "abstention/abstention.json").read_text())
    assert abstention["figures"]["n_val"] == lab_val + counts["val"]
    card_text = (run / "field/card.md").read_text()
    assert "after adaptation with labelled field photos" in card_text and "Where the claim stops" in card_text
    # both folders declared as one source (conftest.ORCHARD_SOURCE): the cohort is in-source, and no cohort
    # from another source was given, which the card says
    (cohort,) = field["cohorts"]
    assert (cohort["relation"], cohort["source"]) == ("in-source", "plant-pathology-2021")
    assert cohort["regimes"]["field_adapted"]["pte"] == field["states"]["pte"]["field"]
    assert f"`{cohort['name']}` (in-source)" in card_text
    assert "no field cohort from another source" in card_text


@pytest.mark.slow
def test_the_learning_curve_reads_chapter_5s_models_instead_of_training_them_again(apple_field_smoke_book):
    """smoke_field trains the field-adapted compact model with the curve's recipe and asks for k = 0 from the
    baseline: the curve's point that draws every field-train photo is the shipped compact model and k = 0
    the baseline's, each scored from chapters 5 and 10's records, and no fine-tune runs."""
    from cropcop_utils.core.evidence import sha256_file
    from cropcop_utils.field import curve, curve_draws

    run = Path(apple_field_smoke_book["run_dir"])
    record = json.loads((run / "field/curve.json").read_text())
    field = json.loads((run / "field/field.json").read_text())
    table = pd.read_parquet(run / curve.CURVE).set_index(["learner", "k"])
    full, zero = table.loc[(curve_draws.FINETUNE, 500)], table.loc[(curve_draws.FINETUNE, 0)]
    assert full["note"].startswith("reused: the run's field-adapted compact model")
    assert zero["note"].startswith("reused: the run's baseline compact model")
    assert record["finetune"]["reused"] == {"0": zero["note"], "500": full["note"]}
    assert record["finetune"]["k_zero"] == "reused the run's baseline compact model"
    assert full["model_state"] == sha256_file(run / "training/compact/best.pt")
    assert zero["model_state"] == sha256_file(run / "training/baseline/compact/best.pt")
    assert full["n_field"] == record["field_train"]["train_rows"] and zero["n_field"] == 0
    assert pd.isna(full["seconds"]) and pd.isna(zero["seconds"]) and not (run / "field/curve").exists()
    # the same figures chapter 10 measured for those models on the same cohort
    states = {"500": field["states"]["compact"], "0": field["regimes"]["baseline"]["states"]["compact"]}
    for point, entry in (("500", full), ("0", zero)):
        measured = states[point]
        assert entry["field_accuracy"] == pytest.approx(measured["field"]["accuracy"]["value"]), point
        assert entry["lab_test_macro_f1"] == pytest.approx(measured["lab_test"]["macro_f1"]["value"]), point
