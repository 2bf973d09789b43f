"""Chapters 10 and 11 on real field photographs: the apple smoke book (``apple_field_smoke_book``, profile
smoke_field) runs with ``--field`` the real orchard cohort, sampled by content hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from cropcop_utils import book, card
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
    assert card.audit_card(run) == []  # every number on the card (field block included) maps to the JSON
