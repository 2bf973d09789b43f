"""The field cohort's content-hash sample (``field_transfer.sample_fraction``): the corpus chapter's rule,
every file still accounted for (not-sampled files listed with their hashes), bad fractions refused by
name, and the synthetic cohort never sampled."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cropcop_utils.core import config
from cropcop_utils.corpus import in_sample
from cropcop_utils.field import cohort
from cropcop_utils.field.prose import headline

FIELD_APPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "field-apple"
LAB = ["Apple_Black_rot", "Apple_healthy", "Apple_rust", "Apple_scab"]
FRACTION = 0.5


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _jpeg(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 16, 3), (value, 255 - value, 40), np.uint8)).save(path, format="JPEG")


@pytest.fixture()
def orchard(tmp_path: Path) -> Path:
    """40 distinct photos over three lab classes and one class without a lab counterpart, a byte-identical
    pair, OS junk and a stray file (both outside the sample's reach: quarantined whatever the hash)."""
    root = tmp_path / "orchard"
    for i in range(40):
        _jpeg(root / ["Apple_scab", "Apple_rust", "Apple_healthy", "Pear_blight"][i % 4] / f"p{i}.jpg", 6 * i)
    (root / "Apple_scab" / "copy.jpg").write_bytes((root / "Apple_scab" / "p0.jpg").read_bytes())
    (root / "Apple_scab" / ".DS_Store").write_bytes(b"junk")
    (root / "stray.jpg").write_bytes((root / "Apple_rust" / "p1.jpg").read_bytes())
    listed = "".join(f"Apple_rust/p{i}.jpg,rust,Apple_rust\n" for i in range(1, 40, 4))
    (root / "labels.csv").write_text("path,source_label,lab_class\n" + listed)
    return root


def test_a_sample_keeps_the_content_hash_fraction_and_lists_every_other_file(orchard: Path) -> None:
    whole = cohort.scan_field(orchard, LAB)
    scan = cohort.scan_field(orchard, LAB, sample_fraction=FRACTION)
    s = scan.summary
    # the corpus chapter's rule, file by file: admitted iff the content hash is in the fraction
    expected = sorted(r for r in whole.rows["rel_path"] if in_sample(_sha(orchard / r), FRACTION))
    assert 0 < len(expected) < len(whole.rows)
    assert sorted(scan.rows["rel_path"]) == expected
    # nothing silently dropped: every seen file is admitted, quarantined, left out or listed as not sampled
    assert s["files_seen"] == whole.summary["files_seen"] == 43 and s["identity_holds"]
    assert s["files_seen"] == s["admitted"] + s["quarantined"] + s["left_out"] + s["not_sampled"]
    assert s["not_sampled"] == len(scan.not_sampled) > 0
    assert s["sample"] == {"fraction": FRACTION, "key": cohort.SAMPLE_KEY, "rule": cohort.SAMPLE_RULE,
                           "sampled": s["files_seen"] - s["not_sampled"],
                           "not_sampled_list": cohort.NOT_SAMPLED}
    listed = scan.not_sampled.set_index("rel_path")
    for rel, row in listed.iterrows():
        assert row["sha256"] == _sha(orchard / rel) and not in_sample(row["sha256"], FRACTION)
        assert row["row_id"] == cohort.field_row_id(rel) and row["class_name"] == rel.split("/")[0]
    # files the hash cannot judge stay where the corpus contract puts them
    assert set(scan.quarantine["reason"]) == {"os_junk", "outside_layout"}
    # byte-identical copies are in or out together
    pair = {"Apple_scab/p0.jpg", "Apple_scab/copy.jpg"}
    assert len(pair & set(scan.rows["rel_path"])) in (0, 2) and len(pair & set(listed.index)) in (0, 2)
    # class matching still sees the whole cohort; labels.csv entries of not-sampled files are not "missing"
    assert scan.unmatched_classes == ["Pear_blight"] and s["labels_csv_without_file"] == []
    assert s["left_out"] + (listed["class_name"] == "Pear_blight").sum() == 10
    again = cohort.scan_field(orchard, LAB, sample_fraction=FRACTION)
    assert again.rows["rel_path"].tolist() == scan.rows["rel_path"].tolist()  # deterministic
    assert whole.summary["sample"]["fraction"] is None and whole.summary["not_sampled"] == 0
    assert len(whole.not_sampled) == 0


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, True, "0.1"])
def test_a_bad_fraction_is_refused_by_its_key(orchard: Path, bad) -> None:
    with pytest.raises(cohort.FieldSampleError, match=r"field_transfer\.sample_fraction"):
        cohort.scan_field(orchard, LAB, sample_fraction=bad)


def test_the_fraction_comes_from_the_profile_for_a_real_cohort_only(tmp_path: Path, orchard: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    ctx = config.open_run(tmp_path / "real", profile="smoke_field", data=str(lab), field=str(orchard))
    profile = config.load_profile("smoke_field")
    assert cohort.sample_fraction(ctx) == profile["field_transfer"]["sample_fraction"] == 0.12
    assert cohort.sample_fraction(config.open_run(tmp_path / "whole", profile="smoke", data=str(lab),
                                                  field=str(orchard))) is None
    # the synthetic cohort is generated at the profile's size: never sampled
    synthetic = config.open_run(tmp_path / "synthetic", profile="smoke_field")
    assert synthetic.field == config.SYNTHETIC and cohort.sample_fraction(synthetic) is None


def test_the_chapter_headline_counts_the_files_left_out_of_the_sample(orchard: Path) -> None:
    summary = cohort.scan_field(orchard, LAB, sample_fraction=FRACTION).summary
    facts = {"params": {"ci_level": 0.95}, "status": "measured", "cohort": summary, "states": {}}
    text = headline(facts)
    assert f"The field cohort holds {summary['files_seen']} files: {summary['admitted']} admitted" in text
    assert f"{summary['not_sampled']} not in the content-hash sample (fraction {FRACTION}" in text
    assert cohort.NOT_SAMPLED in text
    whole = cohort.scan_field(orchard, LAB).summary
    assert "content-hash sample" not in headline({**facts, "cohort": whole})


def test_the_real_field_apple_sample_of_the_smoke_field_profile() -> None:
    if not FIELD_APPLE.is_dir():
        pytest.skip(f"real field data not present at {FIELD_APPLE}")
    fraction = config.load_profile("smoke_field")["field_transfer"]["sample_fraction"]
    scan = cohort.scan_field(FIELD_APPLE, LAB, sample_fraction=fraction)
    s = scan.summary
    # measured at 0.12: 74 of the 600 orchard photos, 17-20 per class
    assert s["identity_holds"] and s["files_seen"] == 600 and s["admitted"] + s["not_sampled"] == 600
    assert 60 <= s["admitted"] <= 100 and not scan.untested_classes
    assert min(s["per_class"].values()) >= 15
    assert all(in_sample(h, fraction) for h in scan.rows["sha256"])
