"""The synthetic field cohort and the true lab masks: determinism, layout, truth, and masks that fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cropcop_utils import synthetic
from cropcop_utils.core import imaging
from cropcop_utils.core.config import open_run
from cropcop_utils.core.evidence import sha256_file
from cropcop_utils.field import cohort
from cropcop_utils.synthetic import field as synthetic_field

PARAMS = {"seed": 5, "image_px": 48, "largest_class": 12, "field_per_class": 4}


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in folder.rglob("*") if p.is_file()}


def _mask(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("L")) >= 128


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("field")
    return out, synthetic.load_truth(synthetic.generate(out, PARAMS))


def test_field_and_masks_are_deterministic_and_leave_the_lab_corpus_alone(made, tmp_path: Path) -> None:
    out, truth = made
    synthetic.generate(tmp_path / "again", PARAMS)
    for name in synthetic.OUTPUT_DIRS:
        assert _hashes(tmp_path / "again" / name) == _hashes(out / name), name
    # Without a field cohort the lab corpus is byte-identical: the field has its own random stream.
    synthetic.generate(tmp_path / "nofield", {**PARAMS, "field_per_class": 0})
    assert _hashes(tmp_path / "nofield" / "corpus") == _hashes(out / "corpus")
    assert not list((tmp_path / "nofield" / "field").iterdir())
    assert json.loads((tmp_path / "nofield" / "planted.json").read_text())["field"]["files"] == []


def test_field_truth_lists_every_file_with_its_mask(made) -> None:
    out, truth = made
    field = truth["field"]
    drawn, untested, not_in_lab = synthetic_field.field_classes()
    assert field["classes"] == drawn and field["untested_lab_classes"] == untested
    assert set(field["not_in_lab_class_map"]) <= set(drawn)
    assert field["n_photos"] == PARAMS["field_per_class"] * len(drawn) and field["n_broken"] == 1
    assert set(synthetic.listed_files(truth, "field")) == set(_hashes(out / "field"))
    for f in field["files"]:
        assert sha256_file(out / "field" / f["rel_path"]) == f["sha256"]
        if f["broken_kind"]:
            with pytest.raises(imaging.ImageLoadError, match="truncated"):
                imaging.open_rgb(out / "field" / f["rel_path"])
            continue
        image = imaging.open_rgb(out / "field" / f["rel_path"])
        mask = _mask(out / "field" / f["mask_rel_path"])
        assert mask.shape == (image.height, image.width) == (PARAMS["image_px"],) * 2
        # Field leaves are small in the frame: a few percent to under half of it.
        assert mask.mean() == pytest.approx(f["leaf_fraction"], abs=1e-4)
        assert 0.01 < mask.mean() < 0.5


def test_every_loadable_lab_image_has_its_true_mask(made) -> None:
    out, truth = made
    lab = truth["lab_masks"]["files"]
    loadable = {f["rel_path"] for f in truth["files"] if not f["broken_kind"]}
    assert set(lab) == loadable
    assert set(lab.values()) == set(_hashes(out / "masks"))
    assert synthetic.lab_mask_paths(out) == {rel: out / "masks" / mask for rel, mask in lab.items()}
    fractions = []
    for f in truth["files"]:
        if f["broken_kind"]:
            continue
        image = np.asarray(imaging.open_rgb(out / "corpus" / f["rel_path"]), dtype=float)
        mask = _mask(out / "masks" / lab[f["rel_path"]])
        assert mask.shape == image.shape[:2], f["rel_path"]  # upright, and resized near duplicates too
        fractions.append(mask.mean())
        if f["source"] == "lab_bench" and f["transform"] is None:
            # The bench is light grey: the leaf (green, or a yellow banana) is far more saturated.
            saturation = image.max(axis=2) - image.min(axis=2)
            assert saturation[mask].mean() > saturation[~mask].mean() + 30, f["rel_path"]
    assert 0.05 < np.mean(fractions) < 0.6


def test_field_cohort_scans_with_the_planted_outcome(made) -> None:
    out, truth = made
    lab_classes = [c["name"] for c in truth["classes"] if not c["singleton"]]
    scan = cohort.scan_field(out / "field", lab_classes)
    field = truth["field"]
    assert scan.summary["identity_holds"]
    assert scan.untested_classes == field["untested_lab_classes"]
    assert scan.unmatched_classes == sorted(field["not_in_lab_class_map"])
    assert scan.summary["quarantine_reasons"] == {"truncated": 1}
    assert len(scan.rows) == PARAMS["field_per_class"] * (len(lab_classes) - 1)
    assert scan.rows["mask_rel_path"].notna().all() and not scan.summary["masks_without_image"]


def test_ensure_corpus_regenerates_a_missing_field_and_refuses_foreign_files(tmp_path: Path) -> None:
    ctx = open_run(tmp_path / "run", profile="smoke", overrides={"synthetic": PARAMS})
    synthetic.ensure_corpus(ctx)
    assert cohort.field_root(ctx) == ctx.field_root and ctx.field_root.is_dir()
    shutil.rmtree(ctx.field_root)
    assert not synthetic.corpus_matches(ctx.planted_truth_path.parent, PARAMS)
    synthetic.ensure_corpus(ctx)
    assert synthetic.corpus_matches(ctx.planted_truth_path.parent, PARAMS)
    (ctx.field_root / "mine.jpg").write_bytes(b"not the generator's")
    with pytest.raises(synthetic.SyntheticCorpusConflict, match="mine.jpg"):
        synthetic.generate(ctx.planted_truth_path.parent, {**PARAMS, "seed": 6})
