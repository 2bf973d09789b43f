"""The class probe (probes.classifiers): scores as scikit-learn does; planted cues found, absent ones not."""

from __future__ import annotations

import numpy as np
import pytest
from probes.probe_fixtures import PALETTE, PARAMS, leaf_image, random_split
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score

from cropcop_utils.probes import classifiers, cues
from cropcop_utils.probes.errors import ProbeInputError


def border_data(planted: bool, k: int = 4, per_class: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), per_class)
    borders = PALETTE[y] if planted else rng.integers(0, 256, (len(y), 3))
    x = np.stack([cues.border_strips(leaf_image(rng, b), 3, 4) for b in borders])
    return x, y, random_split(len(y), rng)


# --------------------------------------------------------------------------- metrics and chance
def test_score_classes_matches_scikit_learn_and_brackets_its_value():
    rng = np.random.default_rng(1)
    y = rng.choice(4, size=300, p=[0.7, 0.2, 0.07, 0.03])
    pred = np.where((y == 3) | ((y == 2) & (rng.random(300) < 0.5)), 0, y)  # the rarest classes lost
    scored = classifiers.score_classes(y, pred, 4, majority_class=0, n_boot=400, seed=0, level=0.95)
    assert scored["accuracy"]["value"] == pytest.approx(accuracy_score(y, pred), abs=1e-6)
    assert scored["macro_f1"]["value"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-6)
    assert scored["balanced_accuracy"]["value"] == pytest.approx(balanced_accuracy_score(y, pred), abs=1e-6)
    gap = scored["accuracy_minus_macro_f1"]
    assert gap["value"] == pytest.approx(scored["accuracy"]["value"] - scored["macro_f1"]["value"], abs=1e-5)
    assert gap["value"] > 0.1  # accuracy flatters a probe that loses the minority classes
    for metric in classifiers.CLASS_METRICS:
        entry = scored[metric]
        assert entry["ci_low"] <= entry["value"] <= entry["ci_high"], metric
    assert scored["accuracy"]["chance"] == 0.25
    assert scored["accuracy"]["majority"] == pytest.approx(np.mean(y == 0), abs=1e-6)


def test_chance_levels():
    y = np.array([0] * 50 + [1] * 50)
    levels = classifiers.chance_levels(y, 2)
    assert levels["accuracy"] == levels["balanced_accuracy"] == 0.5
    assert levels["macro_f1"] == pytest.approx(0.5)
    skewed = classifiers.chance_levels(np.array([0] * 90 + [1] * 10), 4)
    assert skewed["accuracy"] == 0.25 and 0 < skewed["macro_f1"] < 0.5


# --------------------------------------------------------------------------- cue probes
@pytest.mark.parametrize("classifier", ["extra_trees", "random_forest", "logistic"])
def test_planted_border_colour_is_found_far_above_chance(classifier):
    x, y, split = border_data(planted=True)
    result = classifiers.class_probe(x, y, split, 4, classifier, PARAMS)
    for name in ("val", "test"):
        accuracy = result[name]["accuracy"]
        assert accuracy["value"] > 0.9 and accuracy["ci_low"] > accuracy["chance"] + 0.4


def test_random_borders_stay_at_chance():
    x, y, split = border_data(planted=False)
    for classifier in ("extra_trees", "random_forest", "logistic"):
        result = classifiers.class_probe(x, y, split, 4, classifier, PARAMS)
        accuracy = result["test"]["accuracy"]
        assert accuracy["ci_low"] <= accuracy["chance"] <= accuracy["ci_high"] + 0.05, classifier
        assert abs(accuracy["value"] - 0.25) < 0.15

def test_unknown_classifier_is_refused():
    with pytest.raises(ProbeInputError, match="expected 'logistic', 'extra_trees'"):
        classifiers.make_classifier("svm", PARAMS)
