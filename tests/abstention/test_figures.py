"""Chapter 11's figures draw from the chapter's tables: one panel per state, the threshold marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cropcop_utils.abstention import figures as figs
from cropcop_utils.abstention.calibration import calibration_block, probabilities
from cropcop_utils.abstention.chapter import DEFAULTS
from cropcop_utils.abstention.conformal import conformal_block
from cropcop_utils.abstention.selective import SCORES, confidence_scores, selective_block
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.core.model_states import STATE_NAMES

PARAMS = {**DEFAULTS, "bootstrap": 20, "curve_points": 50}


@pytest.fixture(scope="module")
def chapter_frames():
    """The tables and per-state results :func:`abstention.run_chapter` builds, on constructed logits."""
    rng = np.random.default_rng(0)
    frames = {"reliability": [], "risk_coverage": [], "conformal_classes": []}
    states, lab_scores = {}, {}
    for state in STATE_NAMES:
        val_logits, test_logits = rng.normal(0, 2, (300, 4)), rng.normal(0, 2, (200, 4))
        val_y, test_y = val_logits.argmax(1), rng.integers(0, 4, 200)
        test_y[:120] = test_logits[:120].argmax(1)
        indices = np.random.default_rng(1).integers(0, 200, (PARAMS["bootstrap"], 200))
        calibration, bins = calibration_block(test_logits, test_y, 1.5, PARAMS, indices)
        selective, curves = selective_block((val_logits, val_y), (test_logits, test_y), 1.5, PARAMS)
        conformal, per_class = conformal_block(probabilities(val_logits), val_y,
                                               probabilities(test_logits), test_y, PARAMS)
        states[state] = {"calibration": calibration, "selective": selective, "conformal": conformal}
        lab_scores[state] = confidence_scores(test_logits, 1.5)["msp"]
        frames["reliability"].append(bins.assign(state=state))
        frames["risk_coverage"].append(curves.assign(state=state))
        frames["conformal_classes"].append(per_class.assign(state=state))
    frames = {k: pd.concat(v, ignore_index=True) for k, v in frames.items()}
    frames["conformal_classes"]["class_name"] = "class_" + frames["conformal_classes"]["label"].astype(str)
    frames["out_of_scope_scores"] = pd.DataFrame({
        "state": np.repeat(STATE_NAMES, 5),
        "source": ["photo", "noise", "noise", "texture", "other_crop"] * 4,
        "score": rng.random(20)})
    return frames, states, lab_scores


def test_reliability_and_risk_coverage_have_a_panel_per_state(chapter_frames):
    frames, states, _ = chapter_frames
    reliability = figs.plot_reliability(frames["reliability"])
    assert [ax.get_title() for ax in reliability.axes] == [figs.STATE_LABELS[s] for s in STATE_NAMES]
    assert all(len(ax.lines) == 3 for ax in reliability.axes)   # before, after, diagonal
    curves = figs.plot_risk_coverage(frames["risk_coverage"], states, "msp", 0.02)
    assert len(curves.axes) == len(STATE_NAMES)
    labels = {line.get_label() for line in curves.axes[0].lines}
    assert set(SCORES) <= labels


def test_out_of_scope_figure_marks_the_threshold(chapter_frames):
    frames, _, lab_scores = chapter_frames
    oos = frames["out_of_scope_scores"]
    fig = figs.plot_out_of_scope(lab_scores["pte"], oos[oos["state"] == "pte"], 0.6, "msp")
    ax = fig.axes[0]
    assert any(line.get_label() == "threshold" and line.get_xdata()[0] == 0.6 for line in ax.lines)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "lab test (200)" in legend and "noise (2)" in legend


def test_save_all_registers_every_figure(chapter_frames, tmp_path):
    frames, states, lab_scores = chapter_frames
    ch = Chapter(tmp_path, "abstention")
    paths = figs.save_all(ch, frames, states, PARAMS, lab_scores)
    assert set(paths) == {"reliability", "risk_coverage", "conformal_classes", "out_of_scope"}
    for path in paths.values():
        assert (tmp_path / path).stat().st_size > 0 and path in ch.outputs
