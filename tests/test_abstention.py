"""Chapter 11: temperature fit, ECE, threshold choice, conformal coverage, the field path, null statistics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import special

from cropcop_utils import abstention as ab
from cropcop_utils.evidence import Chapter
from cropcop_utils.model_states import STATE_NAMES
from cropcop_utils.predict import records_from_logits

PARAMS = {**ab.DEFAULTS, "bootstrap": 50, "conformal_levels": [0.90, 0.95]}


def sampled(n: int, k: int, temperature: float, seed: int,
            spread: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels drawn from softmax(logits / temperature) (Gumbel-max): T is the true temperature."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, spread, size=(n, k))
    labels = np.argmax(logits / temperature + rng.gumbel(size=(n, k)), axis=1)
    return logits, labels


# --------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_temperature_fit_recovers_a_known_temperature(true_t):
    logits, y = sampled(20000, 6, true_t, seed=1)
    assert ab.fit_temperature(logits, y) == pytest.approx(true_t, rel=0.05)


def test_temperature_scaling_lowers_nll_of_overconfident_logits():
    logits, y = sampled(4000, 5, 3.0, seed=2)
    t = ab.fit_temperature(logits, y)
    assert ab.nll(logits, y, t) < ab.nll(logits, y)
    assert ab.brier(ab.probabilities(logits, t), y) < ab.brier(ab.probabilities(logits), y)


def test_ece_matches_a_hand_computed_case():
    # sorted by confidence: bin 1 = {0.4 right, 0.6 wrong}: accuracy 0.5, confidence 0.5 -> gap 0;
    # bin 2 = {0.8 right, 0.9 right}: accuracy 1, confidence 0.85 -> gap 0.15; ECE = 2/4 * 0.15
    confidence = np.array([0.9, 0.8, 0.6, 0.4])
    correct = np.array([True, True, False, True])
    assert ab.expected_calibration_error(confidence, correct, n_bins=2) == pytest.approx(0.075)
    # one bin: |3/4 - 0.675|
    assert ab.expected_calibration_error(confidence, correct, n_bins=1) == pytest.approx(0.075)
    # as many bins as rows: mean |correct - confidence| = (0.1 + 0.2 + 0.6 + 0.6) / 4
    assert ab.expected_calibration_error(confidence, correct, n_bins=15) == pytest.approx(0.375)


def test_ece_bins_have_equal_mass():
    rng = np.random.default_rng(0)
    bins = ab.reliability_bins(rng.random(47), rng.random(47) < 0.5, n_bins=15)
    assert len(bins) == 15 and bins["rows"].sum() == 47 and bins["rows"].max() - bins["rows"].min() <= 1
    assert bins["confidence"].is_monotonic_increasing


def test_brier_is_the_mean_squared_distance_to_the_one_hot_label():
    prob = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    assert ab.brier(prob, np.array([0, 2])) == pytest.approx((0.09 + 0.04 + 0.01 + 0.01 + 0.64 + 0.81) / 2)


# --------------------------------------------------------------------------- selective prediction
def test_threshold_is_the_lowest_that_meets_the_target_on_validation():
    score = np.array([0.9, 0.8, 0.7, 0.6])
    correct = np.array([True, True, False, True])
    assert ab.choose_threshold(score, correct, 0.0)["threshold"] == 0.8
    wide = ab.choose_threshold(score, correct, 0.3)
    assert wide["threshold"] == 0.6 and wide["val_coverage"] == 1.0 and wide["val_selective_risk"] == 0.25


def test_threshold_accepts_or_rejects_a_tie_as_a_whole():
    choice = ab.choose_threshold(np.array([0.9, 0.8, 0.8]), np.array([True, True, False]), 0.0)
    assert choice["threshold"] == 0.9 and choice["val_coverage"] == pytest.approx(1 / 3)


def test_unreachable_target_abstains_on_everything_and_says_so():
    choice = ab.choose_threshold(np.array([0.9, 0.5]), np.array([False, True]), 0.01)
    assert not choice["target_met_on_val"] and choice["threshold"] > 0.9 and choice["reason"]
    applied = ab.apply_threshold(np.array([0.9, 0.5]), np.array([False, True]), choice["threshold"])
    assert applied["coverage"]["value"] == 0.0
    risk = applied["selective_risk"]
    assert risk["value"] is None and "no accepted rows" in risk["reason"]


def test_threshold_choice_uses_validation_only():
    val = sampled(600, 4, 1.0, seed=3)
    test_a, test_b = sampled(500, 4, 1.0, seed=4), sampled(300, 4, 2.0, seed=5)
    first, _ = ab.selective_block(val, test_a, 1.3, PARAMS)
    second, _ = ab.selective_block(val, test_b, 1.3, PARAMS)
    for name in ab.SCORES:
        assert first[name]["choice"] == second[name]["choice"]
        assert first[name]["test"]["n"] == 500 and second[name]["test"]["n"] == 300
    changed_val, _ = ab.selective_block(sampled(600, 4, 1.0, seed=6), test_a, 1.3, PARAMS)
    assert any(changed_val[n]["choice"] != first[n]["choice"] for n in ab.SCORES)


def test_risk_coverage_and_aurc_of_a_perfect_ranking():
    score = np.array([0.9, 0.8, 0.3, 0.2])
    correct = np.array([True, True, False, False])
    coverage, risk = ab.risk_coverage(score, correct)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 0, 1 / 3, 0.5])
    assert ab.aurc(score, correct) == pytest.approx((1 / 3 + 0.5) / 4)


def test_confidence_scores_rank_a_confident_row_first():
    logits = np.array([[5.0, 0.0, 0.0], [1.0, 0.9, 0.0]])
    for name, values in ab.confidence_scores(logits, 1.5).items():
        assert values[0] > values[1], name


# --------------------------------------------------------------------------- conformal prediction
@pytest.mark.parametrize("conditional", [False, True])
def test_conformal_coverage_on_exchangeable_data_is_near_nominal(conditional):
    logits, y = sampled(6000, 5, 1.0, seed=7, spread=1.5)
    prob = special.softmax(logits, axis=1)
    cal, test = slice(0, 2000), slice(2000, None)
    for level in (0.90, 0.95):
        sets = ab.conformal_sets(prob[cal], y[cal], prob[test], level, seed=0, class_conditional=conditional)
        summary = ab.set_summary(sets, y[test])
        assert abs(summary["coverage"]["value"] - level) <= 0.02, (level, summary)
        assert 1.0 <= summary["mean_set_size"] <= 5.0
        if conditional:
            per_class = ab.per_class_coverage(sets, y[test], 5)
            assert (per_class["coverage"] - level).abs().max() <= 0.05


# --------------------------------------------------------------------------- undefined statistics
def test_undefined_statistics_are_null_with_a_reason():
    share = ab.proportion(0, 0, what="field images")
    assert share["value"] is None and share["ci"] is None and "field images" in share["reason"]
    summary = ab.set_summary(np.zeros((0, 3), dtype=bool), np.zeros(0, dtype=int))
    assert summary["mean_set_size"] is None and summary["reason"]
    recipe = ab.deployment(pte_result(accepted_none=True), {**PARAMS, "score": "msp"})
    json.dumps(recipe, allow_nan=False)
    assert recipe["lab_test"]["selective_risk"] is None and recipe["lab_test"]["selective_risk_ci"] is None
    assert "selective_risk" in recipe["lab_test"]["reasons"]


def pte_result(accepted_none: bool = False, field: dict | None = None) -> dict:
    score, correct = np.array([0.9, 0.6, 0.2]), np.array([True, True, False])
    threshold = 0.95 if accepted_none else 0.5
    rejection = ab.rejection_block(pd.DataFrame({"source": [], "logits": []}), 1.0, threshold, "msp", 0.95)
    rejection.pop("scores")
    return {"model_state": "a" * 64, "temperature": 1.2,
            "selective": {"msp": {"choice": {"threshold": threshold},
                                  "test": ab.apply_threshold(score, correct, threshold)}},
            "field": field, "out_of_scope": rejection}


def test_deployment_recipe_has_exactly_the_agreed_keys():
    recipe = ab.deployment(pte_result(), {**PARAMS, "score": "msp"})
    assert set(recipe) == {"state", "model_state", "temperature", "score", "threshold", "target_risk",
                           "lab_test", "field", "out_of_scope"}
    assert recipe["state"] == "pte" and recipe["field"] is None
    assert set(recipe["lab_test"]) == {"n", "coverage", "coverage_ci", "selective_risk", "selective_risk_ci"}
    assert recipe["lab_test"]["coverage"] == pytest.approx(2 / 3)
    assert recipe["lab_test"]["selective_risk"] == 0
    assert recipe["out_of_scope"]["n"] == 0 and recipe["out_of_scope"]["rejection_rate"] is None


# --------------------------------------------------------------------------- the field path
def write_field_fixture(run_dir, n_classes: int = 3) -> pd.DataFrame:
    """A run folder holding only what chapter 10 hands over: field.json, the cohort, per-state records."""
    ch = Chapter(run_dir, "field")
    cohort = pd.DataFrame({"row_id": [f"r{i}" for i in range(6)],
                           "rel_path": [f"c/{i}.jpg" for i in range(6)],
                           "class_name": ["a", "a", "b", "b", "c", "c"], "label": [0, 0, 1, 1, 2, 2],
                           "source_label": ["a", "a", "b", "b", "c2", "c2"]})
    # rows 0, 2, 4 confident and right; row 1 confident and wrong; row 3 unsure and wrong; row 5 unsure, right
    logits = np.array([[6, 0, 0], [0, 6, 0], [0, 6, 0], [0.2, 0.1, 0], [0, 0, 6], [0.1, 0, 0.2]],
                      dtype=np.float32)
    ch.write_parquet("field/cohort.parquet", cohort)
    for state in STATE_NAMES:
        ch.write_parquet(f"field/predictions_{state}.parquet",
                         records_from_logits(cohort["row_id"], cohort["label"], logits, "b" * 64))
    ch.finish(figures={}, status="measured")
    return cohort


def test_field_inputs_are_absent_without_a_field_chapter(tmp_path):
    assert ab.field_inputs(Chapter(tmp_path, "abstention"), 3) is None


def test_field_inputs_are_absent_when_chapter_10_had_no_cohort(tmp_path):
    # a real corpus without --field: chapter 10 runs its lab-side parts and records why nothing else
    Chapter(tmp_path, "field").finish(figures={}, status="no_field_cohort", reason="no --field given")
    ch = Chapter(tmp_path, "abstention")
    assert ab.field_inputs(ch, 3) is None and "field/field.json" in ch.inputs


def test_field_path_on_a_fixture(tmp_path):
    write_field_fixture(tmp_path)
    ch = Chapter(tmp_path, "abstention")
    field = ab.field_inputs(ch, 3)
    assert set(field["logits"]) == set(STATE_NAMES) and "field/cohort.parquet" in ch.inputs
    val_logits, val_y = sampled(400, 3, 1.0, seed=8)
    val_prob = ab.probabilities(val_logits)
    result = ab.field_block(field["logits"]["pte"], field["cohort"], 1.0, 0.9, val_prob, val_y,
                            {**PARAMS, "score": "msp"})
    # accepted (msp >= 0.9): rows 0, 1, 2, 4, of which row 1 is wrong; right overall: rows 0, 2, 4, 5
    assert result["n"] == 6 and result["abstained_share"]["value"] == pytest.approx(2 / 6)
    assert result["accuracy_accepted"]["value"] == pytest.approx(3 / 4)
    assert result["accuracy_all"]["value"] == pytest.approx(4 / 6)
    assert set(result["conformal"]) == {"90", "95"}
    by_source = result["by_source_label"]
    assert set(by_source) == {"a", "b", "c2"} and by_source["c2"]["n"] == 2
    assert by_source["a"]["accuracy_all"]["value"] == 0.5
    assert by_source["c2"]["abstained_share"]["value"] == 0.5
    recipe = ab.deployment(pte_result(field=result), {**PARAMS, "score": "msp"})
    assert set(recipe["field"]) == {"n", "abstained_share", "abstained_share_ci", "accuracy_accepted",
                                    "accuracy_accepted_ci", "accuracy_all", "accuracy_all_ci"}


def test_field_predictions_must_cover_the_cohort(tmp_path):
    cohort = write_field_fixture(tmp_path)
    ch = Chapter(tmp_path, "field")
    short = records_from_logits(cohort["row_id"][:4], cohort["label"][:4], np.zeros((4, 3)), "b" * 64)
    ch.write_parquet("field/predictions_int8.parquet", short)
    with pytest.raises(ab.AbstentionInputError, match="2 missing"):
        ab.field_inputs(Chapter(tmp_path, "abstention"), 3)


# --------------------------------------------------------------------------- out-of-scope images
def test_out_of_scope_images_are_deterministic_and_not_plants():
    first = ab.out_of_scope_images(noise_images=2, seed=0, side=32)
    second = ab.out_of_scope_images(noise_images=2, seed=0, side=32)
    assert [n for n, _, _ in first] == [n for n, _, _ in second]
    assert all(np.array_equal(a, b) for (_, _, a), (_, _, b) in zip(first, second, strict=True))
    assert "grass" not in {n for n, _, _ in first}
    assert {k for _, k, _ in first} == {"photo", "texture", "noise"}
    assert all(a.shape == (32, 32, 3) and a.dtype == np.uint8 for _, _, a in first)


def test_rejection_rate_counts_rows_below_the_threshold():
    logits = np.array([[4, 0, 0], [0.1, 0, 0], [0, 0, 0]], dtype=np.float32)
    frame = records_from_logits(["a", "b", "c"], [-1, -1, -1], logits, "c" * 64).assign(
        source=["photo", "noise", "noise"])
    result = ab.rejection_block(frame, 1.0, 0.5, "msp", 0.95)
    assert result["rejection_rate"]["value"] == pytest.approx(2 / 3)
    assert result["by_source"]["noise"]["value"] == 1.0 and result["by_source"]["photo"]["value"] == 0.0


# --------------------------------------------------------------------------- whole chapter (smoke book)
@pytest.fixture(scope="module")
def smoke_chapter(smoke_book):
    from cropcop_utils import config

    ctx = config.reopen_run(smoke_book["run_dir"])
    notebook = smoke_book["book_root"] / "book" / "11_abstention.ipynb"
    return ctx, notebook, json.loads((ctx.run_dir / "abstention" / "abstention.json").read_text())


@pytest.mark.slow
def test_chapter_runs_headless_and_writes_the_recipe(smoke_chapter):
    from cropcop_utils.evidence import verify_registry

    ctx, notebook, record = smoke_chapter
    assert verify_registry(ctx.run_dir)["matches"].all()
    assert ab.PTE_VAL in record["outputs"] and "runtime/model.pte" in record["inputs"]
    pte_val = pd.read_parquet(ctx.run_dir / ab.PTE_VAL)
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


def write_images(root, rel_paths):
    from PIL import Image

    for rel in rel_paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (0, 120, 0)).save(root / rel)


def test_other_crop_leaves_are_sampled_deterministically_for_a_one_crop_corpus(tmp_path):
    from cropcop_utils.config import RunContext

    other = tmp_path / "tomato"
    write_images(other, [f"train/Tomato___healthy/{i}.jpg" for i in range(5)]
                 + ["train/Apple___scab/0.jpg", "train/.hidden.jpg"])
    (other / "notes.txt").write_text("not an image")
    ctx = RunContext(run_dir=tmp_path / "run", params={"data": str(tmp_path / "apple")}, fingerprint="x")
    apple = {"classes": [{"name": "Apple_scab", "crop": "apple"}, {"name": "Apple_rust", "crop": "apple"}]}
    params = {**PARAMS, "other_crop_data": str(other), "other_crop_images": 3}
    rows, root, note = ab.other_crop_rows(ctx, apple, params)
    assert note is None and root == other.resolve() and len(rows) == 3
    assert all(r.startswith("train/Tomato___healthy/") for r in rows["rel_path"])
    assert rows.equals(ab.other_crop_rows(ctx, apple, params)[0]) and (rows["source"] == "other_crop").all()

    mixed = {"classes": [*apple["classes"], {"name": "Tomato_healthy", "crop": "tomato"}]}
    assert "2 crops" in ab.other_crop_rows(ctx, mixed, params)[2]
    assert "no other-crop folder" in ab.other_crop_rows(ctx, apple, {**params, "other_crop_data": None})[2]
    assert "does not exist" in ab.other_crop_rows(ctx, apple, {**params, "other_crop_data": "/nope"})[2]
    own = RunContext(run_dir=tmp_path / "run", params={"data": str(other)}, fingerprint="x")
    assert "own corpus" in ab.other_crop_rows(own, apple, params)[2]
