"""Chapter 10: field transfer and background reliance, for every model state, and the model card.

1. The field cohort (``--field``; the synthetic one for a synthetic run) is scanned under the corpus
   contract and scored zero-shot by every state (reference, compact, INT8 graph, .pte) loaded from its
   verified file (:mod:`cropcop_utils.nets.states`).  ``field/cohort.parquet`` and
   ``field/predictions_{state}.parquet`` (records with logits) are what later chapters read.
2. Accuracy, macro-F1, per-class recall, confusion and bootstrap intervals beside the same state's lab
   test result (its recorded test predictions); source labels mapped by symptom are reported apart.
3. Leaf masks of lab photos (:mod:`.masks`), with IoU against the synthetic true masks.
4. Where the models look (:mod:`.attribution`): Grad-CAM on the float models, occlusion on all four.
5. The background-swap benchmark (:mod:`.composites`, :mod:`.bench`): five cells, changed-prediction
   rates and the share of the lab-to-field gap that the background explains.
6. The model card (:mod:`cropcop_utils.card`), rendered from the run's JSON after this record is written.

Test rows: the lab side of the benchmark pastes leaves of locked test photos on other backgrounds, a
new look at the test split by every state; each read goes through :mod:`cropcop_utils.split.locked_test` and
is logged with its reason.  ``lab_plain`` reuses the recorded test predictions (nothing re-scored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.config import RunContext
from ..core.evidence import Chapter
from ..core.imaging import ImageSpec
from ..core.model_states import STATE_LABELS
from ..nets import states as state_models
from ..split import locked_test
from ..training import regimes
from ..training.regimes import BASELINE, Regime
from . import attribution as attr
from . import bench, cohorts, compare, figures
from . import composites as comp
from .looks import FLOAT_STATES, attribution_sets, measure_attribution
from .relatives import CROSS_GROUPS, CROSS_PAIRS, field_train_relatives
from .scores import cell_results, classification, confusion_long, field_results, lab_test_records
from .stats import mean_with_interval

FOLDER = "field"
# The profile section; ``field`` itself holds the --field cohort folder (config.open_run).
SECTION = "field_transfer"
COHORT = "field/cohort.parquet"
COHORT_COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label"]
DEFAULTS: dict[str, Any] = {
    "bootstrap": 1000,
    "seed": 0,
    "ci_level": 0.95,
    "batch_size": 32,
    "swap_n": 200,
    "min_gap": 0.01,
    "gradcam_images": 64,
    "gradcam_batch": 16,
    "gradcam_stage": -1,
    "occlusion_images": 16,
    "occlusion_window": 8,
    "occlusion_stride": 4,
    "occlusion_cells": ["lab_plain", "lab_field"],
    "mask_iou_target": 0.9,
    "gallery_n": 4,
    "failure_rules": {
        "collapse_ratio": 0.5,
        "background_share": 0.5,
        "off_leaf_mass": 0.5,
        "paste_changed_rate": 0.1,
    },
}
TEST_REASON = (
    "chapter 10 (field): leaves of locked test photos pasted on other backgrounds and scored "
    "by every state (background-swap benchmark, attribution); evaluation only, nothing is "
    "selected on it"
)


class FieldConfigError(ValueError):
    """The profile's ``field`` section holds an invalid value."""


def field_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    params = {**DEFAULTS, **ctx.section(SECTION), **options}
    for key in ("bootstrap", "batch_size", "swap_n", "occlusion_window", "occlusion_stride", "gradcam_batch"):
        if int(params[key]) < 1:
            raise FieldConfigError(f"field_transfer.{key} must be >= 1, got {params[key]}")
    # the INT8 graph's (and the .pte's) batch dimension is bounded by ptq.max_batch at export
    bound = int(ctx.section("ptq").get("max_batch", params["batch_size"]))
    if int(params["batch_size"]) > bound:
        raise FieldConfigError(
            f"field_transfer.batch_size {params['batch_size']} exceeds ptq.max_batch {bound}: the INT8 "
            "graph and the .pte accept no larger batch"
        )
    unknown = set(params["occlusion_cells"]) - set(comp.CELLS)
    if unknown:
        raise FieldConfigError(
            f"field_transfer.occlusion_cells {sorted(unknown)} are not cells; cells are {comp.CELLS}"
        )
    return params


# --------------------------------------------------------------------------- chapter
def read_lab_test(ctx: RunContext, states: dict[str, state_models.LoadedState]) -> tuple[pd.DataFrame, list]:
    """The locked test rows, read once per state through the locked-test door (each read logged)."""
    rows, accesses = None, []
    for name, state in states.items():
        earlier = locked_test.accesses_for(ctx.run_dir, state.sha256)
        rows = locked_test.read_test_rows(
            ctx.run_dir,
            state.sha256,
            reader="field",
            override=bool(earlier),
            reason=TEST_REASON if earlier else None,
        )
        accesses.append(
            {
                "state": name,
                "model_state": state.sha256,
                "access": len(earlier) + 1,
                "override": bool(earlier),
                "reason": TEST_REASON if earlier else None,
            }
        )
    return rows, accesses


def _mask_summary(table: pd.DataFrame, params: dict[str, Any], n_masked: int) -> dict[str, Any]:
    target = float(params["mask_iou_target"])
    base = {"method": "cropcop_utils.field.masks.leaf_mask", "n_estimated": n_masked, "target": target}
    iou = table["iou"].to_numpy(dtype=float)
    iou = iou[np.isfinite(iou)]
    if len(iou) == 0:
        return {
            **base,
            "iou": None,
            "reason": "no true leaf masks for these lab photos (a real corpus, or an older synthetic one): "
            "IoU cannot be measured; the gallery shows the estimated masks",
        }
    return {
        **base,
        "iou": mean_with_interval(
            iou, int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"]), "masks"
        ),
        "iou_median": float(np.median(iou)),
        "iou_min": float(iou.min()),
        "share_at_target": float((iou >= target).mean()),
        "meets_target": bool(iou.mean() >= target),
    }


def _scored_regime(
    ch: Chapter,
    regime: Regime,
    states: dict[str, state_models.LoadedState],
    bench_in: dict[str, Any],
    ctx: RunContext,
    params: dict[str, Any],
) -> dict[str, Any]:
    """Everything chapter 10 measures for one regime's four states, on the rows every regime shares."""
    names, cohort, root, lab, manifest = (bench_in[k] for k in ("names", "cohort", "root", "lab", "manifest"))
    at = regime.path
    lab_records = lab_test_records(ch, states, regime)
    preds = {s: lab_records[s].set_index("row_id")["pred"] for s in states}
    field_records = (
        state_models.score_rows(states, cohort, root, ctx.section("image"), int(params["batch_size"]))
        if cohort is not None and len(cohort)
        else None
    )
    results: dict[str, Any] = {}
    confusions = []
    for name in states:
        lab_y, lab_pred = lab_records[name]["label"].to_numpy(), lab_records[name]["pred"].to_numpy()
        matched = (
            np.isin(lab_y, cohort["label"].unique()) if cohort is not None else np.ones(len(lab_y), bool)
        )
        results[name] = {
            "label": STATE_LABELS[name],
            "model_state": states[name].sha256,
            "lab_test": classification(lab_y, lab_pred, names, params, per_class=False),
            "lab_test_matched": classification(lab_y[matched], lab_pred[matched], names, params),
            "field": None,
        }
        if field_records is not None:
            record = field_records[name]
            ch.write_parquet(at(f"field/predictions_{name}.parquet"), record)
            related = bench_in["relatives"]
            seen = None if related is None else related["trusted"] | related["near_miss"]
            results[name]["field"] = field_results(record, cohort, names, params, seen)
            confusions.append(confusion_long(record, names, name))
            preds[name] = pd.concat([preds[name], record.set_index("row_id")["pred"]])
    if confusions:
        ch.write_parquet(at("field/confusion.parquet"), pd.concat(confusions, ignore_index=True))
    swap_records = (
        state_models.score_rows(
            states, manifest, ctx.run_dir / bench.COMPOSITES, ctx.section("image"), int(params["batch_size"])
        )
        if len(manifest)
        else {}
    )
    for name, record in swap_records.items():
        record = record.merge(manifest[["row_id", "cell", "source_row_id"]], on="row_id")
        ch.write_parquet(at(f"field/swap_predictions_{name}.parquet"), record)
        preds[name] = pd.concat([preds[name], record.set_index("row_id")["pred"]])
    cells = bench.cell_frames(lab_records, lab.rows, field_records, swap_records, manifest)
    swap = {name: cell_results(cells[name], params) for name in states}
    masses: dict[tuple[str, str, str], np.ndarray] = {}
    looks, gallery = measure_attribution(states, bench_in["sets"], preds, bench_in["spec"], params, masses)
    return {
        "results": results,
        "swap": swap,
        "looks": looks,
        "gallery": gallery,
        "confusions": confusions,
        "lab_records": lab_records,
        "field_records": field_records,
        "cells": cells,
        "masses": masses,
    }


def compare_regimes(
    measured: dict[str, dict[str, Any]], n_classes: int, params: dict[str, Any]
) -> dict[str, Any]:
    """Every regime against the baseline, state by state, on the same rows (paired intervals)."""
    if BASELINE not in measured or len(measured) < 2:
        return {}
    base = measured[BASELINE]
    out: dict[str, Any] = {}
    for name, other in measured.items():
        if name == BASELINE:
            continue
        per_state: dict[str, Any] = {}
        attribution = compare.attribution_change(base["masses"], other["masses"], params)
        for state in other["results"]:
            per_state[state] = {
                "lab_test": compare.classification_change(
                    base["lab_records"][state], other["lab_records"][state], n_classes, params
                ),
                "field": None
                if other["field_records"] is None
                else compare.classification_change(
                    base["field_records"][state], other["field_records"][state], n_classes, params
                ),
                "cells": compare.cells_change(base["cells"][state], other["cells"][state], params),
                "background_share": compare.share_change(base["cells"][state], other["cells"][state], params),
                "off_leaf": {method: by_state.get(state, {}) for method, by_state in attribution.items()},
            }
        out[name] = {"against": BASELINE, "states": per_state}
    return out


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Score the field cohort with every state of every regime, measure where the models look, run the
    background swap; with several regimes, compare each with the baseline on the same rows."""
    from ..split import load_frozen
    from .cohort import NOT_SAMPLED, field_root, sample_fraction, scan_field

    params = field_params(ctx, **options)
    ch = Chapter(ctx.run_dir, "field")
    frozen = load_frozen(ch)
    names = frozen.class_names
    spec = ImageSpec.from_section(ctx.section("image"))
    items = regimes.of_run(ctx)
    shipped = regimes.shipped(items)
    with ch.native_output():  # ExecuTorch's C++ log lines go to field/native.log, not the book
        loaded = {r.name: state_models.load_states(ch, len(names), regime=r) for r in items}

    root = field_root(ctx)
    cohort = None
    scan_summary: dict[str, Any] | None = None
    if root is not None:
        scan = scan_field(root, names, max_image_pixels=ctx.section("corpus").get("max_image_pixels"),
                          sample_fraction=sample_fraction(ctx))
        cohort, scan_summary = scan.rows, scan.summary
        ch.write_parquet(COHORT, cohort[COHORT_COLUMNS])
        ch.write_parquet("field/quarantine.parquet", scan.quarantine)
        if scan.summary["sample"]["fraction"] is not None:
            ch.write_parquet(NOT_SAMPLED, scan.not_sampled)

    # the lab side of the benchmark, shared by every regime: a sample of the locked test, its masks,
    # donors from train, the composites
    accesses: dict[str, list] = {}
    test_rows = None
    for r in items:
        test_rows, accesses[r.name] = read_lab_test(ctx, loaded[r.name])
    lab = bench.estimate_masks(
        bench.LeafSet(
            bench.sample_rows(test_rows, int(params["swap_n"]), int(params["seed"])), Path(ctx.corpus_root)
        )
    )
    iou = bench.mask_iou_table(ctx.run_dir, lab)
    ch.write_parquet("field/mask_iou.parquet", iou)
    donors = bench.LeafSet(frozen.rows_for("train"), Path(ctx.corpus_root))
    manifest = bench.build(ch, lab, cohort, root, donors, int(params["seed"]))
    ch.write_parquet("field/composites.parquet", manifest)
    relatives = field_train_relatives(ch, ctx) if cohort is not None else None
    bench_in = {
        "names": names,
        "cohort": cohort,
        "relatives": relatives,
        "root": root,
        "lab": lab,
        "manifest": manifest,
        "spec": spec,
        "sets": attribution_sets(ctx, lab, manifest, cohort, root),
    }
    measured = {r.name: _scored_regime(ch, r, loaded[r.name], bench_in, ctx, params) for r in items}
    mine = measured[shipped.name]
    results, swap, looks = mine["results"], mine["swap"], mine["looks"]
    grid = attr.gradcam_grid(loaded[shipped.name]["compact"].module, spec.size, int(params["gradcam_stage"]))

    plots = figures.save_figures(
        ch, results, swap, lab, iou, manifest, cohort, root, mine["gallery"], mine["confusions"], names
    )
    comparison = compare_regimes(measured, len(names), params)
    if comparison:
        plots.update(
            figures.save_regime_figure(ch, comparison, {name: m["gallery"] for name, m in measured.items()})
        )
    scored = _cohorts(ch, ctx, items, loaded, measured, names, params, scan_summary, relatives)
    if len(scored) > 1:
        plots.update(_save_cohort_figure(ch, scored, measured))
    summary = headline_figures(results, swap, looks)
    record = ch.finish(
        figures=summary,
        plots=plots,
        params=params,
        status="measured" if cohort is not None else "no_field_cohort",
        reason=None
        if cohort is not None
        else (
            "this run has no field cohort (`--field` not given with a real corpus): nothing is known about "
            "these models outside the lab; the lab-side measurements below still ran"
        ),
        field_root=None if root is None else str(root),
        cohort=scan_summary,
        field_train=None if relatives is None else {
            "folder": str(ctx.field_train_root),
            "cohort_photos_with_relative": len(relatives["trusted"] | relatives["near_miss"]),
            "trusted_relative": len(relatives["trusted"]),
            "near_miss_relative": len(relatives["near_miss"]),
            "evidence": f"{CROSS_GROUPS} (a leakage group holding a field-train photo) and {CROSS_PAIRS} "
            "(the review list's rejected but close pairs with a field-train photo)",
        },
        states=results,
        cohorts=scored,
        masks=_mask_summary(iou, params, len(lab.rows)),
        attribution={
            "methods": {
                "gradcam": {
                    "states": list(FLOAT_STATES),
                    "package": "grad-cam (pytorch-grad-cam)",
                    "stage": int(params["gradcam_stage"]),
                    "grid": grid,
                    "target": "the state's predicted class",
                },
                "occlusion": {
                    "states": list(loaded[shipped.name]),
                    "package": "captum (Occlusion)",
                    "window": int(params["occlusion_window"]),
                    "stride": int(params["occlusion_stride"]),
                    "cells": list(params["occlusion_cells"]),
                    "why": "the INT8 graph and the .pte expose neither gradients nor layers to hook; "
                    "occlusion only calls the forward function, so it measures all four states "
                    "by one method",
                },
            },
            **looks,
        },
        swap={
            "cells_described": comp.describe_cells(),
            "n": {c: int((manifest["cell"] == c).sum()) for c in comp.COMPOSITE_CELLS},
            "states": swap,
        },
        test_access=accesses[shipped.name],
        regime=shipped.name,
        regimes={
            r.name: {
                "shipped": r.shipped,
                "files": r.path("field/predictions_pte.parquet").rsplit("/", 1)[0],
                "figures": headline_figures(
                    measured[r.name]["results"], measured[r.name]["swap"], measured[r.name]["looks"]
                ),
                "states": measured[r.name]["results"],
                "swap": measured[r.name]["swap"],
                "attribution": measured[r.name]["looks"],
                "test_access": accesses[r.name],
            }
            for r in items
        },
        comparison=comparison,
        classes=names,
        image=ctx.section("image"),
    )
    # what labelled field photos buy: its own record (field/curve.json), after this chapter's
    from .curve import run_curve

    run_curve(ctx, progress=bool(options.get("progress", False)))
    from ..card import render as card

    card.write_card(ctx.run_dir)
    return record


def _cohorts(ch: Chapter, ctx: RunContext, items: list[Regime], loaded: dict[str, Any],
             measured: dict[str, Any], names: list[str], params: dict[str, Any],
             summary: dict[str, Any] | None, relatives: dict[str, set[str]] | None) -> list[dict[str, Any]]:
    """Every scored cohort (``field.json``'s ``cohorts``): the primary one from the measurements above,
    each further one scanned and scored here (:mod:`.cohorts`)."""
    if not ctx.field_cohorts or summary is None:
        return []
    primary = cohorts.cohort_entry(
        ctx, ctx.field_cohorts[0], summary, relatives,
        {r.name: {s: e["field"] for s, e in measured[r.name]["results"].items()} for r in items}, "field/")
    return [primary, *cohorts.score_further_cohorts(ch, ctx, items, loaded, names, params)]


def _save_cohort_figure(ch: Chapter, scored: list[dict[str, Any]],
                        measured: dict[str, Any]) -> dict[str, str]:
    table = pd.concat([cohorts.cohort_table(scored, regime).assign(regime=regime) for regime in measured],
                      ignore_index=True)
    ch.write_parquet("field/cohorts.parquet", table)
    lab = {regime: {s: e["lab_test"]["accuracy"] for s, e in m["results"].items()}
           for regime, m in measured.items()}
    ch.save_figure(figures.plot_cohorts(table, lab), "field/cohorts.png", dpi=110)
    return {"cohorts": "field/cohorts.png"}


def headline_figures(results: dict[str, Any], swap: dict[str, Any], looks: dict[str, Any]) -> dict[str, Any]:
    """Flat numbers for the evidence summary: per state lab and field accuracy, share, off-leaf mass."""
    out: dict[str, Any] = {}
    for name, entry in results.items():
        out[f"{name}_lab_accuracy"] = entry["lab_test_matched"]["accuracy"]["value"]
        out[f"{name}_field_accuracy"] = entry["field"]["accuracy"]["value"] if entry["field"] else None
        out[f"{name}_background_share"] = swap[name]["background_share"]["value"]
        occluded = looks["occlusion"].get(name, {}).get("lab_plain")
        out[f"{name}_off_leaf_occlusion_lab"] = occluded["value"] if occluded else None
    for name in FLOAT_STATES:
        cam = looks["gradcam"].get(name, {}).get("lab_plain")
        out[f"{name}_off_leaf_gradcam_lab"] = cam["value"] if cam else None
    return out
