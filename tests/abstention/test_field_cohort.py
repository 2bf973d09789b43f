"""Chapter 11 on chapter 10's field cohort: its records and what the recipe does there."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from abstention.abstention_fixtures import PARAMS, pte_result, sampled

from cropcop_utils.abstention.calibration import probabilities
from cropcop_utils.abstention.chapter import deployment
from cropcop_utils.abstention.field_cohort import field_block, field_inputs
from cropcop_utils.abstention.records import AbstentionInputError
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.core.model_states import STATE_NAMES
from cropcop_utils.nets.predict import records_from_logits


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
    assert field_inputs(Chapter(tmp_path, "abstention"), 3) is None


def test_field_inputs_are_absent_when_chapter_10_had_no_cohort(tmp_path):
    # a real corpus without --field: chapter 10 runs its lab-side parts and records why nothing else
    Chapter(tmp_path, "field").finish(figures={}, status="no_field_cohort", reason="no --field given")
    ch = Chapter(tmp_path, "abstention")
    assert field_inputs(ch, 3) is None and "field/field.json" in ch.inputs


def test_field_path_on_a_fixture(tmp_path):
    write_field_fixture(tmp_path)
    ch = Chapter(tmp_path, "abstention")
    field = field_inputs(ch, 3)
    assert set(field["logits"]) == set(STATE_NAMES) and "field/cohort.parquet" in ch.inputs
    val_logits, val_y = sampled(400, 3, 1.0, seed=8)
    val_prob = probabilities(val_logits)
    result = field_block(field["logits"]["pte"], field["cohort"], 1.0, 0.9, val_prob, val_y,
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
    recipe = deployment(pte_result(field=result), {**PARAMS, "score": "msp"})
    assert set(recipe["field"]) == {"n", "abstained_share", "abstained_share_ci", "accuracy_accepted",
                                    "accuracy_accepted_ci", "accuracy_all", "accuracy_all_ci"}


def test_field_predictions_must_cover_the_cohort(tmp_path):
    cohort = write_field_fixture(tmp_path)
    ch = Chapter(tmp_path, "field")
    short = records_from_logits(cohort["row_id"][:4], cohort["label"][:4], np.zeros((4, 3)), "b" * 64)
    ch.write_parquet("field/predictions_int8.parquet", short)
    with pytest.raises(AbstentionInputError, match="2 missing"):
        field_inputs(Chapter(tmp_path, "abstention"), 3)


def test_field_sets_are_calibrated_on_field_val_when_the_regime_has_it():
    """Pooled with confident lab val rows, the calibration quantile is small and field sets under-cover; on
    the field val rows alone (the field_val mask) the sets grow to the level field photos need."""
    rng = np.random.default_rng(0)
    n_classes = 4
    lab = rng.integers(0, n_classes, 400)
    field = rng.integers(0, n_classes, 100)
    lab_logits = np.eye(n_classes)[lab] * 8
    noisy = lambda y: np.eye(n_classes)[y] * 2 + rng.normal(0, 1.2, (len(y), n_classes))  # noqa: E731
    val_y = np.r_[lab, field]
    val_prob = probabilities(np.r_[lab_logits, noisy(field)], 1.0)
    cohort_y = rng.integers(0, n_classes, 300)
    cohort = pd.DataFrame({"row_id": [f"f{i}" for i in range(300)], "label": cohort_y})
    params = {**PARAMS, "conformal_levels": [0.9]}
    mask = np.r_[np.zeros(len(lab), bool), np.ones(len(field), bool)]
    pooled = field_block(noisy(cohort_y), cohort, 1.0, 0.5, val_prob, val_y, params)["conformal"]["90"]
    own = field_block(noisy(cohort_y), cohort, 1.0, 0.5, val_prob, val_y, params, mask)["conformal"]["90"]
    assert (own["calibrated_on"], own["calibration_rows"]) == ("field val", 100)
    assert pooled["calibrated_on"] == "val" and pooled["calibration_rows"] == 500
    assert own["coverage"]["value"] >= 0.85 > pooled["coverage"]["value"]
    assert own["mean_set_size"] > pooled["mean_set_size"]
