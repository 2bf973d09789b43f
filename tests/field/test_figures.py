"""The regime comparison figures of chapter 10: the change table and the paired heat maps."""

from __future__ import annotations

import numpy as np

from cropcop_utils.field import figures


def _item(key: str, mass: float, cell: str = "lab_field", state: str = "compact") -> dict:
    return {"method": "gradcam", "state": state, "cell": cell, "key": key, "off_leaf": mass,
            "image": np.zeros((8, 8, 3), np.uint8), "map": np.ones((8, 8)), "mask": np.ones((8, 8), bool)}


def test_paired_heatmaps_show_the_same_images_under_each_regime():
    galleries = {"baseline": [_item("a", 0.5), _item("b", 0.2), _item("c", 0.3, state="pte")],
                 "background_robust": [_item("b", 0.1), _item("a", np.nan)]}
    items = figures.paired_heatmaps(galleries)
    assert [(i["key"], i["title"].split(" ·")[0]) for i in items] == [
        ("a", "baseline"), ("a", "background_robust"), ("b", "baseline"), ("b", "background_robust")]
    assert "off-leaf n/a" in items[1]["title"] and "off-leaf 0.10" in items[3]["title"]
    assert figures.heatmap_gallery(items) is not None


def test_change_rows_list_every_measure_and_skip_missing_ones():
    change = {"value": -0.1, "lo": -0.2, "hi": 0.0, "n": 10, "baseline": 0.5, "regime": 0.4}
    comparison = {"background_robust": {"states": {"pte": {
        "lab_test": {"macro_f1": change}, "field": None, "cells": {"lab_plain": change, "field_plain": None},
        "background_share": change, "off_leaf": {"occlusion": {"lab_field": change}}}}}}
    table = figures.change_rows(comparison)
    assert list(table["measure"]) == ["lab test macro-F1", "cell lab_plain accuracy",
                                      "background share of the gap", "off-leaf occlusion (lab_field)"]
    assert figures.plot_regime_changes(table, states=("pte", "pte")) is not None
