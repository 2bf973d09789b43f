"""Planning the split: coverage repair, the vectorised splitter against sklearn's, fold counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from split.split_runs import TARGET

from cropcop_utils.split import plan as split


def test_repair_moves_whole_groups_or_quarantines():
    live = pd.DataFrame({
        "row_id": [f"r{i}" for i in range(11)],
        "class_name": ["A"] * 6 + ["B"] * 2 + ["C"] * 3,
        "group_id": [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        "split": ["train"] * 4 + ["val", "test", "train", "train", "train", "val", "test"]})
    fixed, repairs, quarantined = split._repair_coverage(live.copy(), min_per_split=1)
    # B (two groups, both in train) cannot reach all three splits without emptying one: quarantined.
    assert [(q["name"], q["reason"]) for q in quarantined] == [("B", "cannot_cover_every_split")]
    assert "B" not in set(fixed["class_name"]) and len(fixed) == 9
    assert [(r["class_name"], r["to"]) for r in repairs] == [("B", "val")]
    starving = live.assign(split=["train"] * 4 + ["val", "val", "train", "val", "train", "val", "test"])
    fixed, repairs, _ = split._repair_coverage(starving.copy(), min_per_split=1)
    # A lacks test: the smallest A group whose donor keeps an A row moves (group 2, not the pair).
    assert repairs[0] == {"class_name": "A", "group_id": 2, "from": "train", "to": "test", "rows": 1}
    assert fixed.groupby("group_id")["split"].nunique().max() == 1
    assert (pd.crosstab(fixed["class_name"], fixed["split"]) >= 1).all().all()


@pytest.mark.parametrize("seed,n_folds", [(0, 5), (1, 20)])
def test_vectorised_splitter_gives_sklearns_folds(seed, n_folds):
    from sklearn.model_selection import StratifiedGroupKFold

    rng = np.random.default_rng(seed)
    y, groups = rng.integers(0, 6, 400), rng.integers(0, 260, 400)
    folds = [[test.tolist() for _, test in cls(n_folds, shuffle=True, random_state=seed).split(
        np.zeros(400), y, groups)] for cls in (StratifiedGroupKFold, split.VectorisedStratifiedGroupKFold)]
    assert folds[0] == folds[1]
    assert split.GroupedSplitter is split.VectorisedStratifiedGroupKFold  # the fast path is in use


def test_folds_for_expresses_fractions():
    assert split.folds_for(TARGET) == (20, {"train": 14, "val": 3, "test": 3})
    assert split.folds_for({"train": 0.8, "val": 0.1, "test": 0.1}) == (10, {"train": 8, "val": 1, "test": 1})
    n, counts = split.folds_for({"train": 0.71, "val": 0.145, "test": 0.145})
    assert n == 20 and sum(counts.values()) == 20 and min(counts.values()) >= 1
    with pytest.raises(split.SplitInputError, match="sum to 1"):
        split.parse_fractions({"train": 0.7, "val": 0.2, "test": 0.2})
    with pytest.raises(split.SplitInputError, match="train, val and test"):
        split.parse_fractions({"train": 0.8, "test": 0.2})


def test_a_corpus_too_small_for_the_folds_gets_a_clear_error():
    # 4 classes x 12 one-image groups: enough groups (48 >= 20) but no class fills 20 folds (a 5 % sample
    # of the 1,000-file apple corpus); sklearn's own error would name none of it.
    rows = pd.DataFrame({"row_id": [f"r{i:02d}" for i in range(48)],
                         "class_name": [f"c{i % 4}" for i in range(48)], "group_id": range(48)})
    with pytest.raises(split.SplitInputError, match=r"fewer than 20 images \(the largest: 12\)"):
        split.plan_split(rows, TARGET, seed=0)
    bigger = pd.DataFrame({"row_id": [f"r{i:02d}" for i in range(80)],
                           "class_name": [f"c{i % 4}" for i in range(80)], "group_id": range(80)})
    assert len(split.plan_split(bigger, TARGET, seed=0).assignment) == 80
