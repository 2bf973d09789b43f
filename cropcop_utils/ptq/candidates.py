"""The predeclared quantisation candidates, the validation gate, the selection rule and the gate figure.

The candidates are declared in the profile's ``ptq`` section and written, with a fingerprint, to
``ptq/candidates.json`` before any model is quantised (:func:`declaration`).  Selection uses the
validation split only: a gate (maximum macro-F1 drop against the float model, minimum top-1 agreement
with it) passes or fails each candidate; passing candidates rank before failing ones, then higher
validation macro-F1 first; a tie on macro-F1 goes to the candidate with fewer calibration rows (the
simpler recipe, less data depended on), then to the earlier declared candidate.

Kept apart from the PT2E flow and the chapter: everything here is plain arithmetic on the declaration
and on validation scores, with no model in sight.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core.evidence import sha256_json

ACTIVATIONS = ("dynamic", "static")
SELECTION_RULE = ("gate passed first; then higher validation macro-F1; a macro-F1 tie goes to fewer "
                  "effective calibration rows, then to the earlier declared candidate")
# Macro-F1 values are compared at this many decimals, so float noise never breaks a true tie.
TIE_DECIMALS = 12
# The gate compares in points (percent) rounded to this many decimals: 0.87 - 0.86 is 1.0000000000000009
# points in floating point and must sit *on* a 1-point limit, while any real metric difference (at least
# 1 / rows, i.e. 1e-4 points even at a million rows) stays far above 1e-9 points.
GATE_DECIMALS = 9


class PTQConfigError(ValueError):
    """The profile's ``ptq`` section is missing or declares an invalid candidate or gate."""


# --------------------------------------------------------------------------- declaration
@dataclass(frozen=True)
class Candidate:
    """One predeclared quantisation recipe.  ``calibration_rows`` is the profile's (declared) count."""

    name: str
    activations: str          # "dynamic": activation ranges computed at run time; "static": calibrated
    per_channel: bool         # weights: one scale per output channel (True) or per tensor
    calibration_rows: int
    order: int                # position in the profile: the last tie-break
    # modules (attribute paths, e.g. ``conv_stem``) the quantizer leaves float32; the default profile
    # says what keeping the stem, which reads the raw pixels, float bought on validation
    float_modules: tuple[str, ...] = ()
    # ReLU6 (hardtanh 0..6) split into relu + hardtanh before annotation (:func:`.pt2e.split_relu6`):
    # XNNPACKQuantizer fuses conv (+ batch norm) + relu, not + hardtanh, so without it each conv's output
    # is quantised over its negative values too, which the clip then throws away
    fuse_relu6: bool = False

    @property
    def static(self) -> bool:
        return self.activations == "static"

    def effective_rows(self, n_train: int) -> int:
        """The declared count capped at the training split's size (small corpora scale down)."""
        return min(self.calibration_rows, int(n_train)) if self.static else 0


def parse_candidates(section: dict[str, Any]) -> list[Candidate]:
    """The candidates of a profile's ``ptq`` section, validated, in declared order."""
    declared = section.get("candidates")
    if not declared:
        raise PTQConfigError("the profile's ptq section declares no candidates (ptq.candidates): the "
                             "quantisation candidates must be declared before the chapter runs")
    candidates, seen = [], set()
    for order, entry in enumerate(declared):
        name = str(entry.get("name", ""))
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise PTQConfigError(f"ptq.candidates[{order}].name = {name!r}: use a-z, 0-9 and _ only")
        if name in seen:
            raise PTQConfigError(f"ptq.candidates: the name {name!r} is declared twice")
        seen.add(name)
        activations = entry.get("activations")
        if activations not in ACTIVATIONS:
            raise PTQConfigError(f"ptq candidate {name!r}: activations must be one of {ACTIVATIONS}, "
                                 f"got {activations!r}")
        rows = int(entry.get("calibration_rows", 0))
        if activations == "dynamic" and rows != 0:
            raise PTQConfigError(f"ptq candidate {name!r}: dynamic activations need no calibration rows, "
                                 f"got calibration_rows = {rows}")
        if activations == "static" and rows < 1:
            raise PTQConfigError(f"ptq candidate {name!r}: static activations need calibration_rows >= 1")
        fuse = entry.get("fuse_relu6", False)
        if not isinstance(fuse, bool):
            raise PTQConfigError(f"ptq candidate {name!r}: fuse_relu6 must be true or false, got {fuse!r}")
        candidates.append(Candidate(name, activations, bool(entry.get("per_channel", True)), rows, order,
                                    _float_modules(name, entry.get("float_modules")), fuse))
    return candidates


def _float_modules(name: str, declared: Any) -> tuple[str, ...]:
    if declared is None:
        return ()
    if isinstance(declared, str) or not all(isinstance(m, str) for m in declared):
        raise PTQConfigError(f"ptq candidate {name!r}: float_modules must be a list of module paths "
                             f"(e.g. [conv_stem, bn1]), got {declared!r}")
    bad = [m for m in declared if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", m)]
    if bad or len(set(declared)) != len(declared):
        raise PTQConfigError(f"ptq candidate {name!r}: float_modules {declared!r} must name distinct module "
                             "paths such as conv_stem or blocks.0")
    return tuple(declared)


@dataclass(frozen=True)
class Gate:
    """The validation gate: both criteria must hold.  Values are fractions (0.01 = 1 point).

    Both sides of each comparison are converted to points (percent) and rounded to ``points_decimals``
    first (:func:`gate_points`), so a drop equal to the limit up to floating-point noise is on the
    boundary, and the boundary passes.  The precision is part of the declared (fingerprinted) gate.
    """

    max_macro_f1_drop: float
    min_agreement: float
    points_decimals: int = GATE_DECIMALS

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> Gate:
        gate = section.get("gate") or {}
        missing = {"max_macro_f1_drop", "min_agreement"} - set(gate)
        if missing:
            raise PTQConfigError(f"ptq.gate lacks {sorted(missing)}; declare max_macro_f1_drop and "
                                 "min_agreement (fractions) in the profile")
        made = cls(float(gate["max_macro_f1_drop"]), float(gate["min_agreement"]))
        if made.max_macro_f1_drop < 0 or not 0.0 <= made.min_agreement <= 1.0:
            raise PTQConfigError(f"ptq.gate out of range: {made}")
        return made

    def verdict(self, macro_f1_drop: float, agreement: float) -> tuple[bool, str]:
        """(passed, why) for one candidate's validation drop and agreement."""
        drop, limit = f"{100 * macro_f1_drop:.2f} pt", f"{100 * self.max_macro_f1_drop:.2f} pt"
        agree, floor = f"{100 * agreement:.2f}%", f"{100 * self.min_agreement:.2f}%"
        decimals = self.points_decimals
        failures = []
        if gate_points(macro_f1_drop, decimals) > gate_points(self.max_macro_f1_drop, decimals):
            failures.append(f"macro-F1 drop {drop} > {limit}")
        if gate_points(agreement, decimals) < gate_points(self.min_agreement, decimals):
            failures.append(f"agreement {agree} < {floor}")
        if failures:
            return False, "fails: " + "; ".join(failures)
        return True, f"passes: macro-F1 drop {drop} ≤ {limit}, agreement {agree} ≥ {floor}"


def gate_points(fraction: float, decimals: int = GATE_DECIMALS) -> float:
    """A fraction in points (percent), rounded to the gate's declared precision."""
    return round(100.0 * float(fraction), int(decimals))


def macro_f1_drop(float_macro_f1: float, candidate_macro_f1: float) -> float:
    """How much macro-F1 a candidate loses against the float model (negative: it gains)."""
    return float(float_macro_f1) - float(candidate_macro_f1)


def declaration(candidates: Sequence[Candidate], gate: Gate, n_train: int, calibration_seed: int,
                max_batch: int) -> dict[str, Any]:
    """What ``ptq/candidates.json`` records: the declaration, its fingerprint, the effective counts.

    The fingerprint covers only what the profile declared (candidates, gate, rule, seed), so the same
    declaration on another corpus has the same fingerprint; effective counts are recorded beside it.
    """
    declared = {"candidates": [asdict(c) for c in candidates], "gate": asdict(gate),
                "selection_rule": SELECTION_RULE, "calibration_seed": int(calibration_seed),
                "calibration_split": "train", "max_batch": int(max_batch)}
    return {"fingerprint": sha256_json(declared), **declared, "n_train": int(n_train),
            "effective_calibration_rows": {c.name: c.effective_rows(n_train) for c in candidates}}


# --------------------------------------------------------------------------- gate and selection
def apply_gate(table: pd.DataFrame, gate: Gate) -> pd.DataFrame:
    """Add ``passed`` and ``verdict`` to a table with ``macro_f1_drop`` and ``agreement`` per candidate."""
    out = table.copy()
    verdicts = [gate.verdict(float(d), float(a)) for d, a in zip(out["macro_f1_drop"], out["agreement"],
                                                                 strict=True)]
    out["passed"] = [v[0] for v in verdicts]
    out["verdict"] = [v[1] for v in verdicts]
    return out


def rank_candidates(table: pd.DataFrame) -> pd.DataFrame:
    """Order by the selection rule; adds ``rank`` (1 = selected).

    Needs ``candidate``, ``passed``, ``macro_f1``, ``calibration_rows`` (effective) and ``order``.
    """
    if table.empty:
        raise ValueError("no candidates to rank")
    key = table.assign(_f1=table["macro_f1"].round(TIE_DECIMALS), _fail=~table["passed"].astype(bool))
    ranked = key.sort_values(["_fail", "_f1", "calibration_rows", "order"],
                             ascending=[True, False, True, True], kind="stable")
    ranked = ranked.drop(columns=["_f1", "_fail"]).reset_index(drop=True)
    ranked["rank"] = np.arange(1, len(ranked) + 1)
    return ranked


def select_candidate(table: pd.DataFrame) -> tuple[str, str]:
    """(selected candidate name, the reason in words) by :func:`rank_candidates`."""
    ranked = rank_candidates(table)
    best = ranked.iloc[0]
    group = ranked[ranked["passed"] == best["passed"]]
    f1 = f"validation macro-F1 {100 * best['macro_f1']:.2f}"
    if best["passed"]:
        reason = (f"{best['candidate']} passed the gate and has the highest {f1} of the {len(group)} "
                  f"passing candidate(s)")
    else:
        reason = (f"no candidate passed the gate; {best['candidate']} has the highest {f1} of all "
                  f"{len(ranked)} ({best['verdict']})")
    tied = group[(group["macro_f1"].round(TIE_DECIMALS) == round(float(best["macro_f1"]), TIE_DECIMALS))
                 & (group["candidate"] != best["candidate"])]
    if len(tied):
        reason += (f"; tied on macro-F1 with {', '.join(tied['candidate'])}, and the tie-break prefers fewer "
                   f"calibration rows ({int(best['calibration_rows'])}), then the declared order")
    return str(best["candidate"]), reason + "."


# --------------------------------------------------------------------------- figure
def plot_gate(table: pd.DataFrame, gate: Gate, selected: str) -> Figure:
    """Each candidate's validation macro-F1 drop against its agreement with the float model.  Candidates
    are drawn as their number in ``table``'s order and named in the legend: names written beside the points
    collided where candidates lie a few hundredths of a point apart (tomato book, three passing within
    0.11 points)."""
    fig = Figure(figsize=(8.4, 4.0), layout="constrained")
    ax = fig.subplots()
    drops = 100 * table["macro_f1_drop"].to_numpy(dtype=float)
    agree = 100 * table["agreement"].to_numpy(dtype=float)
    x_hi = max(float(drops.max(initial=0.0)), 100 * gate.max_macro_f1_drop) * 1.3 + 0.1
    y_lo = min(float(agree.min(initial=100.0)), 100 * gate.min_agreement) - 1.0
    x_lo = min(-0.1, float(drops.min(initial=0.0)) - 0.1)
    ax.fill_between([x_lo, 100 * gate.max_macro_f1_drop], 100 * gate.min_agreement, 100.5, color="tab:green",
                    alpha=0.08, lw=0)
    ax.axvline(100 * gate.max_macro_f1_drop, color="tab:green", ls="--", lw=1, label="gate")
    ax.axhline(100 * gate.min_agreement, color="tab:green", ls="--", lw=1)
    for k, (row, x, y) in enumerate(zip(table.itertuples(), drops, agree, strict=True), start=1):
        chosen = row.candidate == selected
        colour = "tab:red" if chosen else ("tab:blue" if row.passed else "tab:gray")
        ax.scatter([x], [y], s=160 if chosen else 110, marker=f"${k}$", color=colour, zorder=3,
                   label=f"{k} {row.candidate}" + (" (selected)" if chosen else ""))
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, 100.5)
    ax.set_xlabel("validation macro-F1 drop vs float (points)")
    ax.set_ylabel("top-1 agreement with float (%)")
    ax.set_title("Quantisation candidates against the validation gate (shaded: passes)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, title_fontsize=8,
              title="candidates (red: selected, blue: passes, grey: fails)")
    return fig
