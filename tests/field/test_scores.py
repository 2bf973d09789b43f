"""Chapter 10's scores on a cohort with a field-train folder: every score also on the photos with no
trusted relative in field-train, and the gap between the two with its interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cropcop_utils.field.scores import field_results, relative_effect

PARAMS = {"ci_level": 0.95, "bootstrap": 400, "seed": 0}
NAMES = ["a", "b"]


def _cohort(n_related: int, n_unrelated: int, unrelated_right: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    n = n_related + n_unrelated
    y = np.arange(n) % 2
    pred = y.copy()
    wrong = np.arange(n_related + unrelated_right, n)  # every related photo right, some unrelated ones wrong
    pred[wrong] = 1 - pred[wrong]
    ids = [f"r{i}" for i in range(n)]
    cohort = pd.DataFrame({"row_id": ids, "label": y, "class_name": [NAMES[k] for k in y],
                           "source_label": [NAMES[k] for k in y]})
    return cohort, pd.DataFrame({"row_id": ids, "label": y, "pred": pred})


def test_the_unrelated_photos_are_scored_apart_and_the_gap_has_an_interval():
    cohort, record = _cohort(n_related=60, n_unrelated=40, unrelated_right=20)
    relatives = {f"r{i}" for i in range(60)}
    out = field_results(record, cohort, NAMES, PARAMS, relatives)["field_train_relatives"]
    assert (out["related"], out["unrelated"]) == (60, 40)
    assert out["with_relative"]["accuracy"]["value"] == 1.0
    assert out["without_relative"]["accuracy"]["value"] == pytest.approx(0.5)
    gap = out["accuracy_gap"]
    assert gap["value"] == pytest.approx(0.8 - 0.5)  # whole cohort 80 / 100 right, unrelated 20 / 40
    assert 0.15 < gap["lo"] < gap["value"] < gap["hi"] < 0.45
    # without field-train (relatives None) nothing is added; with no relative at all the gap is zero
    assert "field_train_relatives" not in field_results(record, cohort, NAMES, PARAMS)
    none_related = field_results(record, cohort, NAMES, PARAMS, set())["field_train_relatives"]
    assert none_related["accuracy_gap"]["value"] == 0.0 and none_related["related"] == 0


def test_a_cohort_whose_every_photo_has_a_relative_has_no_gap_to_report():
    y = np.array([0, 1, 0, 1])
    out = relative_effect(y, y, np.ones(4, bool), NAMES, PARAMS)
    assert out["unrelated"] == 0 and out["without_relative"]["n"] == 0
    assert out["accuracy_gap"]["value"] is None and "no cohort photo" in out["accuracy_gap"]["reason"]
