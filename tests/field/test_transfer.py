"""Chapter 10 (field transfer): the cell statistics, the field results, composites on disk, the chapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cropcop_utils.core.evidence import Chapter, read_registry, sha256_file
from cropcop_utils.core.masks import load_mask
from cropcop_utils.field import bench, scores

PARAMS = {"bootstrap": 200, "seed": 0, "ci_level": 0.95, "min_gap": 0.01}


def _cell(ids, labels, preds):
    return pd.DataFrame({"source_row_id": ids, "label": labels, "pred": preds})


def test_cells_changed_predictions_and_background_share_have_known_answers():
    ids = [f"r{i}" for i in range(10)]
    cells = {
        "lab_plain": _cell(ids, [1] * 10, [1] * 10),  # all right
        "lab_field": _cell(ids, [1] * 10, [1] * 5 + [0] * 5),  # half right on field backgrounds
        "paste_control": _cell(ids, [1] * 10, [1] * 10),
        "field_field": _cell([f"f{i}" for i in range(8)], [1] * 8, [0] * 8),
    }  # none right
    out = scores.cell_results(cells, PARAMS)
    assert out["cells"]["lab_field"]["accuracy"]["value"] == pytest.approx(0.5)
    assert out["cells"]["field_plain"] is None and out["changed"]["field_plain"] is None
    assert out["changed"]["lab_field"]["rate"]["value"] == pytest.approx(0.5)
    assert out["changed"]["paste_control"]["rate"]["value"] == 0.0
    share = out["background_share"]
    assert share["value"] == pytest.approx(0.5) and share["reason"] is None  # (1 - .5) / (1 - 0)
    assert share["lo"] <= 0.5 <= share["hi"] and share["n_lab"] == 10 and share["n_field"] == 8

    cells["field_field"] = _cell(["f0", "f1"], [1, 1], [1, 1])  # field as good as lab: no gap
    share = scores.cell_results(cells, PARAMS)["background_share"]
    assert share["value"] is None and "gap" in share["reason"]
    json.dumps(share, allow_nan=False)  # null, never NaN


def test_field_results_report_symptom_mapped_sources_apart():
    cohort = pd.DataFrame(
        {
            "row_id": ["a", "b", "c", "d"],
            "rel_path": list("abcd"),
            "class_name": ["rot", "rot", "rot", "scab"],
            "label": [0, 0, 0, 1],
            "source_label": ["rot", "frog_eye", "frog_eye", "scab"],
        }
    )
    record = pd.DataFrame({"row_id": ["a", "b", "c", "d"], "label": [0, 0, 0, 1], "pred": [0, 1, 1, 1]})
    out = scores.field_results(record, cohort, ["rot", "scab"], PARAMS)
    assert out["n"] == 4 and out["accuracy"]["value"] == pytest.approx(0.5)
    assert out["per_class_recall"]["rot"]["value"] == pytest.approx(1 / 3)
    assert out["direct_labels"]["n"] == 2 and out["direct_labels"]["accuracy"]["value"] == 1.0
    frog = out["by_source_label"]["frog_eye"]
    assert frog["class_name"] == "rot" and frog["accuracy"]["value"] == 0.0 and frog["accuracy"]["n"] == 2
    assert set(out["by_source_label"]) == {"frog_eye"}


def _leaf_png(path: Path, rng: np.random.Generator, backdrop, size=(40, 48)) -> np.ndarray:
    rgb = np.empty((*size, 3), dtype=np.uint8)
    rgb[:] = backdrop
    yy, xx = np.mgrid[: size[0], : size[1]]
    leaf = ((yy - size[0] / 2) / 14) ** 2 + ((xx - size[1] / 2) / 10) ** 2 < 1
    rgb[leaf] = np.stack(
        [
            rng.integers(40, 90, leaf.sum()),
            rng.integers(120, 200, leaf.sum()),
            rng.integers(20, 60, leaf.sum()),
        ],
        1,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)
    return leaf


def test_composites_on_disk_keep_the_leaf_pixels_and_are_registered(tmp_path):
    rng = np.random.default_rng(0)
    lab_root, field_root = tmp_path / "lab", tmp_path / "field"
    lab_rows, field_rows = [], []
    for k, cls in enumerate(["rot", "scab"]):
        for i in range(3):
            _leaf_png(lab_root / cls / f"l{i}.png", rng, (190, 185, 200))
            lab_rows.append(
                {"row_id": f"{cls}{i}", "rel_path": f"{cls}/l{i}.png", "label": k, "class_name": cls}
            )
            leaf = _leaf_png(field_root / cls / f"f{i}.png", rng, (60, 40, 30), size=(50, 60))
            mask_rel = f"masks/{cls}/f{i}.png"
            (field_root / mask_rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(leaf.astype(np.uint8) * 255).save(field_root / mask_rel)
            field_rows.append(
                {
                    "row_id": f"F{cls}{i}",
                    "rel_path": f"{cls}/f{i}.png",
                    "label": k,
                    "class_name": cls,
                    "mask_rel_path": mask_rel,
                }
            )
    lab = bench.estimate_masks(bench.LeafSet(pd.DataFrame(lab_rows), lab_root))
    donors = bench.LeafSet(pd.DataFrame(lab_rows), lab_root)
    ch = Chapter(tmp_path / "run", "field")
    manifest = bench.build(ch, lab, pd.DataFrame(field_rows), field_root, donors, seed=0)
    assert manifest.groupby("cell").size().to_dict() == {"lab_field": 6, "paste_control": 6, "field_plain": 6}
    assert manifest["backdrop_same_class"].all()
    registry = read_registry(tmp_path / "run")
    for r in manifest.itertuples():
        path = tmp_path / "run" / bench.COMPOSITES / r.rel_path
        assert registry[f"{bench.COMPOSITES}/{r.rel_path}"]["sha256"] == sha256_file(path)
        made = np.asarray(Image.open(path).convert("RGB"))
        if r.cell == "field_plain":
            source = np.asarray(Image.open(field_root / r.source_rel_path).convert("RGB"))
            mask = load_mask(field_root / f"masks/{r.class_name}/{Path(r.source_rel_path).stem}.png")
        else:
            source = np.asarray(Image.open(lab_root / r.source_rel_path).convert("RGB"))
            mask = lab.masks[r.source_row_id]
        assert np.array_equal(made[mask], source[mask]), r.rel_path
        assert r.source_rel_path != r.backdrop_rel_path


@pytest.mark.slow
def test_chapter_in_the_smoke_book(smoke_book):
    from cropcop_utils.core.config import reopen_run
    from cropcop_utils.training import regimes

    run = Path(smoke_book["run_dir"])
    facts = json.loads((run / "field/field.json").read_text())
    assert facts["status"] == "measured" and facts["cohort"]["identity_holds"]
    cohort = pd.read_parquet(run / "field/cohort.parquet")
    assert list(cohort.columns) == ["row_id", "rel_path", "class_name", "label", "source_label"]
    for state in ("reference", "compact", "int8", "pte"):
        record = pd.read_parquet(run / f"field/predictions_{state}.parquet")
        assert list(record["row_id"]) == list(cohort["row_id"]) and "logits" in record
        assert record["model_state"].iloc[0] == facts["states"][state]["model_state"]
        assert facts["states"][state]["field"]["n"] == len(cohort)
        assert facts["swap"]["states"][state]["cells"]["lab_plain"]["n"] > 0
    assert facts["masks"]["iou"]["value"] is not None
    reads = [json.loads(line) for line in (run / "test_access.jsonl").read_text().splitlines()]
    field_reads = [r for r in reads if r["reader"] == "field"]
    # each regime's four states read their recorded test predictions once (the lab_plain cell)
    n_regimes = len(regimes.of_run(reopen_run(run)))
    assert len(field_reads) == 4 * n_regimes and all(r["override"] and r["reason"] for r in field_reads)
    assert len({r["model_state"] for r in field_reads}) == 4 * n_regimes
    assert (run / "field/card.md").exists() and "field/card.md" in read_registry(run)


def test_a_second_cohort_is_scored_and_shown_on_its_own(smoke_book):
    """``--field synthetic --field generator-b=PATH``: the second cohort is audited with the lab (chapter 2),
    scored by every state from the same files, reported apart in chapter 10, its figure, page and card, and
    put under the deployment recipe in chapter 11."""
    from cropcop_utils.core.cohorts import NOT_ADAPTED

    run = Path(smoke_book["run_dir"])
    facts = json.loads((run / "field/field.json").read_text())
    primary, second = facts["cohorts"]
    assert (primary["name"], primary["primary"], second["name"], second["primary"]) == (
        "synthetic", True, "field-b", False)
    assert second["source"] == "generator-b" and second["relation"] == NOT_ADAPTED
    assert second["folder"] == str(Path(smoke_book["second_cohort"]).resolve())
    rows = pd.read_parquet(run / "field/cohorts/field-b/cohort.parquet")
    assert second["n"] == len(rows) == second["scan"]["admitted"] > 0 and second["scan"]["quarantined"] == 1
    # row ids apart from the primary cohort's, though the generator names the files alike
    first_rows = pd.read_parquet(run / "field/cohort.parquet")
    assert set(rows["rel_path"]) & set(first_rows["rel_path"])
    assert not set(rows["row_id"]) & set(first_rows["row_id"])
    registry = read_registry(run)
    for state in ("reference", "compact", "int8", "pte"):
        path = f"field/cohorts/field-b/predictions_{state}.parquet"
        record = pd.read_parquet(run / path)
        assert path in registry and record["model_state"].iloc[0] == facts["states"][state]["model_state"]
        result = second["regimes"][facts["regime"]][state]
        assert result["accuracy"]["value"] == pytest.approx((record["pred"] == record["label"]).mean())
        assert primary["regimes"][facts["regime"]][state] == facts["states"][state]["field"]
    assert facts["plots"]["cohorts"] == "field/cohorts.png" and (run / "field/cohorts.png").exists()
    audit = json.loads((run / "audit/audit.json").read_text())
    assert "cohort:field-b" in json.dumps(audit["figures"]["cross_sets"])
    page = (Path(smoke_book["book_dir"]) / "10_field.ipynb").read_text()
    assert "scored 2 field cohorts" in page and "**`field-b`**" in page
    card_text = (run / "field/card.md").read_text()
    assert "### Every field cohort" in card_text and "| `field-b` |" in card_text
    abstention = json.loads((run / "abstention/abstention.json").read_text())
    pte = abstention["figures"]["states"]["pte"]
    assert list(pte["cohorts"]) == ["field-b"]
    assert pte["cohorts"]["field-b"]["abstained_share"]["n"] == len(rows)


@pytest.mark.slow
def test_chapter_without_a_field_cohort_says_so(smoke_book, tmp_path, monkeypatch):
    from cropcop_utils.core.config import reopen_run
    from cropcop_utils.field import cohort, transfer

    run = tmp_path / "run"
    shutil.copytree(smoke_book["run_dir"], run)
    monkeypatch.setattr(cohort, "field_root", lambda ctx: None)
    record = transfer.run_chapter(reopen_run(run))
    assert record["status"] == "no_field_cohort" and "no field cohort" in record["reason"]
    assert all(s["field"] is None for s in record["states"].values())
    assert record["swap"]["states"]["pte"]["background_share"]["value"] is None
    assert record["swap"]["states"]["pte"]["cells"]["paste_control"]["n"] > 0
    assert "not tested outside the lab" in (run / "field/card.md").read_text()


def test_field_params_refuse_a_batch_the_int8_graph_cannot_take(tmp_path):
    from cropcop_utils.core import config
    from cropcop_utils.field import transfer

    ctx = config.open_run(tmp_path / "run", profile="smoke")
    assert transfer.field_params(ctx)["swap_n"] == ctx.section("field_transfer")["swap_n"]
    with pytest.raises(transfer.FieldConfigError, match="ptq.max_batch"):
        transfer.field_params(ctx, batch_size=ctx.section("ptq")["max_batch"] + 1)
    with pytest.raises(transfer.FieldConfigError, match="occlusion_cells"):
        transfer.field_params(ctx, occlusion_cells=["lab_plain", "moon"])


def test_source_labels_that_name_the_lab_class_are_direct_and_the_rest_by_symptom():
    from cropcop_utils.field.scores import labels_directly

    assert labels_directly("scab", "Apple_scab") and labels_directly("healthy", "Tomato___healthy")
    assert labels_directly("Apple_rust", "Apple_rust")
    assert not labels_directly("frog_eye_leaf_spot", "Apple_Black_rot")


def test_a_donor_whose_leaf_fills_the_photo_is_recorded_and_another_is_drawn(tmp_path):
    rng = np.random.default_rng(1)
    lab_root = tmp_path / "lab"
    rows = []
    for k, cls in enumerate(["rot", "scab"]):
        for i in range(2):
            _leaf_png(lab_root / cls / f"l{i}.png", rng, (190, 185, 200))
            rows.append({"row_id": f"{cls}{i}", "rel_path": f"{cls}/l{i}.png", "label": k, "class_name": cls})
    _leaf_png(lab_root / "rot" / "full.png", rng, (190, 185, 200))
    full = {"row_id": "full", "rel_path": "rot/full.png", "label": 0, "class_name": "rot"}
    lab = bench.estimate_masks(bench.LeafSet(pd.DataFrame(rows), lab_root))
    donors = bench.LeafSet(pd.DataFrame([full] + [r for r in rows if r["class_name"] == "scab"]), lab_root)
    donors.masks["full"] = np.ones((40, 48), dtype=bool)  # the leaf fills the photo: nothing to inpaint
    ch = Chapter(tmp_path / "run", "field")
    manifest = bench.build(ch, lab, None, None, donors, seed=0)
    unusable = pd.read_parquet(tmp_path / "run" / bench.UNUSABLE_DONORS)
    assert unusable["row_id"].tolist() == ["full"] and "covers the whole photo" in unusable["reason"][0]
    assert len(manifest) == 4 and "rot/full.png" not in set(manifest["backdrop_rel_path"])
    rot = manifest[manifest["class_name"] == "rot"]
    assert not rot["backdrop_same_class"].any()
