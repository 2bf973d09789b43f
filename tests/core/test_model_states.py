"""The model states the analysis compares, and the paired container of their predictions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cropcop_utils.core.model_states import PAIRS, STATE_LABELS, STATE_NAMES, STATES, PairedStates


def test_states_follow_the_deployment_chain_and_pairs_name_known_states():
    assert STATE_NAMES == ("reference", "compact", "int8", "pte")
    assert [s.chapter for s in STATES] == ["training", "training", "ptq", "runtime"]
    assert set(STATE_LABELS) == set(STATE_NAMES)
    steps = [pair for pair in PAIRS if pair != ("reference", "pte")]
    assert steps == list(zip(STATE_NAMES, STATE_NAMES[1:], strict=False))  # each step once, in order
    assert ("reference", "pte") in PAIRS  # and the whole chain


def test_paired_states_score_against_one_label_column():
    rows = pd.DataFrame({"row_id": ["a", "b", "c"], "label": [0, 1, 1], "rel_path": ["x", "y", "z"]})
    paired = PairedStates(rows=rows, preds={"pte": np.array([0, 0, 1])}, margins={"pte": np.ones(3)},
                          model_states={"pte": "pte"}, n_classes=2)
    np.testing.assert_array_equal(paired.y, [0, 1, 1])
    np.testing.assert_array_equal(paired.correct("pte"), [True, False, True])
