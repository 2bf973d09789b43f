"""The split-membership probe (probes.membership): at chance on an iid split, above it on a shifted one."""

from __future__ import annotations

import numpy as np
import pytest
from probes.probe_fixtures import PARAMS
from sklearn.metrics import roc_auc_score

from cropcop_utils.probes import membership
from cropcop_utils.probes.errors import ProbeInputError


# --------------------------------------------------------------------------- membership
def test_auc_resamples_equal_scikit_learn_on_the_identity_resample():
    rng = np.random.default_rng(2)
    target = rng.integers(0, 2, 200)
    score = np.round(target * 0.3 + rng.random(200), 1)  # ties on purpose
    identity = np.arange(200)[None, :]
    assert membership.auc_resamples(target, score, identity)[0] == pytest.approx(roc_auc_score(target, score))
    one_class = np.zeros((1, 200), dtype=np.int64) + int(np.flatnonzero(target == 1)[0])
    assert np.isnan(membership.auc_resamples(target, score, one_class)[0])


def membership_data(shift: float, n: int = 500, seed: int = 4):
    rng = np.random.default_rng(seed)
    split = rng.choice(np.array(["train", "val", "test"]), size=n, p=[0.7, 0.15, 0.15])
    x = rng.normal(size=(n, 6))
    x[split == "test", 0] += shift
    return x, split, np.arange(n)


def test_membership_is_at_chance_on_an_iid_split():
    x, split, groups = membership_data(shift=0.0)
    for classifier in ("logistic", "extra_trees"):
        auc = membership.membership_probe(x, split, groups, classifier, PARAMS)["roc_auc"]
        assert auc["ci_low"] < 0.5 < auc["ci_high"], classifier
        assert auc["chance"] == 0.5


def test_membership_detects_a_systematic_train_test_difference():
    x, split, groups = membership_data(shift=2.0)
    result = membership.membership_probe(x, split, groups, "logistic", PARAMS)
    assert result["roc_auc"]["value"] > 0.85 and result["roc_auc"]["ci_low"] > 0.75
    assert result["n_test"] == int((split == "test").sum()) and result["folds"] == PARAMS["membership_folds"]


def test_membership_folds_keep_leakage_groups_together():
    # Near-identical twins within groups, groups assigned at random: the split is coherent, but a CV
    # that puts one twin in a training fold and the other in its test fold memorises membership.
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(200), 3)
    centre = rng.normal(size=(200, 6))
    x = centre[groups] + rng.normal(scale=0.01, size=(600, 6))
    split = rng.choice(np.array(["train", "test"]), size=200, p=[0.75, 0.25])[groups]
    grouped = membership.membership_probe(x, split, groups, "extra_trees", PARAMS)["roc_auc"]
    naive = membership.membership_probe(x, split, np.arange(600), "extra_trees", PARAMS)["roc_auc"]
    assert abs(grouped["value"] - 0.5) < 0.1  # (rows of a group are not independent: judge the value)
    assert naive["value"] > 0.9


def test_membership_needs_both_sides():
    x, split, groups = membership_data(shift=0.0, n=50)
    with pytest.raises(ProbeInputError, match="at least 2"):
        membership.membership_probe(x, np.where(split == "test", "val", split), groups, "logistic", PARAMS)
