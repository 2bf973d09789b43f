"""Chapter 9 (fruit-label slice) on a fixture run folder with planted model-state properties."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from analysis_fixtures import analysed_run, build_run  # noqa: F401
from sklearn.metrics import recall_score

from cropcop_utils import analysis
from cropcop_utils.analysis.fruit_slice import SliceRuleError
from cropcop_utils.core import evidence


def _read(run, rel: str) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / rel)


# --------------------------------------------------------------------------- chapter 9
def test_fruit_slice(analysed_run) -> None:  # noqa: F811
    run, _, record = analysed_run
    f = record["figures"]
    assert f["exploratory"] is True and "descriptive" in record["note"].lower()
    fruit = [c for c in run.class_map["classes"] if c["fruit"]]
    assert f["slice_classes"] == [c["name"] for c in fruit] == ["apple_fruit_rot", "tomato_fruit_cracking"]
    y = run.test["label"].to_numpy()
    labels = [c["index"] for c in fruit]
    for state, pred in run.preds.items():
        recall = recall_score(y, pred, labels=labels, average=None, zero_division=0).mean()
        assert f["slice"]["states"][state]["mean_recall"]["value"] == pytest.approx(recall)
    whole = f["slice"]["paired"]["reference_to_pte"]["mean_recall"]
    assert whole["hi"] < 0 and whole["excludes_zero"]
    assert f["rest"]["paired"]["int8_to_pte"]["mean_recall"]["delta"] == 0.0  # pte only hurts the slice
    table = _read(run, "analysis/fruit_slice.parquet")
    assert sorted(table["class_name"]) == f["slice_classes"]
    assert evidence.read_registry(run.run_dir)["analysis/fruit_slice.json"]["chapter"] == "fruit_slice"


def test_slice_rule_is_configurable(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    record = analysis.run_fruit_slice(run.ctx, slice={"field": "type", "equals": "broad"}, bootstrap=20)
    assert record["figures"]["slice_classes"] == ["apple_fungal_disease", "tomato_mites"]
    with pytest.raises(SliceRuleError, match="not a class-map field"):
        analysis.run_fruit_slice(run.ctx, slice={"field": "colour", "equals": "red"})
    empty = analysis.run_fruit_slice(run.ctx, slice={"field": "crop", "equals": "banana"}, bootstrap=20)
    assert empty["figures"]["slice"]["classes"] == 0
    assert "nothing to describe" in analysis.fruit_slice_prose(empty)
