"""The analysis chapters' figures, from small hand-made tables (the chapters' own run: test_analysis)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cropcop_utils.analysis import figures
from cropcop_utils.core import metrics
from cropcop_utils.core.model_states import ERROR_KINDS, STATE_LABELS, STATE_NAMES, PairedStates

CLASSES = pd.DataFrame({"label": [0, 1, 2], "class_name": ["apple_scab", "apple_healthy",
                                                            "tomato_late_blight_of_the_leaves_and_fruit"]})


@pytest.fixture
def paired() -> PairedStates:
    y = np.array([0, 0, 1, 1, 2, 2])
    preds = {s: y.copy() for s in STATE_NAMES}
    preds["pte"] = np.array([0, 1, 1, 1, 2, 0])  # two errors: class 0 → 1, class 2 → 0
    rows = pd.DataFrame({"row_id": list("abcdef"), "label": y, "rel_path": [f"{i}.png" for i in range(6)]})
    return PairedStates(rows=rows, preds=preds, margins={s: np.linspace(0.1, 0.6, 6) for s in STATE_NAMES},
                        model_states={s: s for s in STATE_NAMES}, n_classes=3)


def test_state_metrics_has_one_panel_per_metric_and_one_point_per_state():
    table = pd.DataFrame([{"metric": m, "state_label": STATE_LABELS[s], "value": 0.8, "lo": 0.7, "hi": 0.9}
                          for m in metrics.METRICS for s in STATE_NAMES])
    fig = figures.plot_state_metrics(table)
    assert [ax.get_title() for ax in fig.axes] == [metrics.METRIC_LABELS[m] for m in metrics.METRICS]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [STATE_LABELS[s] for s in STATE_NAMES]


def test_paired_deltas_are_drawn_in_points():
    table = pd.DataFrame([{"metric": m, "pair": "reference_to_pte", "delta": -0.0064, "lo": -0.0124,
                           "hi": -0.0005} for m in metrics.PAIRED_METRICS])
    fig = figures.plot_paired_deltas(table)
    x, _ = fig.axes[0].lines[0].get_data()
    assert x[0] == pytest.approx(-0.64)
    assert fig.axes[0].get_yticklabels()[0].get_text() == "reference → pte"


def test_taxonomy_stacks_every_error_kind_per_state():
    taxonomy = pd.DataFrame([{"state": s, "kind": k, "errors": 1 + i} for s in STATE_NAMES
                             for i, k in enumerate(ERROR_KINDS)])
    fig = figures.plot_taxonomy(taxonomy)
    assert len(fig.axes[0].patches) == len(STATE_NAMES) * len(ERROR_KINDS)


def test_support_bins_draw_a_bar_per_state_and_bin():
    bins = pd.DataFrame({"bin": ["<10", "≥10"], "classes": [2, 1],
                         **{f"macro_f1_{s}": [0.5, 0.9] for s in STATE_NAMES}})
    assert len(figures.plot_support_bins(bins).axes[0].patches) == 2 * len(STATE_NAMES)


def test_an_empty_support_bin_says_so_instead_of_a_gap():
    bins = pd.DataFrame({"bin": ["<10", "≥10"], "classes": [0, 3], "note": [None, None],
                         **{f"macro_f1_{s}": [np.nan, 0.5] for s in STATE_NAMES}})
    bins.loc[0, "note"] = "no classes in this bin"
    ax = figures.plot_support_bins(bins).axes[0]
    assert [t.get_text() for t in ax.texts] == ["no classes\nin this bin"]
    assert ax.get_xlim() == (-0.5, 1.5)


def test_confusion_is_row_normalised(paired):
    fig = figures.plot_confusion(paired, CLASSES, "pte")
    matrix = fig.axes[0].collections[0].get_array().reshape(3, 3)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
    assert matrix[0, 1] == pytest.approx(0.5)


def test_worst_classes_are_the_lowest_f1_among_classes_with_errors(paired):
    per_class = pd.DataFrame({"label": [0, 1, 2], "class_name": CLASSES["class_name"],
                              "f1_pte": [0.67, 0.8, 0.5], "f1_reference": [1.0, 1.0, 1.0],
                              "test_support": [2, 2, 2]})
    assert figures.worst_classes(per_class, paired, "pte", 5) == [2, 0]  # class 1 has no errors
    assert figures.worst_classes(per_class, paired, "reference", 5) == []


def test_short_names_keep_their_width():
    assert figures._short("apple_scab") == "apple_scab"
    assert len(figures._short(CLASSES["class_name"][2])) == 18
