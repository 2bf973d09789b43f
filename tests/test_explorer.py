"""The error explorer: its functions, and the widget browser driven without a front end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import CLASSES, build_run
from matplotlib.figure import Figure

from cropcop_utils import explorer


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
    assert (errors["pred_pte"] != data.name(label)).all()
    by_row = run.test.set_index("row_id")
    for item in errors.head(3).itertuples():
        position = by_row.index.get_loc(item.row_id)
        assert item.pred_reference == data.name(run.preds["reference"][position])


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
    nothing = build_run(tmp_path, name="bare", states=())
    with pytest.raises(explorer.NothingToExplore, match="training"):
        explorer.load(nothing.run_dir)


def test_browser_redraws_when_a_class_is_picked(run, data) -> None:
    view = explorer.browser(data, "pte", max_images=4)
    picker, text, thumbnails = view.children
    assert picker.value == data.first_class
    assert data.name(0) in text.value and bytes(thumbnails.value).startswith(b"\x89PNG")
    first_png = bytes(thumbnails.value)
    picker.value = 1  # what a user's pick does: the observer rebuilds both views
    errors = explorer.misclassified(data, 1, "pte")
    assert data.name(1) in text.value and data.name(0) not in text.value.split("</p>")[0]
    assert f"{len(errors)} test rows misclassified" in text.value
    assert bytes(thumbnails.value) != first_png
