"""Chapter 8 (per-class analysis) on a fixture run folder with planted model-state properties."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import CLASSES, analysed_run, build_run  # noqa: F401
from sklearn.metrics import accuracy_score, f1_score

from cropcop_utils import analysis
from cropcop_utils.analysis.per_class import EMPTY_BIN, classify_errors
from cropcop_utils.core import evidence, registry
from cropcop_utils.core.model_states import STATES


def _read(run, rel: str) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / rel)


# --------------------------------------------------------------------------- chapter 8
def test_records_and_registered_outputs(analysed_run) -> None:  # noqa: F811
    run, record, _ = analysed_run
    assert record["chapter"] == "per_class"
    on_disk = json.loads((run.run_dir / "analysis/per_class.json").read_text())
    assert on_disk["figures"] == json.loads(json.dumps(record["figures"]))
    for state in STATES:
        assert state.path in record["inputs"], state.path
    assert "split/split.parquet" in record["inputs"]
    artifacts = evidence.read_registry(run.run_dir)
    for name in ("state_metrics", "paired_deltas", "mcnemar", "per_class", "support_bins", "taxonomy",
                 "transitions", "identity"):
        assert artifacts[f"analysis/{name}.parquet"]["chapter"] == "per_class"
    for path in record["plots"].values():
        assert artifacts[path]["chapter"] == "per_class" and path.endswith(".png")
    assert artifacts["analysis/per_class.json"]["chapter"] == "per_class"
    for name, state in record["states"].items():
        assert state["test_reads"] == 1, name  # the fixture logs one locked-test read per state
        assert state["model_state"] == pd.read_parquet(run.run_dir / state["file"])["model_state"].iloc[0]
    registry.check(run.run_dir)


def test_state_metrics_are_sklearn_with_intervals(analysed_run) -> None:  # noqa: F811
    run, _, _ = analysed_run
    table = _read(run, "analysis/state_metrics.parquet").set_index(["state", "metric"])
    y = run.test["label"].to_numpy()
    labels = sorted(set(y))
    for state, pred in run.preds.items():
        assert table.loc[(state, "accuracy"), "value"] == pytest.approx(accuracy_score(y, pred))
        assert table.loc[(state, "macro_f1"), "value"] == pytest.approx(
            f1_score(y, pred, labels=labels, average="macro", zero_division=0))
        for metric in ("accuracy", "macro_f1", "balanced_accuracy", "weighted_f1"):
            row = table.loc[(state, metric)]
            assert row["lo"] <= row["value"] <= row["hi"], (state, metric)


def test_known_zero_step_and_known_loss(analysed_run) -> None:  # noqa: F811
    _, record, _ = analysed_run
    paired = record["figures"]["paired"]
    same = paired["reference_to_compact"]  # compact == reference row for row
    for metric in ("accuracy", "macro_f1", "balanced_accuracy"):
        assert (same[metric]["delta"], same[metric]["lo"], same[metric]["hi"]) == (0.0, 0.0, 0.0)
        assert not same[metric]["excludes_zero"]
    assert same["mcnemar"] == {"only_from_correct": 0, "only_to_correct": 0, "p_value": 1.0}
    loss = paired["int8_to_pte"]  # pte loses ~45 % of the fruit classes' correct rows
    assert loss["macro_f1"]["hi"] < 0 and loss["macro_f1"]["excludes_zero"]
    assert loss["mcnemar"]["only_to_correct"] == 0 and loss["mcnemar"]["p_value"] < 0.001


def test_mcnemar_counts_match_the_rows(analysed_run) -> None:  # noqa: F811
    run, _, _ = analysed_run
    table = _read(run, "analysis/mcnemar.parquet").set_index("pair")
    y = run.test["label"].to_numpy()
    ref_ok, pte_ok = run.preds["reference"] == y, run.preds["pte"] == y
    row = table.loc["reference_to_pte"]
    assert row["only_a_correct"] == int((ref_ok & ~pte_ok).sum())
    assert row["only_b_correct"] == int((~ref_ok & pte_ok).sum())


def test_per_class_table(analysed_run) -> None:  # noqa: F811
    run, _, _ = analysed_run
    table = _read(run, "analysis/per_class.parquet").set_index("class_name")
    for name, (n_train, n_test) in CLASSES.items():
        assert table.loc[name, "train_support"] == n_train
        assert table.loc[name, "test_support"] == n_test
        assert bool(table.loc[name, "unstable"]) == (n_test < 10)  # smoke: min_test_support 10
    expected_bins = {"apple_fruit_rot": "<10", "apple_fungal_disease": "10–24", "apple_healthy": "25–49",
                     "apple_scab": "≥50", "tomato_early_blight": "<10", "tomato_fruit_cracking": "10–24",
                     "tomato_healthy": "25–49", "tomato_mites": "25–49"}
    assert table["support_bin"].to_dict() == expected_bins
    y = run.test["label"].to_numpy()
    f1 = f1_score(y, run.preds["pte"], labels=list(range(len(CLASSES))), average=None, zero_division=0)
    np.testing.assert_allclose(table.sort_values("label")["f1_pte"], f1)
    np.testing.assert_allclose(table["delta_f1_reference_to_pte"], table["f1_pte"] - table["f1_reference"])
    assert (table["delta_f1_reference_to_pte_lo"] <= table["delta_f1_reference_to_pte_hi"]).all()


def test_support_bins_average_their_classes(analysed_run) -> None:  # noqa: F811
    run, record, _ = analysed_run
    bins = _read(run, "analysis/support_bins.parquet").set_index("bin")
    per_class = _read(run, "analysis/per_class.parquet")
    assert list(bins.index) == ["<10", "10–24", "25–49", "≥50"]
    assert bins["classes"].to_dict() == {"<10": 2, "10–24": 2, "25–49": 3, "≥50": 1}
    for label, row in bins.iterrows():
        members = per_class[per_class["support_bin"] == label]
        assert row["macro_f1_pte"] == pytest.approx(members["f1_pte"].mean())
        assert row["delta_reference_to_pte"] == pytest.approx(
            members["f1_pte"].mean() - members["f1_reference"].mean())
    assert record["figures"]["support_bins"]["<10"]["classes"] == 2


def test_support_bin_edges_are_a_parameter(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    record = analysis.run_per_class(run.ctx, support_bins=[20, 40], bootstrap=20)
    assert list(record["figures"]["support_bins"]) == ["<20", "20–39", "≥40"]
    assert record["params"]["support_bins"] == [20, 40]


def test_an_empty_support_bin_is_null_with_a_reason(tmp_path: Path) -> None:
    """Every fixture class has < 100 training rows: the bins from 100 up are empty, as on a real corpus
    whose classes all have many images the low bins are."""
    run = build_run(tmp_path)
    record = analysis.run_per_class(run.ctx, support_bins=[10, 100, 200], bootstrap=20)
    bins = record["figures"]["support_bins"]
    for label in ("100–199", "≥200"):
        assert bins[label]["classes"] == 0
        assert bins[label]["note"] == EMPTY_BIN
        assert all(bins[label][key] is None for key in ("macro_f1_reference", "macro_f1_pte", "delta", "lo",
                                                       "hi"))
    assert bins["10–99"]["note"] is None and bins["10–99"]["delta"] is not None
    text = (run.run_dir / "analysis/per_class.json").read_text()
    assert "NaN" not in text
    assert f"training support ≥200: {EMPTY_BIN}" in analysis.per_class_prose(record)
    table = _read(run, "analysis/support_bins.parquet").set_index("bin")
    assert table.loc["≥200", "note"] == EMPTY_BIN and pd.isna(table.loc["≥200", "macro_f1_pte"])


def test_error_taxonomy_kinds() -> None:
    classes = pd.DataFrame({"label": [0, 1, 2, 3, 4, 5],
                            "crop": ["apple", "apple", "apple", "apple", "tomato", ""],
                            "type": ["healthy", "specific", "broad", "specific", "specific", "healthy"]})
    y = np.array([0, 0, 1, 1, 2, 1, 1, 5, 3])
    pred = np.array([0, 1, 0, 2, 1, 3, 4, 0, 3])
    kinds = classify_errors(y, pred, classes)
    assert list(kinds) == [None, "healthy→disease", "disease→healthy", "broad↔specific", "broad↔specific",
                           "within-crop", "cross-crop", "cross-crop", None]


def test_taxonomy_and_transitions(analysed_run) -> None:  # noqa: F811
    run, record, _ = analysed_run
    taxonomy = _read(run, "analysis/taxonomy.parquet")
    y = run.test["label"].to_numpy()
    for state, pred in run.preds.items():
        assert taxonomy.loc[taxonomy["state"] == state, "errors"].sum() == int((pred != y).sum())
    ref, pte = run.preds["reference"], run.preds["pte"]
    expected = {"correct→correct": int(((ref == y) & (pte == y)).sum()),
                "correct→wrong": int(((ref == y) & (pte != y)).sum()),
                "wrong→correct": int(((ref != y) & (pte == y)).sum()),
                "wrong→same wrong": int(((ref != y) & (pte == ref)).sum()),
                "wrong→other wrong": int(((ref != y) & (pte != y) & (pte != ref)).sum())}
    assert record["figures"]["transitions_reference_to_pte"] == expected
    moves = _read(run, "analysis/transitions.parquet")
    assert moves["rows"].sum() == len(y)
    assert set(moves.loc[moves["transition"] == "correct→correct", "kind"]) == {"(correct)"}


def test_prose_reads_the_record(analysed_run) -> None:  # noqa: F811
    _, record, slice_record = analysed_run
    text = analysis.per_class_prose(record)
    delta = record["figures"]["paired"]["reference_to_pte"]["macro_f1"]["delta"]
    assert f"{100 * delta:+.2f}" in text
    assert str(record["figures"]["n_test_rows"]) in text
    slice_text = analysis.fruit_slice_prose(slice_record)
    assert "Exploratory" in slice_text and "descriptive" in slice_text
