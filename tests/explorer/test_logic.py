"""The error explorer: its functions and filters, and the widget browser driven without a front end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import CLASSES, build_run
from matplotlib.figure import Figure

from cropcop_utils.explorer import logic as explorer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return build_run(tmp_path_factory.mktemp("explorer"))


@pytest.fixture(scope="module")
def data(run) -> explorer.ExplorerData:
    return explorer.load(run.run_dir)


def test_load_reopens_the_run(run, data) -> None:
    assert data.ctx.run_dir == run.run_dir
    assert data.states == ["reference", "compact", "int8", "pte"]
    assert data.first_class == 0 and data.name(0) == sorted(CLASSES)[0]
    np.testing.assert_array_equal(data.paired.y, run.test["label"].to_numpy())


def test_class_options_count_errors(run, data) -> None:
    options = explorer.class_options(data)
    assert [label for _, label in options] == list(range(len(CLASSES)))
    y, pte = run.test["label"].to_numpy(), run.preds["pte"]
    text, label = options[0]
    assert f"{int((y == 0).sum())} test rows, {int(((y == 0) & (pte != 0)).sum())} errors" in text


def test_confusion_row_accounts_for_every_row(run, data) -> None:
    label = 5  # tomato_fruit_cracking: the pte loses many rows here
    table = explorer.confusion_row(data, label)
    n = int((run.test["label"] == label).sum())
    assert (table.sum(axis=0) == n).all()
    assert table.index[0] == data.name(label)
    y = run.test["label"].to_numpy()
    kept = int(((y == label) & (run.preds["pte"] == label)).sum())
    assert table.loc[data.name(label), ".pte on the runtime"] == kept


def test_misclassified_rows_with_every_state(run, data) -> None:
    label = 0
    errors = explorer.misclassified(data, label, "pte")
    y = run.test["label"].to_numpy()
    wrong = (y == label) & (run.preds["pte"] != label)
    assert len(errors) == int(wrong.sum())
    assert set(errors["row_id"]) == set(run.test.loc[wrong, "row_id"])
    assert errors["margin"].is_monotonic_decreasing
    assert {"pred_reference", "pred_compact", "pred_int8", "pred_pte"} <= set(errors.columns)
    assert (errors["pred_pte"] != data.name(label)).all() and (errors["true_class"] == data.name(label)).all()
    for path, rel_path in zip(errors["path"], errors["rel_path"], strict=True):
        assert Path(path).is_file() and path.endswith(rel_path)
    by_row = run.test.set_index("row_id")
    for item in errors.head(3).itertuples():
        position = by_row.index.get_loc(item.row_id)
        assert item.pred_reference == data.name(run.preds["reference"][position])


def test_filter_by_predicted_class(run, data) -> None:
    label = 1
    y, pte = run.test["label"].to_numpy(), run.preds["pte"]
    went_here = (pte == label) & (y != label)
    errors = explorer.misclassified(data, label, "pte", by="pred")
    assert set(errors["row_id"]) == set(run.test.loc[went_here, "row_id"])
    assert (errors["pred_pte"] == data.name(label)).all() and (errors["true_class"] != data.name(label)).all()
    table = explorer.confusion_row(data, label, by="pred")
    assert table.index.name == "true class"
    assert table[".pte on the runtime"].sum() == int((pte == label).sum())
    text, _ = explorer.class_options(data, "pte", by="pred")[label]
    assert f"{int((pte == label).sum())} predicted, {int(went_here.sum())} errors" in text
    with pytest.raises(ValueError, match="true class or predicted class"):
        explorer.misclassified(data, label, "pte", by="both")


def test_filter_rows_changed_between_reference_and_pte(run, data) -> None:
    changed = run.preds["reference"] != run.preds["pte"]
    assert changed.any() and not changed.all()  # the fixture plants .pte-only errors
    np.testing.assert_array_equal(explorer.changed_rows(data), changed)
    y = run.test["label"].to_numpy()
    for state in ("reference", "pte"):
        for label in range(len(CLASSES)):
            errors = explorer.misclassified(data, label, state, changed_only=True)
            wrong = (y == label) & (run.preds[state] != label)
            assert set(errors["row_id"]) == set(run.test.loc[wrong & changed, "row_id"])
    for label in range(len(CLASSES)):  # any state's errors can be narrowed to the changed rows
        errors = explorer.misclassified(data, label, "int8", changed_only=True)
        assert (errors["pred_reference"] != errors["pred_pte"]).all()


def test_gallery_shows_clickable_thumbnails_with_paths(data) -> None:
    errors = explorer.misclassified(data, 5, "pte")
    assert len(errors) > 3
    page = explorer.gallery_html(data, errors, "pte", max_images=3, thumb_px=100, large_px=300)
    assert page.count("<figure class='cropcop-thumb'") == 3
    assert page.count("<details><summary><img src='data:image/jpeg;base64,") == 3
    assert "details[open] img {width:300px" in page and "img {width:100px" in page
    for item in errors.head(3).itertuples():
        assert f"<code>{item.path}</code>" in page and f"data-row-id='{item.row_id}'" in page
    assert f"{len(errors) - 3} more not shown" in page
    assert "No rows to show" in explorer.gallery_html(data, errors.iloc[:0], "pte")


def test_class_scores_and_thumbnails(data) -> None:
    scores = explorer.class_scores(data, 0)
    assert len(scores) == 4 and scores["errors"].iloc[-1] >= scores["errors"].iloc[0]
    errors = explorer.misclassified(data, 0, "pte")
    fig = explorer.plot_thumbnails(data, errors, "pte", max_images=5, thumb_px=24, columns=4)
    assert isinstance(fig, Figure)
    assert sum(bool(ax.images) for ax in fig.axes) == min(5, len(errors))
    empty = explorer.plot_thumbnails(data, errors.iloc[:0], "pte")
    assert not any(ax.images for ax in empty.axes)


def test_unknown_state_is_named(data) -> None:
    with pytest.raises(KeyError, match="available"):
        explorer.misclassified(data, 0, "fp16")


def test_partial_run_shows_the_states_it_has(tmp_path: Path) -> None:
    partial = build_run(tmp_path, states=("reference", "compact"))
    data = explorer.load(partial.run_dir)
    assert data.states == ["reference", "compact"]
    assert explorer.class_options(data)  # falls back to the last state present
    assert not data.can_compare_changes
    with pytest.raises(KeyError, match="needs both states"):
        explorer.misclassified(data, 0, "compact", changed_only=True)
    view = explorer.browser(data, "compact")
    assert _widget(view, "changed").disabled
    nothing = build_run(tmp_path, name="bare", states=())
    with pytest.raises(explorer.NothingToExplore, match="training"):
        explorer.load(nothing.run_dir)


def _widget(view, name: str):
    """The browser's widget with CSS class ``cropcop-<name>`` (how the browser test finds it too)."""
    stack = [view]
    while stack:
        widget = stack.pop()
        if f"cropcop-{name}" in widget._dom_classes:
            return widget
        stack.extend(getattr(widget, "children", ()))
    raise LookupError(name)


def test_browser_redraws_when_a_class_is_picked(run, data) -> None:
    view = explorer.browser(data, "pte", max_images=4)
    picker, text, gallery = (_widget(view, name) for name in ("class", "tables", "thumbnails"))
    assert picker.value == data.first_class
    assert data.name(0) in text.value and "cropcop-thumb" in gallery.value
    first_gallery = gallery.value
    picker.value = 1  # what a user's pick does: the observer rebuilds both views
    errors = explorer.misclassified(data, 1, "pte")
    assert data.name(1) in text.value and data.name(0) not in text.value.split("</p>")[0]
    assert f"{len(errors)} test rows misclassified" in text.value
    assert gallery.value != first_gallery
    assert gallery.value.count("cropcop-thumb'") == min(4, len(errors))
    assert all(f"data-row-id='{r}'" in gallery.value for r in errors["row_id"].head(4))


def test_browser_filters_keep_the_class_and_redraw(run, data) -> None:
    view = explorer.browser(data, "pte", max_images=50)
    picker, by, state, changed, text, gallery = (
        _widget(view, name) for name in ("class", "by", "state", "changed", "tables", "thumbnails"))
    picker.value = 5
    by.value = "pred"  # new option texts; the picked class stays
    assert picker.value == 5 and "predicted," in picker.label
    went_here = explorer.misclassified(data, 5, "pte", by="pred")
    assert f"{len(went_here)} test rows of other classes" in text.value
    assert gallery.value.count("cropcop-thumb'") == min(50, len(went_here))
    state.value = "reference"
    assert picker.value == 5
    reference = explorer.misclassified(data, 5, "reference", by="pred")
    assert f"{len(reference)} test rows of other classes that the" in text.value
    changed.value = True
    only = explorer.misclassified(data, 5, "reference", by="pred", changed_only=True)
    assert "changed between the reference and the .pte" in text.value
    expected = "cropcop-thumb'" if len(only) else "No rows to show"
    assert gallery.value.count(expected) == max(len(only), 1)


def test_filter_rows_the_pte_abstention_answered_or_refused(run, tmp_path: Path) -> None:
    """With chapter 11's decisions in the run, the explorer narrows any state's errors to the test rows the
    .pte's recipe answered, or to those it refused; without them the filter says which chapter to run."""
    import shutil

    import pandas as pd

    from cropcop_utils.core.evidence import atomic_write_parquet, register

    with pytest.raises(KeyError, match="run chapter 11"):
        explorer.misclassified(explorer.load(run.run_dir), 0, "pte", abstention="refused")
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    answered = np.arange(len(run.test)) % 3 != 0
    decisions = pd.DataFrame({"set": "lab_test", "kind": "in_scope", "row_id": run.test["row_id"],
                              "score": "mahalanobis", "outlier_score": 0.0, "msp": 0.9, "answered": answered})
    atomic_write_parquet(copy / explorer.DECISIONS, pd.concat([decisions, decisions.assign(set="noise",
                                                                                           kind="far")]))
    register(copy, explorer.DECISIONS, "abstention")
    data = explorer.load(copy)
    y = run.test["label"].to_numpy()
    for label in range(len(CLASSES)):
        wrong = (y == label) & (run.preds["int8"] != label)
        parts = {a: explorer.misclassified(data, label, "int8", abstention=a) for a in explorer.ABSTENTION}
        assert set(parts["answered"]["row_id"]) == set(run.test.loc[wrong & answered, "row_id"])
        assert set(parts["refused"]["row_id"]) == set(run.test.loc[wrong & ~answered, "row_id"])
        assert len(parts["all"]) == len(parts["answered"]) + len(parts["refused"])
        assert parts["refused"]["pte_answered"].eq(False).all()
    view = explorer.browser(data, "pte", max_images=50)
    rows, text = _widget(view, "abstention"), _widget(view, "tables")
    assert not rows.disabled
    rows.value = "refused"
    assert "refused by the .pte's abstention recipe" in text.value
