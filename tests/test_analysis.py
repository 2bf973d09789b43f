"""Chapters 8 and 9 on a fixture run folder with planted model-state properties."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import CLASSES, analysed_run, build_run, write_predictions  # noqa: F401
from sklearn.metrics import accuracy_score, f1_score, recall_score

from cropcop_utils import analysis, evidence, registry
from cropcop_utils.evidence import Chapter


def _read(run, rel: str) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / rel)


# --------------------------------------------------------------------------- chapter 8
def test_records_and_registered_outputs(analysed_run) -> None:  # noqa: F811
    run, record, _ = analysed_run
    assert record["chapter"] == "per_class"
    on_disk = json.loads((run.run_dir / "analysis/per_class.json").read_text())
    assert on_disk["figures"] == json.loads(json.dumps(record["figures"]))
    for state in analysis.STATES:
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
        assert bins[label]["note"] == analysis.EMPTY_BIN
        assert all(bins[label][key] is None for key in ("macro_f1_reference", "macro_f1_pte", "delta", "lo",
                                                       "hi"))
    assert bins["10–99"]["note"] is None and bins["10–99"]["delta"] is not None
    text = (run.run_dir / "analysis/per_class.json").read_text()
    assert "NaN" not in text
    assert f"training support ≥200: {analysis.EMPTY_BIN}" in analysis.per_class_prose(record)
    table = _read(run, "analysis/support_bins.parquet").set_index("bin")
    assert table.loc["≥200", "note"] == analysis.EMPTY_BIN and pd.isna(table.loc["≥200", "macro_f1_pte"])


def test_error_taxonomy_kinds() -> None:
    classes = pd.DataFrame({"label": [0, 1, 2, 3, 4, 5],
                            "crop": ["apple", "apple", "apple", "apple", "tomato", ""],
                            "type": ["healthy", "specific", "broad", "specific", "specific", "healthy"]})
    y = np.array([0, 0, 1, 1, 2, 1, 1, 5, 3])
    pred = np.array([0, 1, 0, 2, 1, 3, 4, 0, 3])
    kinds = analysis.classify_errors(y, pred, classes)
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


# --------------------------------------------------------------------------- refusals
def test_missing_state_names_the_file(tmp_path: Path) -> None:
    run = build_run(tmp_path, states=("reference", "compact", "int8"))
    with pytest.raises(analysis.MissingModelState, match="runtime/predictions_test.parquet"):
        analysis.run_per_class(run.ctx)
    with pytest.raises(analysis.MissingModelState, match="runtime"):
        analysis.run_fruit_slice(run.ctx)


def test_states_with_different_rows_are_refused(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    fewer = run.test.iloc[1:].reset_index(drop=True)
    write_predictions(run.run_dir, fewer, {"int8": run.preds["int8"][1:]}, run.class_map, ("int8",),
                      log_access=False)
    with pytest.raises(analysis.StateMismatch, match="identical test rows"):
        analysis.run_per_class(run.ctx)


def test_states_with_different_labels_are_refused(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    frame = pd.read_parquet(run.run_dir / "runtime/predictions_test.parquet")
    frame.loc[0, "label"] = (frame.loc[0, "label"] + 1) % len(CLASSES)
    Chapter(run.run_dir, "runtime").write_parquet("runtime/predictions_test.parquet", frame)
    with pytest.raises(analysis.StateMismatch, match="disagree on the label"):
        analysis.run_per_class(run.ctx)


def test_edited_prediction_file_fails_loudly(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    target = run.run_dir / "training/compact/predictions_test.parquet"
    data = bytearray(target.read_bytes())
    data[-20] ^= 0xFF
    target.write_bytes(bytes(data))  # changed behind the registry's back
    with pytest.raises(registry.RegistryMismatch, match="training/compact/predictions_test.parquet"):
        analysis.run_per_class(run.ctx)


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
    with pytest.raises(analysis.SliceRuleError, match="not a class-map field"):
        analysis.run_fruit_slice(run.ctx, slice={"field": "colour", "equals": "red"})
    empty = analysis.run_fruit_slice(run.ctx, slice={"field": "crop", "equals": "banana"}, bootstrap=20)
    assert empty["figures"]["slice"]["classes"] == 0
    assert "nothing to describe" in analysis.fruit_slice_prose(empty)


# --------------------------------------------------------------------------- notebooks
def _execute(notebook: str, target: Path, parameters: dict) -> dict:
    import nbformat
    import papermill

    repo = Path(__file__).resolve().parents[1]
    papermill.execute_notebook(str(repo / "notebooks" / f"{notebook}.ipynb"), str(target),
                               parameters=parameters, kernel_name="python3", cwd=str(repo),
                               progress_bar=False, execution_timeout=600)
    return nbformat.read(target, as_version=4)


@pytest.mark.slow
def test_notebooks_execute_headless(tmp_path: Path) -> None:
    """Chapters 8 and 9 and the explorer run under papermill on a fixture run folder."""
    run = build_run(tmp_path)
    chapter = {"run_dir": str(run.run_dir), "profile": run.profile, "data": run.ctx.data}
    per_class = _execute("08_per_class", tmp_path / "08.ipynb", chapter)
    assert per_class.cells[0].source.startswith("# Chapter 8: Per-class analysis")
    assert (run.run_dir / "analysis/per_class.json").exists()
    fruit = _execute("09_fruit_slice", tmp_path / "09.ipynb", chapter)
    assert fruit.cells[0].source.startswith("# Chapter 9: Fruit-label slice")
    assert "Exploratory" in fruit.cells[0].source
    shown = _execute("explore_errors", tmp_path / "explore.ipynb", {"run_dir": str(run.run_dir)})
    first = next(c for c in shown.cells if c.cell_type == "code" and "first_class" in c.source)
    kinds = {key for output in first.outputs for key in output.get("data", {})}
    assert "image/png" in kinds and "text/markdown" in kinds  # the first class, rendered statically
