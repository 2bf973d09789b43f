"""Chapter 11: calibration, abstention and out-of-scope inputs — a model that can say "I don't know".

For every model state (float reference, float compact, converted INT8 graph, the ``.pte``), from the
logits its prediction records hold:

1. calibration: one temperature fitted on validation only (scipy's bounded scalar minimiser of the
   validation NLL — a one-parameter fit needs no more); NLL, Brier and ECE before and after, on test;
2. selective prediction: risk–coverage curves and AURC on test for three confidence scores, and an
   abstention threshold chosen on validation for the profile's target risk, applied once to test;
3. split conformal prediction sets (``crepes``), calibrated on validation: coverage, set size,
   per-class coverage, marginal and class-conditional (Mondrian by label);
4. the field cohort of chapter 10, when the run has one, and out-of-scope images (not plants, and
   leaves of another crop): the share abstained and the rejection rate at the chosen threshold;
5. the deployment recipe for the ``.pte`` (temperature, score, threshold and what they did), under
   ``deployment`` in ``abstention/abstention.json``, which chapter 10's model card reads.

No model reads the locked test here: the test rows are the recorded predictions of chapters 5–7.
The ``.pte`` has no validation record, so its validation rows are scored here (validation is not the
locked test) and written to ``abstention/predictions_val_pte.parquet``.

This module holds the profile's ``abstention`` section over its defaults, :func:`run_chapter` (which
calls the topical modules for each state and writes ``abstention/``), the deployment recipe, and the
summary table and closing note the notebook renders; the statistics live in :mod:`.calibration`,
:mod:`.selective`, :mod:`.conformal`, :mod:`.field_cohort` and :mod:`.out_of_scope`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..card import render as card
from ..card.render import CARD
from ..core import metrics
from ..core.config import RunContext
from ..core.evidence import Chapter, read_registry
from ..core.model_states import STATE_LABELS, STATE_NAMES
from ..core.sources import is_field_train
from ..training import regimes
from . import program_outputs
from .calibration import calibration_block, fit_temperature, nll, probabilities
from .conformal import conformal_block
from .field_cohort import field_block, field_inputs, further_cohort_inputs
from .out_of_scope import out_of_scope_records, rejection_block
from .records import FOLDER, PTE_VAL, TEST_RECORDS, VAL_RECORDS, AbstentionInputError, aligned, int8_val_path
from .regimes import regime_states
from .selective import SCORE_LABELS, SCORES, confidence_scores, selective_block
from .shipped_recipe import measure_protection

DEFAULTS: dict[str, Any] = {
    "target_risk": 0.02, "score": "msp", "ece_bins": 15, "bootstrap": 1000, "seed": 0, "ci_level": 0.95,
    "conformal_levels": [0.90, 0.95], "min_class_support": 30, "curve_points": 200,
    "noise_images": 6, "out_of_scope_px": 128, "other_crop_data": None, "other_crop_images": 100,
    "photo_crops": 1, "texture_crops": 1, "near_out_of_scope_data": None, "near_target_kinds": [],
    "in_scope_coverage": 0.95, "knn_k": 10, "jigsaw_tiles": 4, "targets": {},
    "batch_size": 32,
}


def abstention_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """The profile's ``abstention`` section over the defaults, checked."""
    params = {**DEFAULTS, **ctx.section("abstention"), **options}
    if params["score"] not in SCORES:
        raise ValueError(f"abstention.score = {params['score']!r}; choose one of {', '.join(SCORES)}")
    if not 0.0 < float(params["target_risk"]) < 1.0:
        raise ValueError(f"abstention.target_risk = {params['target_risk']}; a share in (0, 1)")
    if not all(0.0 < float(level) < 1.0 for level in params["conformal_levels"]):
        raise ValueError(f"abstention.conformal_levels = {params['conformal_levels']}; shares in (0, 1)")
    return params


# --------------------------------------------------------------------------- chapter
def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Chapter 11 for every model state; writes ``abstention/`` and returns the chapter record."""
    from ..nets.states import load_states
    from ..split import load_frozen
    from . import figures

    params = abstention_params(ctx, **options)
    level = float(params["ci_level"])
    ch = Chapter(ctx.run_dir, "abstention")
    frozen = load_frozen(ch)
    n_classes = len(frozen.class_names)
    shipped = regimes.shipped(regimes.of_run(ctx))
    val_rows = regime_val_rows(frozen, shipped)
    test_rows = frozen.rows_for("test").sort_values("row_id").reset_index(drop=True)
    missing = [p for p in (*VAL_RECORDS.values(), "ptq/ptq.json", *TEST_RECORDS.values())
               if not ch.path(p).exists()]
    if missing:
        raise AbstentionInputError(f"chapter 'abstention' needs the records of chapters 5-7; missing from "
                                   f"{ch.run_dir}: {', '.join(missing)}. Run the chain through 07_runtime.")

    # the .pte has no validation record: score the validation rows here (validation is not the test)
    with ch.native_output():  # ExecuTorch's C++ log lines go to abstention/native.log, not the book
        loaded = load_states(ch, n_classes)
    batch = int(params["batch_size"])
    # one pass gives the .pte's validation record and its features (the program's second output)
    with ch.native_output():
        val_outputs, pte_val = program_outputs.score(loaded["pte"].forward, val_rows, ctx.source_roots,
                                                     ctx.section("image"), batch, "pte val")
    ch.write_parquet(PTE_VAL, pte_val)
    val_paths = {**VAL_RECORDS, "int8": int8_val_path(ch), "pte": PTE_VAL}
    val_y, test_y = val_rows["label"].to_numpy(), test_rows["label"].to_numpy()
    # field val rows, where the regime has them, calibrate the conformal sets of the field cohorts
    from_field = is_field_train(val_rows)
    field_val = from_field if from_field.any() else None
    val = {s: aligned(ch.read_parquet(val_paths[s]), val_rows, n_classes, val_paths[s]) for s in STATE_NAMES}
    test = {s: aligned(ch.read_parquet(TEST_RECORDS[s]), test_rows, n_classes, TEST_RECORDS[s])
            for s in STATE_NAMES}
    for state in STATE_NAMES:
        if val[state][1] != test[state][1]:
            raise AbstentionInputError(f"state {state}: the validation record ({val_paths[state]}) and the "
                                       f"test record ({TEST_RECORDS[state]}) come from different model files")

    out_of_scope, other_crop_note = out_of_scope_records(ctx, ch, frozen.class_map, loaded, params)
    field = field_inputs(ch, n_classes)
    further = further_cohort_inputs(ch, n_classes)
    indices = metrics.bootstrap_indices(len(test_y), int(params["bootstrap"]), int(params["seed"]))
    states, tables = {}, {k: [] for k in ("calibration", "reliability", "risk_coverage", "conformal_classes")}
    oos_scores, lab_scores = [], {}
    for state in STATE_NAMES:
        t = fit_temperature(val[state][0], val_y)
        calibration, bins = calibration_block(test[state][0], test_y, t, params, indices)
        selective, curves = selective_block((val[state][0], val_y), (test[state][0], test_y), t, params)
        val_prob, test_prob = probabilities(val[state][0], t), probabilities(test[state][0], t)
        conformal, per_class = conformal_block(val_prob, val_y, test_prob, test_y, params)
        threshold = selective[params["score"]]["choice"]["threshold"]
        lab_scores[state] = confidence_scores(test[state][0], t)[params["score"]]
        rejection = rejection_block(out_of_scope[state], t, threshold, params["score"], level)
        oos_scores.append(out_of_scope[state][["row_id", "rel_path", "source"]].assign(
            state=state, score=rejection.pop("scores"), threshold=threshold))
        states[state] = {
            "label": STATE_LABELS[state], "model_state": test[state][1], "temperature": t,
            "val_nll": {"before": nll(val[state][0], val_y), "after": nll(val[state][0], val_y, t)},
            "calibration": calibration, "selective": selective, "conformal": conformal,
            "field": (field_block(field["logits"][state], field["cohort"], t, threshold, val_prob, val_y,
                                  params, field_val) if field else None),
            # every further cohort under the same recipe (temperature and threshold fitted as above)
            "cohorts": {name: {"relation": c["relation"],
                               **field_block(c["logits"][state], c["cohort"], t, threshold, val_prob, val_y,
                                             params, field_val)}
                        for name, c in further.items()},
            "out_of_scope": rejection}
        tables["calibration"] += [{"state": state, "stage": stage, "ece_lo": c["ece_ci"][0],
                                   "ece_hi": c["ece_ci"][1], **{k: v for k, v in c.items() if k != "ece_ci"}}
                                  for stage, c in calibration.items()]
        tables["reliability"].append(bins.assign(state=state))
        tables["risk_coverage"].append(curves.assign(state=state))
        tables["conformal_classes"].append(per_class.assign(state=state))

    classes = pd.DataFrame({"label": range(n_classes), "class_name": frozen.class_names})
    frames = {"calibration": pd.DataFrame(tables["calibration"]),
              "reliability": pd.concat(tables["reliability"], ignore_index=True),
              "risk_coverage": pd.concat(tables["risk_coverage"], ignore_index=True),
              "conformal_classes": pd.concat(tables["conformal_classes"], ignore_index=True).merge(
                  classes, on="label").assign(small=lambda f: f["rows"] < int(params["min_class_support"])),
              "out_of_scope_scores": pd.concat(oos_scores, ignore_index=True)}
    for name, frame in frames.items():
        ch.write_parquet(f"{FOLDER}/{name}.parquet", frame)
    cohorts = {} if field is None else {ctx.field_cohorts[0].name: (field["cohort"], field["logits"]["pte"])}
    cohorts.update({name: (c["cohort"], c["logits"]["pte"]) for name, c in further.items()})
    with ch.native_output():
        protection = measure_protection(ctx, ch, frozen, shipped, loaded["pte"].forward, params,
                                        states["pte"]["temperature"], (val_rows, val_outputs), test_rows,
                                        ch.read_parquet(TEST_RECORDS["pte"]), out_of_scope["pte"], cohorts)
    plots = figures.save_all(ch, frames, states, params, lab_scores)
    plots["protection"] = figures.save_protection(ch, ch.read_parquet(protection["table"]), protection)
    others = _other_regimes(ctx, ch, params, frozen, test_rows, n_classes, indices, field,
                            out_of_scope["pte"])
    # the regimes that do not ship, under the same procedure: the card sets the lab-only one beside it
    recipe = {**deployment(states["pte"], params), "protection": protection_summary(protection),
              "other_regimes": {name: protection_summary(other["protection"])
                                for name, other in others.items() if other.get("protection")}}
    record = ch.finish(
        figures={"n_val": len(val_y), "n_test": len(test_y), "n_classes": n_classes,
                 "temperature_fit": "scipy.optimize.minimize_scalar (bounded) on the validation NLL",
                 "conformal_library": "crepes (split conformal, hinge non-conformity)",
                 "field_given": field is not None,
                 "field_note": None if field else "No field cohort was given to this run",
                 "out_of_scope_sources": out_of_scope["pte"]["source"].value_counts().sort_index().to_dict(),
                 "other_crop_note": other_crop_note,
                 "states": states, "protection": protection},
        plots=plots, params=params, deployment=recipe,
        regime=shipped.name, regimes=others,
        test_rows_read={"count": len(test_y), "via": "prediction records of chapters 5-7 (logits)",
                        "purpose": "calibration, selective risk and conformal coverage of every state"})
    if CARD in read_registry(ctx.run_dir):
        # The model card of chapter 10 gains the deployment recipe: rendered again from the run's JSON,
        # now with abstention/abstention.json in it (the registry names this chapter as its writer).
        card.write_card(ctx.run_dir, chapter="abstention")
    return record


def regime_val_rows(frozen: Any, regime: Any) -> pd.DataFrame:
    """The validation rows a regime was selected on (lab val, plus field val for a field-adapted one), in
    row_id order: its temperature and thresholds are fitted on them."""
    rows = frozen.rows_for("val", field_train=regime.uses_field_train)
    return rows.sort_values("row_id").reset_index(drop=True)


def _other_regimes(ctx: RunContext, ch: Chapter, params: dict[str, Any], frozen: Any,
                   test_rows: pd.DataFrame, n_classes: int, indices: np.ndarray,
                   field: dict[str, Any] | None, out_of_scope: pd.DataFrame) -> dict[str, Any]:
    """The regimes that do not ship, measured the same way (:mod:`.regimes`), each on its own val rows."""
    cohort = None if field is None else field["cohort"]
    return {r.name: regime_states(ctx, ch, r, params, regime_val_rows(frozen, r), test_rows, n_classes,
                                  indices, cohort, frozen, out_of_scope)
            for r in regimes.of_run(ctx) if not r.shipped}


def _share(name: str, share: dict[str, Any]) -> dict[str, Any]:
    out = {name: share["value"], f"{name}_ci": share["ci"]}
    return {**out, "reasons": {name: share["reason"]}} if share["value"] is None else out


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        reasons = {**merged.pop("reasons", {}), **part.get("reasons", {})}
        merged.update({k: v for k, v in part.items() if k != "reasons"})
        if reasons:
            merged["reasons"] = reasons
    return merged


def deployment(pte: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The recipe the .pte ships with, and what it did on lab test, field and out-of-scope inputs.

    Every number is computed from the .pte's own outputs.  A statistic without rows is null, and the
    block carrying it gains ``reasons`` (statistic → why).
    """
    selective = pte["selective"][params["score"]]
    test = selective["test"]
    field = pte["field"]
    oos = pte["out_of_scope"]
    return {
        "state": "pte", "model_state": pte["model_state"], "temperature": float(pte["temperature"]),
        "score": params["score"], "threshold": float(selective["choice"]["threshold"]),
        "target_risk": float(params["target_risk"]),
        "lab_test": _merge({"n": test["n"]}, _share("coverage", test["coverage"]),
                           _share("selective_risk", test["selective_risk"])),
        "field": None if field is None else _merge(
            {"n": field["n"]}, *(_share(k, field[k]) for k in ("abstained_share", "accuracy_accepted",
                                                               "accuracy_all"))),
        "out_of_scope": _merge({"n": oos["n"]}, _share("rejection_rate", oos["rejection_rate"])),
    }


def protection_summary(protection: dict[str, Any]) -> dict[str, Any]:
    """What the card needs of the protection block: the recipe, the chosen score's figures per set and
    the verdict against the profile's targets."""
    return {"recipe": protection["recipe"], "chosen": protection["chosen"],
            "chosen_label": protection["chosen_label"], "program": protection["program"],
            "fitted_on": protection["fitted_on"], "held_back": protection["held_back"],
            # per set, each share and its interval as the card's ``share`` filter reads them
            "figures": {name: {"kind": f["kind"], "n": f["n"],
                               **{k: v for m in ("coverage", "selective_accuracy", "rejected") if m in f
                                  for k, v in ((m, f[m]["value"]), (f"{m}_ci", f[m]["ci"]))}}
                        for name, f in protection["chosen_figures"].items()},
            "targets": protection["targets"],
            "verdict": protection["verdict"],
            # per validation set, what the recipe did there and whether any threshold could meet the targets
            "validation": {name: {**r, "coverage": r["coverage"]["value"],
                                  "selective_accuracy": r["selective_accuracy"]["value"]}
                           for name, r in (protection.get("validation") or {}).items()},
            # the chosen score in hindsight: could any thresholds read off the evaluated sets meet the targets
            "hindsight": {k: v for k, v in
                          (protection.get("hindsight") or {}).get(protection["chosen"], {}).items()
                          if k != "figures"}}


# --------------------------------------------------------------------------- tables and prose
def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f} %"


def _pct_ci(share: dict[str, Any]) -> str:
    if share["value"] is None:
        return f"n/a ({share['reason']})"
    return f"{_pct(share['value'])} [{_pct(share['ci'][0])}, {_pct(share['ci'][1])}]"


def summary_table(record: dict[str, Any]) -> pd.DataFrame:
    """One row per state: temperature, ECE, AURC and what the threshold did (lab, field, out of scope)."""
    score = record["params"]["score"]
    rows = []
    for s in record["figures"]["states"].values():
        chosen = s["selective"][score]
        conformal = s["conformal"]
        row = {"state": s["label"], "temperature": s["temperature"],
               "ece_before": s["calibration"]["before"]["ece"], "ece_after": s["calibration"]["after"]["ece"],
               "nll_before": s["calibration"]["before"]["nll"], "nll_after": s["calibration"]["after"]["nll"],
               **{f"aurc_{name}": s["selective"][name]["aurc"] for name in SCORES},
               "threshold": chosen["choice"]["threshold"], "coverage": chosen["test"]["coverage"]["value"],
               "selective_risk": chosen["test"]["selective_risk"]["value"],
               **{f"conformal_{k}": v["marginal"]["coverage"]["value"] for k, v in conformal.items()},
               "out_of_scope_rejected": s["out_of_scope"]["rejection_rate"]["value"]}
        if s["field"]:
            row.update({"field_abstained": s["field"]["abstained_share"]["value"],
                        "field_accuracy_accepted": s["field"]["accuracy_accepted"]["value"],
                        "field_accuracy_all": s["field"]["accuracy_all"]["value"]})
        rows.append(row)
    return pd.DataFrame(rows)


def closing_note(record: dict[str, Any]) -> str:
    """Markdown: per state, every headline number of the chapter, read from ``abstention.json``."""
    f, p = record["figures"], record["params"]
    score, level = p["score"], round(100 * float(p["ci_level"]))
    lines = [f"Temperatures were fitted on the {f['n_val']} validation rows; everything below is measured "
             f"on the {f['n_test']} locked test rows (recorded predictions) unless it says field or "
             f"out-of-scope. The threshold on the **{SCORE_LABELS[score]}** was chosen on validation for "
             f"a target risk of {_pct(float(p['target_risk']))}; intervals are {level} % (Wilson for shares, "
             "bootstrap for ECE).", ""]
    for s in f["states"].values():
        cal, chosen = s["calibration"], s["selective"][score]
        conformal = ", ".join(f"{k} % → {_pct(v['marginal']['coverage']['value'])} (mean set size "
                              f"{v['marginal']['mean_set_size']:.2f})" for k, v in s["conformal"].items())
        text = (f"- **{s['label']}** (T = {s['temperature']:.2f}): ECE {_pct(cal['before']['ece'])} → "
                f"{_pct(cal['after']['ece'])} [{_pct(cal['after']['ece_ci'][0])}, "
                f"{_pct(cal['after']['ece_ci'][1])}]; at the threshold, lab coverage "
                f"{_pct_ci(chosen['test']['coverage'])} with selective risk "
                f"{_pct_ci(chosen['test']['selective_risk'])}")
        if not chosen["choice"]["target_met_on_val"]:
            text += f" ({chosen['choice']['reason']})"
        text += f"; conformal coverage (lab, nominal → observed) {conformal}"
        if s["field"]:
            fc = ", ".join(f"{k} % → {_pct(v['coverage']['value'])}"
                           for k, v in s["field"]["conformal"].items())
            text += (f"; field: abstains on {_pct_ci(s['field']['abstained_share'])}, accuracy on the rest "
                     f"{_pct_ci(s['field']['accuracy_accepted'])} vs {_pct_ci(s['field']['accuracy_all'])} "
                     f"on all, conformal coverage {fc}")
        for name, c in (s.get("cohorts") or {}).items():
            text += (f"; cohort `{name}` ({c['relation']}): abstains on {_pct_ci(c['abstained_share'])}, "
                     f"accuracy on the rest {_pct_ci(c['accuracy_accepted'])} vs "
                     f"{_pct_ci(c['accuracy_all'])}")
        text += f"; out-of-scope images rejected: {_pct_ci(s['out_of_scope']['rejection_rate'])}."
        lines.append(text)
    lines.append("")
    lines.append(f["field_note"] + "." if f["field_note"] else
                 "The field cohort is chapter 10's primary one; its labels map field conditions to lab "
                 "classes." + (" Every further cohort is scored under the same temperature and threshold, "
                               "each on its own." if any(s.get("cohorts") for s in f["states"].values())
                               else ""))
    if f["other_crop_note"]:
        lines.append(f"No leaves of another crop were scored: {f['other_crop_note']}.")
    return "\n".join(lines)
