"""Chapter 11 for the regimes that do not ship: calibration, selective risk and field abstention of each
of their states, measured as chapter 11 measures the shipped regime, so the book sets them side by side.

The other regime's ``.pte`` has no validation record either: its validation rows are scored here and
written under ``abstention/<regime>/``.  Everything else is read from the regime's own records
(:mod:`cropcop_utils.training.regimes` paths): validation and test predictions of chapters 5-7, field
predictions of chapter 10.  The statistics are the topical modules' (:mod:`.calibration`,
:mod:`.selective`, :mod:`.field_cohort`, :mod:`.records`), not the chapter's, so nothing imports in a circle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core.evidence import Chapter, read_registry
from ..core.model_states import STATE_LABELS, STATE_NAMES, states_for
from . import program_outputs
from .calibration import calibration_block, fit_temperature, probabilities
from .field_cohort import field_block
from .records import FOLDER, PTE_VAL, VAL_RECORDS, AbstentionInputError, aligned
from .selective import selective_block
from .shipped_recipe import measure_protection


def _records(ctx: Any, ch: Chapter, regime: Any, params: dict[str, Any], val_rows: pd.DataFrame,
             n_classes: int) -> tuple[dict[str, str], Any, Any]:
    """(state → validation record path of the regime, its .pte's outputs on them, the loaded .pte): the
    .pte's validation rows are scored here, with its features, in one pass."""
    from ..nets.states import load_state

    with ch.native_output(regime.path(f"{FOLDER}/native.log")):
        pte = load_state(ch, "pte", n_classes, regime)
        val_out, record = program_outputs.score(pte.forward, val_rows, ctx.source_roots,
                                                ctx.section("image"), int(params["batch_size"]),
                                                f"{regime.name} pte val")
    ch.write_parquet(regime.path(PTE_VAL), record)
    selected = ch.read_json(regime.path("ptq/ptq.json"))["selected"]
    return ({**{s: regime.path(p) for s, p in VAL_RECORDS.items()},
             "int8": regime.path(f"ptq/predictions_val_{selected}.parquet"), "pte": regime.path(PTE_VAL)},
            val_out, pte.forward)


def regime_states(ctx: Any, ch: Chapter, regime: Any, params: dict[str, Any], val_rows: pd.DataFrame,
                  test_rows: pd.DataFrame, n_classes: int, indices: np.ndarray,
                  cohort: pd.DataFrame | None, frozen: Any = None,
                  out_of_scope: pd.DataFrame | None = None) -> dict[str, Any]:
    """``{"states": state → temperature, calibration, selective risk (the profile's score) and field
    abstention, "protection": the same protection measurement as the shipped .pte's (None without
    ``frozen`` and ``out_of_scope``)}``."""
    val_paths, val_out, forward = _records(ctx, ch, regime, params, val_rows, n_classes)
    test_paths = {s.name: s.path for s in states_for(regime)}
    registry = read_registry(ch.run_dir)
    val_y, test_y = val_rows["label"].to_numpy(), test_rows["label"].to_numpy()
    out = {}
    for state in STATE_NAMES:
        val_logits, val_sha = aligned(ch.read_parquet(val_paths[state]), val_rows, n_classes,
                                      val_paths[state])
        test_logits, test_sha = aligned(ch.read_parquet(test_paths[state]), test_rows, n_classes,
                                        test_paths[state])
        if val_sha != test_sha:
            raise AbstentionInputError(f"regime {regime.name}, state {state}: validation and test records "
                                       "come from different model files")
        t = fit_temperature(val_logits, val_y)
        calibration, _ = calibration_block(test_logits, test_y, t, params, indices)
        selective, _ = selective_block((val_logits, val_y), (test_logits, test_y), t, params)
        field_path = regime.path(f"field/predictions_{state}.parquet")
        field = None
        if cohort is not None and field_path in registry:
            field_logits = aligned(ch.read_parquet(field_path), cohort, n_classes, field_path)[0]
            threshold = selective[params["score"]]["choice"]["threshold"]
            field = field_block(field_logits, cohort, t, threshold, probabilities(val_logits, t), val_y,
                                params)
        out[state] = {"label": STATE_LABELS[state], "model_state": test_sha, "temperature": t,
                      "calibration": calibration, "selective": selective, "field": field}
    protection = None
    if frozen is not None and out_of_scope is not None:
        cohorts = {}
        field_path = regime.path("field/predictions_pte.parquet")
        if cohort is not None and field_path in registry:
            logits = aligned(ch.read_parquet(field_path), cohort, n_classes, field_path)[0]
            cohorts[ctx.field_cohorts[0].name] = (cohort, logits)
        with ch.native_output(regime.path(f"{FOLDER}/native.log")):
            protection = measure_protection(ctx, ch, frozen, regime, forward, params,
                                            out["pte"]["temperature"], (val_rows, val_out), test_rows,
                                            ch.read_parquet(test_paths["pte"]), out_of_scope, cohorts,
                                            recorded_out_of_scope=False)
    return {"states": out, "protection": protection}


def side_by_side(record: dict[str, Any]) -> pd.DataFrame:
    """One row per regime and state: ECE after scaling, AURC, lab coverage and risk at the threshold,
    field abstention and accuracy on what is accepted (each share with its interval)."""
    score = record["params"]["score"]
    regimes = {record.get("regime", "baseline"): record["figures"]["states"], **{
        name: entry["states"] for name, entry in (record.get("regimes") or {}).items()}}
    rows = []
    for name, states in regimes.items():
        for state, s in states.items():
            chosen = s["selective"][score]
            after = s["calibration"]["after"]
            row = {"regime": name, "shipped": name == record.get("regime", "baseline"), "state": state,
                   "temperature": s["temperature"], "ece_after": after["ece"], "ece_lo": after["ece_ci"][0],
                   "ece_hi": after["ece_ci"][1], "aurc": chosen["aurc"],
                   "lab_coverage": chosen["test"]["coverage"]["value"],
                   "lab_selective_risk": chosen["test"]["selective_risk"]["value"]}
            field = s.get("field")
            for key in ("abstained_share", "accuracy_accepted", "accuracy_all"):
                share = (field or {}).get(key) or {}
                ci = share.get("ci") or [None, None]
                row.update({f"field_{key}": share.get("value"), f"field_{key}_lo": ci[0],
                            f"field_{key}_hi": ci[1]})
            rows.append(row)
    return pd.DataFrame(rows)
