import numpy as np

from cropcop_utils.abstention.hindsight import frontier, frontiers
from cropcop_utils.abstention.protection import TARGET_DEFAULTS

RNG = np.random.default_rng(0)


def _in_scope(n: int, error_rate: float = 0.0, msp_sees_errors: bool = True) -> dict:
    correct = RNG.random(n) >= error_rate
    msp = RNG.uniform(0.9, 1.0, n)
    if msp_sees_errors:
        msp[~correct] = RNG.uniform(0.3, 0.5, (~correct).sum())
    return {"kind": "in_scope", "score": RNG.normal(0.0, 1.0, n), "msp": msp, "correct": correct}


def _outside(kind: str, n: int, centre: float) -> dict:
    return {"kind": kind, "score": RNG.normal(centre, 1.0, n), "msp": RNG.uniform(0.9, 1.0, n)}


def _val(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    return RNG.normal(0.0, 1.0, n), RNG.uniform(0.3, 1.0, n)


def test_scores_that_keep_the_sets_apart_have_thresholds_meeting_every_target():
    sets = {"lab_test": _in_scope(300), "orchard": _in_scope(300, 0.05),
            "other_crop": _outside("far", 300, 12.0), "powdery_mildew": _outside("near", 200, 12.0)}
    found = frontier(*_val(), sets, TARGET_DEFAULTS, ["powdery_mildew"])
    assert found["pairs_meeting_all"] > 0 and found["best_slack"] >= 0
    figures = found["figures"]
    assert figures["lab_test"]["answered"] >= 0.95 and figures["lab_test"]["right"] >= 0.99
    assert figures["orchard"]["answered"] >= 0.90 and figures["orchard"]["right"] >= 0.97
    assert figures["other_crop"]["rejected"] >= 0.95 and figures["powdery_mildew"]["rejected"] >= 0.60


def test_an_out_of_scope_kind_that_scores_like_the_photos_leaves_no_thresholds_and_binds():
    sets = {"lab_test": _in_scope(300), "other_crop": _outside("far", 300, 0.0)}
    found = frontier(*_val(), sets, TARGET_DEFAULTS, [])
    assert found["pairs_meeting_all"] == 0 and found["best_slack"] < 0
    assert found["binding"] in {"lab_test answered", "other_crop rejected"}


def test_only_the_targeted_near_kinds_constrain_the_others_are_reported():
    sets = {"lab_test": _in_scope(300), "other_crop": _outside("far", 300, 12.0),
            "complex": _outside("near", 200, 0.0)}
    free = frontier(*_val(), sets, TARGET_DEFAULTS, [])
    assert free["pairs_meeting_all"] > 0 and "complex" in free["figures"]
    bound = frontier(*_val(), sets, TARGET_DEFAULTS, ["complex"])
    assert bound["pairs_meeting_all"] == 0 and bound["binding"] == "complex rejected"


def test_errors_the_confidence_cannot_see_bind_the_lab_risk():
    sets = {"lab_test": _in_scope(400, 0.04, msp_sees_errors=False), "other_crop": _outside("far", 300, 12.0)}
    found = frontier(*_val(), sets, TARGET_DEFAULTS, [])
    assert found["pairs_meeting_all"] == 0 and found["binding"] == "lab_test risk"
    seen = {**sets, "lab_test": _in_scope(400, 0.04, msp_sees_errors=True)}
    assert frontier(*_val(), seen, TARGET_DEFAULTS, [])["pairs_meeting_all"] > 0


def test_every_candidate_gets_its_own_frontier_from_the_chapters_sets():
    val_scores = {"apart": RNG.normal(0.0, 1.0, 400), "mixed": RNG.normal(0.0, 1.0, 400)}
    lab = _in_scope(300)
    far_apart, far_mixed = RNG.normal(12.0, 1.0, 300), RNG.normal(0.0, 1.0, 300)
    sets = {"lab_test": {**lab, "scores": {"apart": lab["score"], "mixed": lab["score"]}},
            "other_crop": {"kind": "far", "msp": RNG.uniform(0.9, 1.0, 300),
                           "scores": {"apart": far_apart, "mixed": far_mixed}}}
    found = frontiers(val_scores, RNG.uniform(0.3, 1.0, 400), sets, TARGET_DEFAULTS, [])
    assert found["apart"]["pairs_meeting_all"] > 0 and found["mixed"]["pairs_meeting_all"] == 0
