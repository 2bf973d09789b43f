"""Loading and pairing the model states: refusals of missing, mismatched or edited prediction records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from analysis_fixtures import CLASSES, build_run, write_predictions

from cropcop_utils import analysis
from cropcop_utils.analysis.states import MissingModelState, StateMismatch
from cropcop_utils.core import registry
from cropcop_utils.core.evidence import Chapter


# --------------------------------------------------------------------------- refusals
def test_missing_state_names_the_file(tmp_path: Path) -> None:
    run = build_run(tmp_path, states=("reference", "compact", "int8"))
    with pytest.raises(MissingModelState, match="runtime/predictions_test.parquet"):
        analysis.run_per_class(run.ctx)
    with pytest.raises(MissingModelState, match="runtime"):
        analysis.run_fruit_slice(run.ctx)


def test_states_with_different_rows_are_refused(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    fewer = run.test.iloc[1:].reset_index(drop=True)
    write_predictions(run.run_dir, fewer, {"int8": run.preds["int8"][1:]}, run.class_map, ("int8",),
                      log_access=False)
    with pytest.raises(StateMismatch, match="identical test rows"):
        analysis.run_per_class(run.ctx)


def test_states_with_different_labels_are_refused(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    frame = pd.read_parquet(run.run_dir / "runtime/predictions_test.parquet")
    frame.loc[0, "label"] = (frame.loc[0, "label"] + 1) % len(CLASSES)
    Chapter(run.run_dir, "runtime").write_parquet("runtime/predictions_test.parquet", frame)
    with pytest.raises(StateMismatch, match="disagree on the label"):
        analysis.run_per_class(run.ctx)


def test_edited_prediction_file_fails_loudly(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    target = run.run_dir / "training/compact/predictions_test.parquet"
    data = bytearray(target.read_bytes())
    data[-20] ^= 0xFF
    target.write_bytes(bytes(data))  # changed behind the registry's back
    with pytest.raises(registry.RegistryMismatch, match="training/compact/predictions_test.parquet"):
        analysis.run_per_class(run.ctx)
