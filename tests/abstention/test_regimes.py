"""Chapter 11's regimes side by side: one row per regime and state, shares with their intervals."""

from __future__ import annotations

import pandas as pd

from cropcop_utils.abstention import regimes as abstention_regimes


def _state(ece: float, field: dict | None) -> dict:
    share = {"value": 0.9, "ci": [0.8, 0.95], "n": 10}
    return {"temperature": 1.2, "calibration": {"after": {"ece": ece, "ece_ci": [ece / 2, ece * 2]}},
            "selective": {"msp": {"aurc": 0.1, "test": {"coverage": share, "selective_risk": share}}},
            "field": field}


def test_side_by_side_lists_the_shipped_regime_first_and_keeps_undefined_shares_empty():
    field = {"abstained_share": {"value": 0.5, "ci": [0.4, 0.6], "n": 20},
             "accuracy_accepted": {"value": None, "ci": None, "n": 0, "reason": "no rows"},
             "accuracy_all": {"value": 0.3, "ci": [0.2, 0.4], "n": 20}}
    record = {"params": {"score": "msp"}, "regime": "background_robust",
              "figures": {"states": {"pte": _state(0.05, field)}},
              "regimes": {"baseline": {"states": {"pte": _state(0.08, None)}}}}
    table = abstention_regimes.side_by_side(record)
    assert list(table["regime"]) == ["background_robust", "baseline"]
    assert list(table["shipped"]) == [True, False]
    assert table.loc[0, "field_abstained_share"] == 0.5 and table.loc[0, "field_abstained_share_lo"] == 0.4
    assert pd.isna(table.loc[0, "field_accuracy_accepted"]) and pd.isna(table.loc[1, "field_accuracy_all"])
    assert table.loc[1, "ece_after"] == 0.08 and table.loc[1, "lab_coverage"] == 0.9
