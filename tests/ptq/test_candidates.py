"""Chapter 6 (PTQ): the declaration, the validation gate, the selection rule and the gate figure."""

from __future__ import annotations

import matplotlib.colors
import pandas as pd
import pytest
from ptq_fixtures import OVERRIDES

from cropcop_utils import ptq as quant


# --------------------------------------------------------------------------- declaration
def test_parse_candidates_validates_the_declaration():
    good = quant.parse_candidates(OVERRIDES["ptq"])
    assert [c.name for c in good] == ["dynamic_pc", "static_pc_full", "static_pc_half"]
    assert [c.order for c in good] == [0, 1, 2]
    assert all(c.float_modules == () for c in good)
    stem = quant.parse_candidates({"candidates": [{"name": "s", "activations": "static",
                                                   "calibration_rows": 1,
                                                   "float_modules": ["conv_stem", "blocks.0"]}]})[0]
    assert stem.float_modules == ("conv_stem", "blocks.0")
    bad = [
        {},
        {"candidates": [{"name": "a", "activations": "dynamic", "calibration_rows": 10}]},
        {"candidates": [{"name": "a", "activations": "static", "calibration_rows": 0}]},
        {"candidates": [{"name": "a", "activations": "weird"}]},
        {"candidates": [{"name": "Bad Name", "activations": "dynamic"}]},
        {"candidates": [{"name": "a", "activations": "dynamic"}, {"name": "a", "activations": "dynamic"}]},
        {"candidates": [{"name": "a", "activations": "static", "calibration_rows": 1,
                         "float_modules": "stem"}]},
        {"candidates": [{"name": "a", "activations": "static", "calibration_rows": 1,
                         "float_modules": ["conv_stem", "conv_stem"]}]},
        {"candidates": [{"name": "a", "activations": "static", "calibration_rows": 1,
                         "float_modules": ["conv stem"]}]},
    ]
    for section in bad:
        with pytest.raises(quant.PTQConfigError):
            quant.parse_candidates(section)
    with pytest.raises(quant.PTQConfigError, match="max_macro_f1_drop"):
        quant.Gate.from_section({"gate": {"min_agreement": 0.9}})


def test_effective_rows_cap_at_the_train_size_and_fingerprint_ignores_the_corpus():
    candidates = quant.parse_candidates(OVERRIDES["ptq"])
    assert [c.effective_rows(30) for c in candidates] == [0, 30, 8]
    assert [c.effective_rows(1000) for c in candidates] == [0, 100, 8]
    gate = quant.Gate(0.01, 0.98)
    small, large = (quant.declaration(candidates, gate, n, 0, 16) for n in (30, 1000))
    assert small["fingerprint"] == large["fingerprint"]
    assert small["effective_calibration_rows"]["static_pc_full"] == 30
    other_gate = quant.declaration(candidates, quant.Gate(0.02, 0.98), 30, 0, 16)
    assert other_gate["fingerprint"] != small["fingerprint"]
    # a module kept float is part of the recipe: declaring it changes the fingerprint
    floated = [*candidates[:2], quant.Candidate(**{**vars(candidates[2]), "float_modules": ("bn1",)})]
    assert quant.declaration(floated, gate, 30, 0, 16)["fingerprint"] != small["fingerprint"]


def test_gate_boundaries_pass_and_fail():
    gate = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)
    assert gate.verdict(0.01, 0.98)[0]          # on the boundary passes
    assert gate.verdict(-0.005, 1.0)[0]         # an improvement passes
    passed, why = gate.verdict(0.0101, 0.99)
    assert not passed and "macro-F1 drop" in why
    passed, why = gate.verdict(0.0, 0.9799)
    assert not passed and "agreement" in why and "macro-F1" not in why


def test_the_gate_boundary_holds_through_the_real_subtraction():
    # Validation macro-F1 0.87 -> 0.86 is a drop of exactly 1 point, but 0.87 - 0.86 is
    # 0.010000000000000009 in floating point: compared raw, a 1-point gate would fail it.
    gate = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)
    on_boundary = quant.macro_f1_drop(0.87, 0.86)
    assert on_boundary > 0.01  # the float noise this test is about
    just_past = quant.macro_f1_drop(0.87, 0.86 - 1e-6)  # 1e-4 points past the limit
    table = quant.apply_gate(_table([("on", 0, 0, on_boundary, 0.99), ("past", 1, 0, just_past, 0.99)]), gate)
    verdicts = table.set_index("candidate")
    assert bool(verdicts.at["on", "passed"]) and "1.00 pt ≤ 1.00 pt" in verdicts.at["on", "verdict"]
    assert not bool(verdicts.at["past", "passed"]) and "macro-F1 drop" in verdicts.at["past", "verdict"]
    # Agreement is computed from predictions too, and sits on its floor the same way.
    agree = quant.agreement([1] * 49 + [0], [1] * 50)
    assert gate.verdict(on_boundary, agree)[0]
    assert not gate.verdict(on_boundary, quant.agreement([1] * 48 + [0, 0], [1] * 50))[0]
    # The precision is declared: it is part of the gate's record and of the declaration's fingerprint.
    assert quant.Gate(0.01, 0.98).points_decimals == quant.GATE_DECIMALS == 9
    coarse = quant.declaration([], quant.Gate(0.01, 0.98, points_decimals=2), 30, 0, 16)
    assert coarse["gate"]["points_decimals"] == 2
    assert coarse["fingerprint"] != quant.declaration([], gate, 30, 0, 16)["fingerprint"]
    assert quant.gate_points(on_boundary) == quant.gate_points(0.01) == 1.0


# --------------------------------------------------------------------------- selection
def _table(rows: list[tuple[str, int, int, float, float]]) -> pd.DataFrame:
    """(candidate, order, calibration_rows, macro_f1_drop, agreement) with float macro-F1 0.9."""
    columns = ["candidate", "order", "calibration_rows", "macro_f1_drop", "agreement"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.assign(macro_f1=0.9 - frame["macro_f1_drop"])


GATE = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)


def test_selection_is_pass_first():
    # The failing candidate has the best macro-F1 but low agreement: a passing one wins.
    table = quant.apply_gate(_table([("a", 0, 0, -0.02, 0.90), ("b", 1, 100, 0.005, 0.99),
                                     ("c", 2, 50, 0.008, 0.99)]), GATE)
    name, reason = quant.select_candidate(table)
    assert name == "b"
    assert "passed the gate" in reason
    assert list(quant.rank_candidates(table)["candidate"]) == ["b", "c", "a"]


def test_selection_is_macro_f1_first_among_passing():
    table = quant.apply_gate(_table([("a", 0, 0, 0.009, 0.999), ("b", 1, 100, 0.001, 0.981),
                                     ("c", 2, 50, 0.004, 0.995)]), GATE)
    assert quant.select_candidate(table)[0] == "b"  # lowest drop, despite the lowest agreement


def test_macro_f1_ties_go_to_fewer_calibration_rows_then_declared_order():
    tie = 0.9 - 0.003
    table = quant.apply_gate(_table([("a", 0, 100, 0.003, 0.99), ("b", 1, 50, 0.003, 0.99),
                                     ("c", 2, 50, 0.003, 0.99)]), GATE)
    table.loc[2, "macro_f1"] = tie + 1e-15  # float noise is still a tie
    name, reason = quant.select_candidate(table)
    assert name == "b"  # fewer rows than a; declared before c
    assert "tied on macro-F1" in reason and "fewer calibration rows" in reason
    assert list(quant.rank_candidates(table)["candidate"]) == ["b", "c", "a"]
    # A real macro-F1 difference beats the tie-break.
    table.loc[0, "macro_f1"] = tie + 1e-6
    assert quant.select_candidate(table)[0] == "a"


def test_when_nothing_passes_the_best_failing_candidate_is_selected_and_said_so():
    table = quant.apply_gate(_table([("a", 0, 0, 0.05, 0.90), ("b", 1, 100, 0.03, 0.80)]), GATE)
    name, reason = quant.select_candidate(table)
    assert name == "b"
    assert reason.startswith("no candidate passed the gate") and "fails:" in reason



def test_plot_gate_draws_every_candidate():
    table = quant.apply_gate(_table([("a", 0, 0, 0.002, 0.99), ("b", 1, 100, 0.03, 0.90)]), GATE)
    fig = quant.plot_gate(table, GATE, "a")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["gate", "1 a (selected)", "2 b"]
    colours = [tuple(c.get_facecolor()[0][:3]) for c in fig.axes[0].collections[-2:]]
    assert colours == [matplotlib.colors.to_rgb("tab:red"), matplotlib.colors.to_rgb("tab:gray")]
