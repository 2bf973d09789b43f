"""Field-train photos in chapter 1: scanned by the corpus rules against the lab class map, every file
accounted for, row ids of their own, and the field cohort's scan unchanged by the move."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from corpus.corpus_files import jpeg, write

from cropcop_utils import corpus
from cropcop_utils.core import config
from cropcop_utils.core.evidence import row_id, verify_registry
from cropcop_utils.corpus import field_sets, field_train
from cropcop_utils.field import cohort

FIELD_APPLE_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "data" / "field-apple-train"


@pytest.fixture()
def orchard_train(tmp_path: Path) -> Path:
    """Field-train photos for the broken corpus's classes (alpha, beta; solo is quarantined there)."""
    root = tmp_path / "orchard_train"
    for k in range(3):
        jpeg(root / "alpha" / f"fa{k}.jpg", 100 + k)
    jpeg(root / "beta" / "fb0.jpg", 110)
    jpeg(root / "beta" / "fb1.jpg", 111)
    jpeg(root / "solo" / "fs0.jpg", 120)          # the lab quarantined solo: no lab class, left out
    jpeg(root / "gamma" / "fg0.jpg", 130)         # no lab counterpart: left out
    write(root / "alpha" / "zero.jpg", b"")
    write(root / "beta" / "note.jpg", b"<html>not a picture</html>")
    write(root / "alpha" / ".DS_Store", b"junk")
    jpeg(root / "stray.jpg", 140)                 # outside the layout
    (root / "labels.csv").write_text("path,source_label,lab_class\n"
                                     "alpha/fa0.jpg,alpha_spots,alpha\n"
                                     "alpha/fa1.jpg,alpha_spots,beta\n")  # disagrees with its folder
    return root


EXPECTED = {"admitted": {"alpha/fa0.jpg", "alpha/fa2.jpg", "beta/fb0.jpg", "beta/fb1.jpg"},
            "quarantined": {"alpha/fa1.jpg": field_sets.LABEL_CONFLICT, "alpha/zero.jpg": "zero_byte",
                            "beta/note.jpg": "not_an_image", "alpha/.DS_Store": "os_junk",
                            "stray.jpg": "outside_layout"},
            "left_out": {"solo/fs0.jpg", "gamma/fg0.jpg"}}


def test_corpus_chapter_scans_field_train_against_the_class_map(broken_corpus, orchard_train, tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(broken_corpus),
                          field_train=str(orchard_train), overrides={"corpus": {"max_image_pixels": 5000}})
    record = corpus.run_chapter(ctx, workers=1, progress=False)
    run = tmp_path / "run"
    block = record["figures"]["field_train"]
    assert block["folder"] == str(orchard_train.resolve())
    assert (block["files_seen"], block["admitted"], block["quarantined"], block["left_out"],
            block["not_sampled"]) == (11, 4, 5, 2, 0) and block["identity_holds"]
    rows = pd.read_parquet(run / field_train.ROWS)
    assert list(rows.columns) == field_train.ROW_COLUMNS
    assert set(rows["rel_path"]) == EXPECTED["admitted"]
    assert all(rows["row_id"] == rows["rel_path"].map(lambda rel: row_id(f"field_train/{rel}")))
    lab = pd.read_parquet(run / "corpus/manifest.parquet")
    assert not set(rows["row_id"]) & set(lab["row_id"])
    class_map = json.loads((run / "corpus/class_map.json").read_text())
    classes = {c["name"]: c["index"] for c in class_map["classes"]}
    assert all(rows["label"] == rows["class_name"].map(classes))
    assert rows.set_index("rel_path").at["alpha/fa0.jpg", "source_label"] == "alpha_spots"
    quarantine = pd.read_parquet(run / field_train.QUARANTINE)
    assert dict(zip(quarantine["rel_path"], quarantine["reason"], strict=True)) == EXPECTED["quarantined"]
    left = pd.read_parquet(run / field_train.LEFT_OUT)
    assert set(left["rel_path"]) == EXPECTED["left_out"]
    assert block["unmatched_classes"] == ["gamma", "solo"] and block["untested_classes"] == []
    assert block["per_class"] == {"alpha": 2, "beta": 2}
    assert block["per_source_label"] == {"alpha": {"alpha": 1, "alpha_spots": 1}, "beta": {"beta": 2}}
    assert block["quarantine_reasons"] == {"os_junk": 1, "outside_layout": 1, "zero_byte": 1,
                                           "not_an_image": 1, field_sets.LABEL_CONFLICT: 1}
    assert verify_registry(run)["matches"].all()
    # the lab corpus's figures do not move
    plain = corpus.run_chapter(config.open_run(tmp_path / "plain", profile="smoke", data=str(broken_corpus),
                                               overrides={"corpus": {"max_image_pixels": 5000}}),
                               workers=1, progress=False)
    assert plain["figures"]["field_train"] is None
    same = ("files_seen", "admitted", "quarantined", "class_map_fingerprint", "corpus_fingerprint")
    assert {k: plain["figures"][k] for k in same} == {k: record["figures"][k] for k in same}


def test_field_train_follows_the_corpus_sample(orchard_train, tmp_path):
    class_map = {"fingerprint": "x", "classes": [{"index": 0, "name": "alpha"}, {"index": 1, "name": "beta"}]}
    whole = field_train.scan_field_train(orchard_train, class_map)
    half = field_train.scan_field_train(orchard_train, class_map, sample_fraction=0.5)
    s = half.summary
    assert s["files_seen"] == whole.summary["files_seen"] and s["identity_holds"]
    assert s["sample"]["key"] == "corpus.sample_fraction"
    assert s["sample"]["not_sampled_list"] == field_train.NOT_SAMPLED
    assert s["not_sampled"] > 0 and s["admitted"] < whole.summary["admitted"]
    assert all(half.not_sampled["row_id"] == half.not_sampled["rel_path"].map(
        lambda rel: row_id(f"field_train/{rel}")))
    with pytest.raises(field_sets.FieldSampleError, match=r"corpus\.sample_fraction"):
        field_train.scan_field_train(orchard_train, class_map, sample_fraction=1.5)


def test_the_cohort_scan_is_the_moved_scanner_with_cohort_ids(orchard_train):
    assert cohort.scan_field is field_sets.scan_field and cohort.FieldScan is field_sets.FieldScan
    scan = cohort.scan_field(orchard_train, ["alpha", "beta"])
    assert all(scan.rows["row_id"] == scan.rows["rel_path"].map(lambda rel: row_id(f"field/{rel}")))
    assert cohort.field_row_id("alpha/fa0.jpg") == row_id("field/alpha/fa0.jpg")


@pytest.mark.skipif(not FIELD_APPLE_TRAIN.is_dir(), reason="../shared/data/field-apple-train is not here")
def test_real_field_apple_train_is_accounted_for():
    names = ["Apple_Black_rot", "Apple_healthy", "Apple_rust", "Apple_scab"]
    lab = {"fingerprint": "x", "classes": [{"index": i, "name": n} for i, n in enumerate(names)]}
    s = field_train.scan_field_train(FIELD_APPLE_TRAIN, lab, workers=1).summary  # ~3 s: 2,000 small JPEGs
    assert (s["files_seen"], s["admitted"], s["quarantined"], s["left_out"]) == (2000, 2000, 0, 0)
    assert s["identity_holds"] and s["labels_csv_entries"] == 2000 and s["labels_csv_without_file"] == []
    assert s["per_class"] == dict.fromkeys(names, 500)
    assert s["per_source_label"]["Apple_Black_rot"] == {"frog_eye_leaf_spot": 500}
    assert s["unmatched_classes"] == [] and s["untested_classes"] == []


def test_a_profile_may_sample_field_train_apart_from_the_lab_corpus(orchard_train):
    class_map = {"fingerprint": "x", "classes": [{"index": 0, "name": "alpha"}, {"index": 1, "name": "beta"}]}

    class Run:  # what run_field_train reads of a RunContext
        field_train_root = orchard_train

        def __init__(self, corpus: dict) -> None:
            self.corpus = corpus

        def section(self, name: str) -> dict:
            return self.corpus

    class Tables:
        def write_parquet(self, rel: str, frame) -> None:
            pass

    lab_only = field_train.run_field_train(Run({"sample_fraction": 0.5}), Tables(), class_map, 1, False)
    own = field_train.run_field_train(Run({"sample_fraction": 0.5, "field_train_sample_fraction": None}),
                                      Tables(), class_map, 1, False)
    assert lab_only["sample"]["key"] == "corpus.sample_fraction" and lab_only["not_sampled"] > 0
    assert own["sample"]["key"] == "corpus.field_train_sample_fraction" and own["not_sampled"] == 0
