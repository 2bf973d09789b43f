"""Regime against baseline on the same rows: paired changes and their intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cropcop_utils.field import compare

PARAMS = {"bootstrap": 200, "seed": 0, "ci_level": 0.95, "min_gap": 0.01}


def _record(pred, label=(0, 1, 0, 1, 0, 1, 0, 1)):
    ids = [f"r{i}" for i in range(len(label))]
    return pd.DataFrame({"row_id": ids, "label": list(label), "pred": list(pred)})


def test_classification_change_is_the_regime_minus_the_baseline():
    base = _record([1, 0, 1, 0, 0, 1, 0, 1])   # 4 of 8
    robust = _record([0, 1, 0, 1, 0, 1, 0, 1])  # 8 of 8
    change = compare.classification_change(base, robust, 2, PARAMS)
    assert change["accuracy"]["value"] == pytest.approx(0.5)
    assert change["accuracy"]["baseline"] == 0.5 and change["accuracy"]["regime"] == 1.0
    assert 0 < change["accuracy"]["lo"] <= 0.5 <= change["accuracy"]["hi"]
    with pytest.raises(ValueError, match="differently"):
        compare.classification_change(base, _record([0] * 8, label=(1, 1, 0, 1, 0, 1, 0, 1)), 2, PARAMS)


def test_mean_change_skips_undefined_items_and_says_when_none_are_left():
    change = compare.mean_change(np.array([0.8, np.nan, 0.6]), np.array([0.2, 0.5, 0.4]), PARAMS)
    assert change["value"] == pytest.approx(-0.4) and change["n"] == 2
    empty = compare.mean_change(np.array([np.nan]), np.array([0.1]), PARAMS, "maps")
    assert empty["value"] is None and "maps" in empty["reason"]


def _cells(plain, swapped, field):
    ids = [f"s{i}" for i in range(len(plain))]
    fids = [f"f{i}" for i in range(len(field))]

    def frame(ids, ok):
        return pd.DataFrame({"source_row_id": ids, "label": 0, "pred": [0 if o else 1 for o in ok]})

    return {"lab_plain": frame(ids, plain), "lab_field": frame(ids, swapped),
            "field_field": frame(fids, field)}


def test_share_change_pairs_the_same_rows_of_both_regimes():
    base = _cells([1] * 10, [1] * 2 + [0] * 8, [0] * 10)     # share (1 - 0.2) / (1 - 0) = 0.8
    robust = _cells([1] * 10, [1] * 8 + [0] * 2, [1] * 5 + [0] * 5)  # (1 - 0.8) / (1 - 0.5) = 0.4
    change = compare.share_change(base, robust, PARAMS)
    assert change["baseline"] == pytest.approx(0.8) and change["regime"] == pytest.approx(0.4)
    assert change["value"] == pytest.approx(-0.4) and change["lo"] < 0
    cells = compare.cells_change(base, robust, PARAMS)
    assert cells["lab_field"]["value"] == pytest.approx(0.6) and cells["field_plain"] is None


def test_share_change_is_null_with_a_reason_without_a_gap():
    same = _cells([1] * 4, [1] * 4, [1] * 4)
    change = compare.share_change(same, same, PARAMS)
    assert change["value"] is None and "gap" in change["reason"]


def test_attribution_change_per_method_state_and_cell():
    a = {("gradcam", "compact", "lab_plain"): np.array([0.6, 0.4])}
    b = {("gradcam", "compact", "lab_plain"): np.array([0.3, 0.1]),
         ("occlusion", "pte", "lab_plain"): np.ones(2)}
    out = compare.attribution_change(a, b, PARAMS)
    assert list(out) == ["gradcam"] and out["gradcam"]["compact"]["lab_plain"]["value"] == pytest.approx(-0.3)
