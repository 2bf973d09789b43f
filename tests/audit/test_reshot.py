"""The re-shot verifier: the same leaf moved, turned or relit is one similarity; another leaf is not."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from cropcop_utils.audit import reshot
from cropcop_utils.audit.config import settings
from cropcop_utils.audit.errors import AuditInputError
from cropcop_utils.synthetic import drawing

SEED = 20261130
DECISION = (25, 12, 0.7, 30.0)  # the DEFAULTS' reshot_min_inliers, support_inliers, min_share, max_angle
LABELS = Path(__file__).resolve().parents[2] / "bench" / "reshot_labels.csv"


def _picture(cls: str, uid: int, shot: int = 0, kind: str = "moved", source: str = "lab_bench"):
    return drawing.render_upright(SEED, 96, cls, source, uid, shot, kind)


def _scores(rows: list[tuple]) -> reshot.ReshotScores:
    """Scores from (matches, inliers, scale, angle[, mirrored]) rows."""
    matches, inliers, scale, angle = (np.array(c) for c in zip(*(r[:4] for r in rows), strict=True))
    flipped = np.array([bool(r[4]) if len(r) > 4 else False for r in rows])
    return reshot.ReshotScores(matches.astype(np.int32), inliers.astype(np.int32), scale.astype(np.float32),
                               angle.astype(np.float32), flipped, np.ones(len(rows), bool))


@pytest.mark.parametrize("cls", ["tomato_late_blight", "tomato_healthy"])
def test_a_moved_or_relit_reshot_is_accepted_and_another_leaf_of_its_class_is_not(cls):
    first = reshot.leaf_keypoints(_picture(cls, 7))
    moved = reshot.match_pair(first, reshot.leaf_keypoints(_picture(cls, 7, 1, "moved")))
    relit = reshot.match_pair(first, reshot.leaf_keypoints(_picture(cls, 7, 1, "relit")))
    other = reshot.match_pair(first, reshot.leaf_keypoints(_picture(cls, 8)))
    decided = reshot.accepted(_scores([moved, relit, other]), *DECISION)
    assert decided.tolist() == [True, True, False]
    # the generator turns a moved re-shot by 3-8 degrees and barely scales it: the fit says so
    assert 3 <= abs(moved[3]) <= 8 and 0.95 <= moved[2] <= 1.05


def test_the_decision_needs_a_plausible_move_and_enough_agreeing_matches():
    rows = [(40, 30, 1.0, 2.0),     # many inliers: accepted
            (16, 13, 1.0, 2.0),     # few, but most of the matches: accepted
            (30, 13, 1.0, 2.0),     # few, and under half the matches (template look-alikes): rejected
            (40, 30, 1.0, 95.0),    # a quarter turn: chance fits between two leaves came at such turns
            (40, 30, 1.6, 2.0),     # a re-shot from one stand does not grow the leaf by 60 %
            (0, 0, np.nan, np.nan)]  # nothing matched
    assert reshot.accepted(_scores(rows), *DECISION).tolist() == [True, True, False, False, False, False]


def test_a_mirrored_copy_is_found_by_the_mirrored_pass_without_detecting_keypoints_again():
    from PIL import Image

    picture = _picture("tomato_early_blight", 11)
    plain = reshot.leaf_keypoints(picture)
    flipped = reshot.leaf_keypoints(picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    matches, inliers, scale, angle, mirrored = reshot.match_pair(plain, flipped)
    assert mirrored and inliers >= 0.8 * matches and inliers >= 40
    assert abs(scale - 1) < 0.02 and abs(angle) < 1
    # the mirror of the mirror is the picture itself
    twice = reshot.mirrored(reshot.mirrored(plain))
    np.testing.assert_array_equal(twice.descriptors, plain.descriptors)
    np.testing.assert_allclose(twice.xy, plain.xy, atol=1e-6)


def test_scores_are_deterministic_in_pair_order_and_the_same_with_a_pool(tmp_path):
    paths = []
    for k, (uid, shot) in enumerate([(3, 0), (3, 1), (4, 0), (5, 0)]):
        path = tmp_path / f"{k}.jpg"
        _picture("apple_scab", uid, shot).save(path, quality=92)
        paths.append(str(path))
    pairs = np.array([[0, 1], [0, 2], [2, 3], [1, 0]])
    alone = reshot.verify_pairs(paths, pairs, workers=1, task=2)
    pooled = reshot.verify_pairs(lambda k: paths[k], pairs, workers=2, task=2)
    for name in ("matches", "inliers", "scale", "angle", "mirrored", "done"):
        np.testing.assert_array_equal(getattr(alone, name), getattr(pooled, name))
    assert alone.inliers[0] > 3 * max(alone.inliers[1], alone.inliers[2])
    assert alone.inliers[3] > 3 * max(alone.inliers[1], alone.inliers[2])  # either way round
    assert reshot.verify_pairs(paths, np.zeros((0, 2), np.int64)).done.shape == (0,)


def test_a_picture_without_a_leaf_still_gets_keypoints_from_the_whole_frame():
    rng = np.random.default_rng(0)
    from PIL import Image

    noise = Image.fromarray(rng.integers(0, 255, (128, 128, 3), dtype=np.uint8))
    found = reshot.leaf_keypoints(noise)
    assert len(found.xy) > 20 and found.descriptors.dtype == np.uint8
    assert found.xy.min() >= 0 and found.xy.max() <= 1


def test_settings_refuse_impossible_reshot_thresholds():
    with pytest.raises(AuditInputError, match="reshot_max_angle"):
        settings({"reshot_max_angle": 270})
    with pytest.raises(AuditInputError, match="reshot_verifier"):
        settings({"reshot_verifier": "yes"})


def test_pairs_labelled_by_eye_on_plantvillage_tomato_are_decided_as_labelled(tomato_root):
    """Twelve of the labelled pairs in bench/reshot_labels.csv: six the verifier trusts that were judged the
    same leaf, six on the review list it rejects that were judged two leaves."""
    with LABELS.open() as handle:
        rows = list(csv.DictReader(handle))
    same = [r for r in rows if r["stratum"] == "trusted" and r["label"] == "same"][:6]
    different = [r for r in rows if r["stratum"] == "rejected" and r["label"] == "different"][:6]
    assert len(same) == 6 and len(different) == 6
    chosen = same + different
    paths = [str(tomato_root / r[end]) for r in chosen for end in ("rel_path_a", "rel_path_b")]
    pairs = np.arange(len(paths)).reshape(-1, 2)
    decided = reshot.accepted(reshot.verify_pairs(paths, pairs), *DECISION)
    assert decided.tolist() == [True] * 6 + [False] * 6
