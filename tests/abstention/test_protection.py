"""The protection recipe: fitted on validation and fitting outliers only, chosen by its declared rule, and
judged against the targets — on features whose in/out structure is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cropcop_utils.abstention import protection as p

PARAMS = {"in_scope_coverage": 0.95, "target_risk": 0.02, "ci_level": 0.95}


def _outputs(rng, n, centres, labels=None, spread=0.3):
    """Features around class centres (or far away when labels is None) and logits a linear head gives."""
    if labels is None:
        z = rng.normal(0, 1, (n, centres.shape[1])) * 3 + 6
        labels = np.full(n, -1)
    else:
        z = centres[labels] + rng.normal(0, spread, (n, centres.shape[1]))
    return p.Outputs(z @ centres.T, z.astype(np.float32), labels)


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(0)
    centres = np.eye(4, 16) * 4
    train = _outputs(rng, 400, centres, rng.integers(0, 4, 400))
    val = _outputs(rng, 200, centres, rng.integers(0, 4, 200))
    far = _outputs(rng, 150, centres)
    detectors = p.fit_detectors(train.features, train.labels, knn_k=5)
    return rng, centres, train, val, far, detectors


def test_feature_scores_separate_what_lies_far_from_the_training_features(world):
    _, _, _, val, far, detectors = world
    inside, outside = p.outlier_scores(detectors, val, 1.0), p.outlier_scores(detectors, far, 1.0)
    for name in p.FEATURE_CANDIDATES:
        assert np.median(outside[name]) > np.quantile(inside[name], 0.99), name


def test_candidates_are_fitted_on_validation_and_the_fitting_kind_chooses(world):
    _, _, _, val, far, detectors = world
    val_scores = p.outlier_scores(detectors, val, 1.0)
    msp = -val_scores["msp"]
    fitted, chosen = p.fit_candidates(val_scores, msp, val.correct, p.outlier_scores(detectors, far, 1.0),
                                      PARAMS)
    assert set(fitted) == set(p.CANDIDATES)
    for name, f in fitted.items():
        assert f["val_kept"] >= 0.95, name  # the outlier threshold keeps the declared share of validation
    best = max(f["fitting_rejection"]["value"] for f in fitted.values())
    assert fitted[chosen]["fitting_rejection"]["value"] == best
    # the thresholds depend on validation and fitting rows only: evaluated sets cannot move them
    again, chosen_again = p.fit_candidates(val_scores, msp, val.correct,
                                           p.outlier_scores(detectors, far, 1.0), PARAMS)
    assert chosen_again == chosen and again[chosen]["score_threshold"] == fitted[chosen]["score_threshold"]


def test_evaluation_and_verdict_per_kind(world):
    rng, centres, _, val, far, detectors = world
    val_scores = p.outlier_scores(detectors, val, 1.0)
    fitted, chosen = p.fit_candidates(val_scores, -val_scores["msp"], val.correct,
                                      p.outlier_scores(detectors, far, 1.0), PARAMS)
    test = _outputs(rng, 300, centres, rng.integers(0, 4, 300))
    noise = _outputs(rng, 100, centres)
    sets = {}
    for name, out, kind in (("lab_test", test, "in_scope"), ("noise", noise, "far")):
        scores = p.outlier_scores(detectors, out, 1.0)
        sets[name] = {"kind": kind, "scores": scores, "msp": -scores["msp"],
                      "correct": out.correct if kind == "in_scope" else None}
    table = p.evaluate(fitted, sets, 0.95)
    assert len(table) == len(p.CANDIDATES) * 2
    mine = table[table["score"] == chosen].set_index("set")
    assert mine.loc["noise", "rejected"] >= 0.95 and mine.loc["lab_test", "coverage"] >= 0.85
    lab = mine.loc["lab_test"]
    assert lab["coverage_lo"] <= lab["coverage"] <= lab["coverage_hi"]
    judged = p.verdict(table, chosen, p.TARGET_DEFAULTS, ["powdery_mildew"])
    # no near out-of-scope photos in this run: that target is unmeasured, so the recipe is not said to protect
    assert judged["unmeasured"] == ["powdery_mildew rejected"] and judged["protects"] is False
    strict = p.verdict(table, chosen, {**p.TARGET_DEFAULTS, "far_rejection": 1.01}, [])
    assert "noise rejected" in strict["unmet"] and strict["protects"] is False


def test_jigsaw_keeps_every_pixel_and_moves_the_tiles():
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    shuffled = p.jigsaw(images, 4, torch.Generator().manual_seed(0))
    assert shuffled.shape == images.shape and not torch.equal(shuffled, images)
    assert torch.equal(shuffled.flatten(1).sort(dim=1).values, images.flatten(1).sort(dim=1).values)
    again = p.jigsaw(images, 4, torch.Generator().manual_seed(0))
    assert torch.equal(shuffled, again)  # seeded: the fitting set is reproducible


def test_validation_reach_says_when_no_threshold_could_meet_the_in_scope_targets():
    """Per validation set: the fitted recipe's answered share and accuracy there, and the most of the set a
    confidence threshold can answer behind the outlier threshold at the set's accuracy target."""
    targets = p.TARGET_DEFAULTS  # lab: >= 95 % answered at <= 1 % wrong; field: >= 90 % at >= 97 % right
    n = 200
    scores = np.linspace(0.0, 1.0, 2 * n)  # outlier score: the last 10 rows of each set lie beyond 0.95
    lab = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    msp = np.r_[np.linspace(0.99, 0.6, n), np.linspace(0.99, 0.6, n)]
    # lab: every row right; field: every fifth row wrong, wherever its confidence lies (no ranking at all)
    correct = np.r_[np.ones(n, bool), np.arange(n) % 5 != 0]
    candidate = {"score_threshold": 0.95, "confidence": {"threshold": 0.7}}
    reach = p.validation_reach(candidate, scores, msp, correct,
                               {"lab val": ("lab", lab), "field val": ("field", ~lab)}, targets, 0.95)
    answered = p.accepted(candidate, scores[lab], msp[lab])
    assert reach["lab val"]["coverage"]["value"] == pytest.approx(answered.mean())
    assert reach["lab val"]["selective_accuracy"]["value"] == 1.0
    assert reach["lab val"]["reach"] == 1.0 and reach["lab val"]["reachable"]
    assert reach["field val"]["accuracy_target"] == pytest.approx(0.97)
    # a model that cannot rank its errors (its most confident row is wrong): no threshold keeps 97 %
    assert reach["field val"]["reach"] < 0.05 and not reach["field val"]["reachable"]
    # behind the outlier threshold: what it refuses is never counted as reachable
    ranked = p.validation_reach(candidate, scores, msp, np.ones(2 * n, bool),
                                {"field val": ("field", ~lab)}, targets, 0.95)
    kept = (scores[~lab] <= 0.95).mean()
    assert ranked["field val"]["reach"] == pytest.approx(kept) and ranked["field val"]["reachable"] == (
        kept >= 0.9)
    assert "lab val" not in p.validation_reach(candidate, scores, msp, correct,
                                               {"lab val": ("lab", np.zeros(2 * n, bool))}, targets, 0.95)


def test_the_validation_sentence_names_each_set_and_the_one_no_threshold_could_serve():
    from cropcop_utils.abstention.protection_prose import validation_sentence

    def entry(reach, reachable):
        share = {"value": 0.9, "ci": [0.85, 0.93]}
        return {"kind": "field", "n": 300, "coverage": share, "selective_accuracy": share,
                "coverage_target": 0.9, "accuracy_target": 0.97, "reach": reach, "reachable": reachable}

    short = validation_sentence({"field val": entry(0.8967, False)})
    assert "`field val` (n = 300) answered 90.0 % [85.0, 93.0]" in short
    assert "at most 89.7 % of it at ≥ 97 % right (target: answer ≥ 90 %)" in short
    assert "So on `field val` no confidence threshold behind this outlier threshold meets both" in short
    room = validation_sentence({"field val": entry(0.93, True)})
    assert "leaves room" in room and "no field validation rows" not in room
    lab_only = validation_sentence({"lab val": entry(0.97, True) | {"kind": "lab"}})
    assert "There are no field validation rows: validation says nothing of the field targets" in lab_only
    assert validation_sentence({}) == ""
    none = entry(0.0, False) | {"selective_accuracy": {"value": None, "ci": None, "reason": "no rows"}}
    assert "right on n/a" in validation_sentence({"field val": none})  # a recipe that answers none


def test_the_hindsight_sentence_tells_a_miss_of_the_rule_from_a_miss_of_the_score():
    from cropcop_utils.abstention.protection_prose import hindsight_sentence

    def found(meeting, shortfall, binding="other_crop rejected"):
        return {"pairs": 40804, "pairs_meeting_all": meeting, "best_slack": -shortfall,
                "shortfall": shortfall, "binding": binding, "figures": {}}

    def protection(mine, other, protects=False):
        return {"chosen": "mahalanobis", "verdict": {"protects": protects},
                "hindsight": {"mahalanobis": mine, "knn": other}}

    score = hindsight_sentence(protection(found(0, 0.043), found(0, 0.07, "field-apple answered")))
    assert "a grid of 40,804 pairs" in score
    assert ("with `mahalanobis` no pair meets every target; the best falls short by 4.3 points on "
            "other_crop rejected, so no rule fitted on validation could meet them with this score") in score
    assert "the closest, `knn`, falls short by 7.0 points on field-apple answered" in score
    rule = hindsight_sentence(protection(found(12, 0.0), found(3, 0.0)))
    assert "12 pairs meet every target, so thresholds that protect exist for this score and the rule " \
        "fitted on validation did not find them" in rule and "`knn` (3)" in rule
    assert "did not find" not in hindsight_sentence(protection(found(12, 0.0), found(0, 0.1), protects=True))
    assert hindsight_sentence({"chosen": "mahalanobis", "verdict": {"protects": False}}) == ""
