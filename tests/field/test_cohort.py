"""The field cohort scan: class matching, labels.csv, masks, and every file accounted for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cropcop_utils.core import config
from cropcop_utils.corpus import CorpusLayoutError
from cropcop_utils.field import cohort

FIELD_APPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "field-apple"
LAB = ["Apple_Black_rot", "Apple_healthy", "Apple_rust", "Apple_scab"]


def _jpeg(path: Path, colour=(60, 120, 40)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 24, 3), colour, np.uint8)).save(path, format="JPEG")


@pytest.fixture()
def orchard(tmp_path: Path) -> Path:
    root = tmp_path / "orchard"
    for name in ("a1.jpg", "a2.jpg", "a3.JPG"):
        _jpeg(root / "Apple_scab" / name)
    _jpeg(root / "Apple_Black_rot" / "f1.jpg")
    _jpeg(root / "Apple_Black_rot" / "f2.jpg")
    _jpeg(root / "Pear_blight" / "p1.jpg")           # no lab counterpart: left out
    (root / "Pear_blight" / "broken.jpg").write_bytes(b"")  # left out too, not quarantined
    (root / "Apple_scab" / "empty.jpg").write_bytes(b"")
    (root / "Apple_scab" / "note.jpg").write_bytes(b"<html>not a picture</html>")
    (root / "Apple_scab" / ".DS_Store").write_bytes(b"junk")
    (root / "stray.jpg").write_bytes((root / "Apple_scab" / "a1.jpg").read_bytes())
    _jpeg(root / "Apple_scab" / "deeper" / "a4.jpg")
    (root / "Apple_rust").mkdir()                       # empty folder: the class stays untested
    (root / "labels.csv").write_text(
        "path,source_label,lab_class\n"
        "Apple_Black_rot/f1.jpg,frog_eye_leaf_spot,Apple_Black_rot\n"
        "Apple_scab/a2.jpg,scab,Apple_rust\n"            # disagrees with its folder
        "Apple_scab/gone.jpg,scab,Apple_scab\n")
    mask = root / "masks" / "Apple_scab" / "a1.png"
    mask.parent.mkdir(parents=True)
    Image.fromarray(np.zeros((20, 24), np.uint8)).save(mask)
    Image.fromarray(np.zeros((20, 24), np.uint8)).save(root / "masks" / "Apple_scab" / "zz.png")
    return root


def test_every_file_is_admitted_quarantined_or_left_out(orchard: Path) -> None:
    scan = cohort.scan_field(orchard, LAB)
    s = scan.summary
    assert s["files_seen"] == 12 and s["identity_holds"]
    assert (s["admitted"], s["quarantined"], s["left_out"]) == (4, 6, 2)
    assert set(scan.rows["rel_path"]) == {"Apple_scab/a1.jpg", "Apple_scab/a3.JPG", "Apple_Black_rot/f1.jpg",
                                          "Apple_Black_rot/f2.jpg"}
    reasons = dict(zip(scan.quarantine["rel_path"], scan.quarantine["reason"], strict=True))
    assert reasons == {"Apple_scab/empty.jpg": "zero_byte", "Apple_scab/note.jpg": "not_an_image",
                       "Apple_scab/.DS_Store": "os_junk", "stray.jpg": "outside_layout",
                       "Apple_scab/deeper/a4.jpg": "outside_layout",
                       "Apple_scab/a2.jpg": cohort.LABEL_CONFLICT}
    assert s["quarantine_reasons"] == {"os_junk": 1, "outside_layout": 2, "zero_byte": 1, "not_an_image": 1,
                                       cohort.LABEL_CONFLICT: 1}
    assert set(scan.left_out["rel_path"]) == {"Pear_blight/p1.jpg", "Pear_blight/broken.jpg"}


def test_classes_are_matched_by_folder_name(orchard: Path) -> None:
    scan = cohort.scan_field(orchard, LAB)
    assert scan.unmatched_classes == ["Pear_blight"]
    assert scan.untested_classes == ["Apple_healthy", "Apple_rust"]
    labels = dict(zip(scan.rows["rel_path"], scan.rows["label"], strict=True))
    assert labels["Apple_scab/a1.jpg"] == LAB.index("Apple_scab")
    assert labels["Apple_Black_rot/f2.jpg"] == LAB.index("Apple_Black_rot")
    assert scan.rows["row_id"].is_unique


def test_source_labels_and_masks(orchard: Path) -> None:
    scan = cohort.scan_field(orchard, LAB)
    rows = scan.rows.set_index("rel_path")
    assert rows.at["Apple_Black_rot/f1.jpg", "source_label"] == "frog_eye_leaf_spot"
    assert rows.at["Apple_Black_rot/f2.jpg", "source_label"] == "Apple_Black_rot"  # not listed: the folder
    assert rows.at["Apple_scab/a1.jpg", "mask_rel_path"] == "masks/Apple_scab/a1.png"
    assert rows.at["Apple_scab/a3.JPG", "mask_rel_path"] is None
    s = scan.summary
    assert s["per_source_label"]["Apple_Black_rot"] == {"Apple_Black_rot": 1, "frog_eye_leaf_spot": 1}
    assert s["labels_csv_without_file"] == ["Apple_scab/gone.jpg"]
    assert s["masks_without_image"] == ["masks/Apple_scab/zz.png"] and s["with_mask"] == 1


def test_bad_cohorts_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusLayoutError, match="does not exist"):
        cohort.scan_field(tmp_path / "missing", LAB)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "loose.jpg").write_bytes(b"x")
    with pytest.raises(CorpusLayoutError, match="no file sits where"):
        cohort.scan_field(tmp_path / "flat", LAB)
    _jpeg(tmp_path / "csv" / "Apple_scab" / "a.jpg")
    (tmp_path / "csv" / "labels.csv").write_text("file,label\na.jpg,scab\n")
    with pytest.raises(ValueError, match="'path' column"):
        cohort.scan_field(tmp_path / "csv", LAB)


def test_field_root_follows_the_run(tmp_path: Path) -> None:
    lab, orchard = tmp_path / "lab", tmp_path / "orchard"
    lab.mkdir()
    _jpeg(orchard / "Apple_scab" / "a.jpg")
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(lab), field=str(orchard))
    assert cohort.field_root(ctx) == orchard.resolve()
    assert cohort.field_root(config.open_run(tmp_path / "run2", profile="smoke", data=str(lab))) is None


def test_the_real_field_apple_cohort() -> None:
    if not FIELD_APPLE.is_dir():
        pytest.skip(f"real field data not present at {FIELD_APPLE}")
    scan = cohort.scan_field(FIELD_APPLE, LAB)
    s = scan.summary
    assert s["identity_holds"] and s["files_seen"] == 600
    assert s["admitted"] == 600 and not scan.unmatched_classes and not scan.untested_classes
    assert s["per_class"] == dict.fromkeys(sorted(LAB), 150)
    assert s["per_source_label"]["Apple_Black_rot"] == {"frog_eye_leaf_spot": 150}
    assert s["per_source_label"]["Apple_scab"] == {"scab": 150}
    assert s["labels_csv_entries"] == 600 and not s["labels_csv_without_file"] and s["with_mask"] == 0
