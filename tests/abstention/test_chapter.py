"""Chapter 11 as a whole: the deployment recipe, null statistics, the chapter on the smoke book."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from abstention.abstention_fixtures import PARAMS, pte_result

from cropcop_utils.abstention.chapter import deployment
from cropcop_utils.abstention.conformal import set_summary
from cropcop_utils.abstention.records import PTE_VAL
from cropcop_utils.abstention.selective import proportion


# --------------------------------------------------------------------------- undefined statistics
def test_undefined_statistics_are_null_with_a_reason():
    share = proportion(0, 0, what="field images")
    assert share["value"] is None and share["ci"] is None and "field images" in share["reason"]
    summary = set_summary(np.zeros((0, 3), dtype=bool), np.zeros(0, dtype=int))
    assert summary["mean_set_size"] is None and summary["reason"]
    recipe = deployment(pte_result(accepted_none=True), {**PARAMS, "score": "msp"})
    json.dumps(recipe, allow_nan=False)
    assert recipe["lab_test"]["selective_risk"] is None and recipe["lab_test"]["selective_risk_ci"] is None
    assert "selective_risk" in recipe["lab_test"]["reasons"]


def test_deployment_recipe_has_exactly_the_agreed_keys():
    recipe = deployment(pte_result(), {**PARAMS, "score": "msp"})
    assert set(recipe) == {"state", "model_state", "temperature", "score", "threshold", "target_risk",
                           "lab_test", "field", "out_of_scope"}
    assert recipe["state"] == "pte" and recipe["field"] is None
    assert set(recipe["lab_test"]) == {"n", "coverage", "coverage_ci", "selective_risk", "selective_risk_ci"}
    assert recipe["lab_test"]["coverage"] == pytest.approx(2 / 3)
    assert recipe["lab_test"]["selective_risk"] == 0
    assert recipe["out_of_scope"]["n"] == 0 and recipe["out_of_scope"]["rejection_rate"] is None


# --------------------------------------------------------------------------- whole chapter (smoke book)
@pytest.fixture(scope="module")
def smoke_chapter(smoke_book):
    from cropcop_utils.core import config

    ctx = config.reopen_run(smoke_book["run_dir"])
    notebook = smoke_book["book_dir"] / "11_abstention.ipynb"
    return ctx, notebook, json.loads((ctx.run_dir / "abstention" / "abstention.json").read_text())


@pytest.mark.slow
def test_chapter_runs_headless_and_writes_the_recipe(smoke_chapter):
    from cropcop_utils.core.evidence import verify_registry

    ctx, notebook, record = smoke_chapter
    assert verify_registry(ctx.run_dir)["matches"].all()
    assert PTE_VAL in record["outputs"] and "runtime/model.pte" in record["inputs"]
    pte_val = pd.read_parquet(ctx.run_dir / PTE_VAL)
    recipe = record["deployment"]
    assert recipe["state"] == "pte" and set(pte_val["model_state"]) == {recipe["model_state"]}
    assert recipe["model_state"] == record["figures"]["states"]["pte"]["model_state"]
    # the synthetic corpus brings its field cohort: chapter 10 scored it, and the recipe reports it
    cohort = pd.read_parquet(ctx.run_dir / "field/cohort.parquet")
    assert recipe["field"]["n"] == len(cohort) > 0 and record["figures"]["field_given"]
    assert recipe["out_of_scope"]["n"] == sum(record["figures"]["out_of_scope_sources"].values())
    assert all(s["temperature"] > 0 for s in record["figures"]["states"].values())
    cells = json.loads(notebook.read_text())["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert outputs and not [o for o in outputs if o["output_type"] == "error"]
    assert any("ECE" in "".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    # the protection section: scores from the .pte's two outputs, a verdict against the targets
    protection = record["figures"]["protection"]
    assert protection["program"] == {"method": "forward", "outputs": ["logits", "features"],
                                     "sha256": recipe["model_state"]}
    assert recipe["protection"]["verdict"] == protection["verdict"]
    table = pd.read_parquet(ctx.run_dir / protection["table"])
    assert set(table["set"]) == set(protection["held_back"]) and "field" not in protection["fitted_on"]
    # what validation already said: the shipped regime here selects on lab val alone
    assert list(protection["validation"]) == ["lab val"]
    assert protection["validation"]["lab val"]["n"] == protection["fitted_on"]["val_rows"]
    lab_val = protection["validation"]["lab val"]
    assert recipe["protection"]["validation"]["lab val"]["reach"] == lab_val["reach"]
    assert any("What validation already said" in "".join(o.get("data", {}).get("text/markdown", ""))
               for o in outputs)
    # in hindsight, for every candidate: could thresholds read off the evaluated sets meet every target?
    hindsight = protection["hindsight"]
    assert set(hindsight) == set(protection["candidates"])
    assert set(hindsight[protection["chosen"]]["figures"]) == set(protection["held_back"])
    assert recipe["protection"]["hindsight"] == {k: v for k, v in hindsight[protection["chosen"]].items()
                                                 if k != "figures"}
    assert any("In hindsight" in "".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert any("does not protect" in "".join(o.get("data", {}).get("text/markdown", ""))
               or "The abstention protects" in "".join(o.get("data", {}).get("text/markdown", ""))
               for o in outputs)


@pytest.mark.slow
def test_temperature_and_thresholds_come_from_validation_alone(smoke_chapter, tmp_path):
    """Rewrite every state's test logits (reversed class order, sharpened) and rerun the chapter: what
    is fitted (temperature, each score's threshold, the validation figures) must not move, while every
    figure measured on the test rows does."""
    import shutil

    from cropcop_utils.abstention import run_chapter
    from cropcop_utils.abstention.records import TEST_RECORDS
    from cropcop_utils.core import config
    from cropcop_utils.core.evidence import atomic_write_parquet, read_registry, register
    from cropcop_utils.nets.predict import logits_matrix, records_from_logits

    ctx, _, before = smoke_chapter
    copy = tmp_path / "run"
    shutil.copytree(ctx.run_dir, copy, ignore=shutil.ignore_patterns("book", "html"))
    registry = read_registry(copy)
    for rel in TEST_RECORDS.values():
        record = pd.read_parquet(copy / rel)
        logits = 3.0 * logits_matrix(record)[:, ::-1]
        atomic_write_parquet(copy / rel, records_from_logits(record["row_id"], record["label"], logits,
                                                             record["model_state"].iloc[0]))
        register(copy, rel, registry[rel]["chapter"])
    after = run_chapter(config.reopen_run(copy))
    moved = []
    for state, old in before["figures"]["states"].items():
        new = after["figures"]["states"][state]
        assert new["temperature"] == old["temperature"] and new["val_nll"] == old["val_nll"], state
        for score, block in old["selective"].items():
            assert new["selective"][score]["choice"] == block["choice"], (state, score)
        moved.append(new["calibration"]["after"]["nll"] != old["calibration"]["after"]["nll"])
        moved.append(new["selective"]["msp"]["aurc"] != old["selective"]["msp"]["aurc"])
    assert all(moved)  # the rewrite reached every test figure: the check above is not vacuous
    # the protection recipe (scores, thresholds, chosen candidate) is fitted on validation and the fitting
    # outliers alone: the rewritten test moves its lab figures, not the recipe ...
    old_p, new_p = before["figures"]["protection"], after["figures"]["protection"]
    assert new_p["recipe"] == old_p["recipe"] and new_p["candidates"] == old_p["candidates"]
    assert new_p["validation"] == old_p["validation"]  # what validation said is validation's alone
    # the hindsight diagnosis reads the evaluated sets, so it moves with them (and never reaches the recipe)
    assert (new_p["hindsight"][new_p["chosen"]]["figures"]["lab_test"]
            != old_p["hindsight"][old_p["chosen"]]["figures"]["lab_test"])
    assert new_p["chosen_figures"]["lab_test"] != old_p["chosen_figures"]["lab_test"]
    assert "lab_test" in old_p["held_back"] and old_p["fitted_on"]["fitting_kinds"] == ["jigsaw"]
    # ... and neither do other evaluated out-of-scope inputs (more noise, crops of every sample photo)
    more = run_chapter(config.reopen_run(copy), noise_images=5, photo_crops=2)["figures"]["protection"]
    assert more["recipe"] == old_p["recipe"] and more["candidates"] == old_p["candidates"]
    assert more["chosen_figures"]["noise"]["n"] == 5 != old_p["chosen_figures"]["noise"]["n"]


@pytest.mark.slow
def test_the_recipe_on_the_program_read_from_disk_gives_the_recorded_decisions(smoke_chapter):
    """A user's deployment: load the .pte from disk (digest checked), refit the detectors on the reference
    features the recipe names (digest checked), apply the recipe to the program's outputs on the written
    out-of-scope images — the decisions are chapter 11's."""
    import numpy as np

    from cropcop_utils.abstention import program_outputs
    from cropcop_utils.abstention.protection import apply_recipe, fit_detectors
    from cropcop_utils.core.evidence import sha256_bytes
    from cropcop_utils.nets.features import features_matrix
    from cropcop_utils.nets.pte import load_verified_pte

    ctx, _, record = smoke_chapter
    recipe = record["deployment"]["protection"]["recipe"]
    reference = pd.read_parquet(ctx.run_dir / recipe["reference_features"]["path"])
    z = features_matrix(reference)
    assert sha256_bytes(np.ascontiguousarray(z).tobytes()) == recipe["reference_features"]["sha256"]
    detectors = fit_detectors(z, reference["label"].to_numpy(), recipe["knn_k"])
    forward = load_verified_pte(ctx.run_dir)
    assert forward.sha256 == record["deployment"]["protection"]["program"]["sha256"]
    oos = pd.read_parquet(ctx.run_dir / "abstention/predictions_out_of_scope.parquet")
    rows = oos[(oos["state"] == "pte") & oos["rel_path"].str.startswith("abstention/out_of_scope/")]
    rows = rows[["row_id", "rel_path"]].assign(label=-1).reset_index(drop=True)
    out, _ = program_outputs.score(forward, rows, ctx.run_dir, ctx.section("image"), 8, "oos")
    decisions = pd.read_parquet(ctx.run_dir / "abstention/decisions.parquet").set_index("row_id")
    np.testing.assert_array_equal(apply_recipe(recipe, detectors, out),
                                  decisions.loc[rows["row_id"], "answered"].to_numpy())
