"""Chapter 10: field transfer and background reliance, for every model state, and the model card.

1. The field cohort (``--field``; the synthetic one for a synthetic run) is scanned under the corpus
   contract and scored zero-shot by every state (reference, compact, INT8 graph, .pte) loaded from its
   verified file (:mod:`cropcop_utils.state_models`).  ``field/cohort.parquet`` and
   ``field/predictions_{state}.parquet`` (records with logits) are what later chapters read.
2. Accuracy, macro-F1, per-class recall, confusion and bootstrap intervals beside the same state's lab
   test result (its recorded test predictions); source labels mapped by symptom are reported apart.
3. Leaf masks of lab photos (:mod:`.masks`), with IoU against the synthetic true masks.
4. Where the models look (:mod:`.attribution`): Grad-CAM on the float models, occlusion on all four.
5. The background-swap benchmark (:mod:`.composites`, :mod:`.bench`): five cells, changed-prediction
   rates and the share of the lab-to-field gap that the background explains.
6. The model card (:mod:`cropcop_utils.card`), rendered from the run's JSON after this record is written.

Test rows: the lab side of the benchmark pastes leaves of locked test photos on other backgrounds, a
new look at the test split by every state; each read goes through :mod:`cropcop_utils.locked_test` and
is logged with its reason.  ``lab_plain`` reuses the recorded test predictions (nothing re-scored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import locked_test, metrics, state_models
from ..config import RunContext
from ..evidence import Chapter, FingerprintMismatch
from ..imaging import ImageSpec
from ..model_states import STATE_LABELS, STATES
from . import attribution as attr
from . import bench, figures
from . import composites as comp
from .stats import interval_record, mean_with_interval, resampled_means

FOLDER = "field"
COHORT = "field/cohort.parquet"
COHORT_COLUMNS = ["row_id", "rel_path", "class_name", "label", "source_label"]
FLOAT_STATES = ("reference", "compact")
DEFAULTS: dict[str, Any] = {
    "bootstrap": 1000, "seed": 0, "ci_level": 0.95, "batch_size": 32, "swap_n": 200, "min_gap": 0.01,
    "gradcam_images": 64, "gradcam_batch": 16, "gradcam_stage": -1, "occlusion_images": 16,
    "occlusion_window": 8, "occlusion_stride": 4, "occlusion_cells": ["lab_plain", "lab_field"],
    "mask_iou_target": 0.9, "gallery_n": 4,
    "failure_rules": {"collapse_ratio": 0.5, "background_share": 0.5, "off_leaf_mass": 0.5,
                      "paste_changed_rate": 0.1},
}
TEST_REASON = ("chapter 10 (field): leaves of locked test photos pasted on other backgrounds and scored "
               "by every state (background-swap benchmark, attribution); evaluation only, nothing is "
               "selected on it")


class FieldConfigError(ValueError):
    """The profile's ``field`` section holds an invalid value."""


def field_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    params = {**DEFAULTS, **ctx.section("field"), **options}
    for key in ("bootstrap", "batch_size", "swap_n", "occlusion_window", "occlusion_stride", "gradcam_batch"):
        if int(params[key]) < 1:
            raise FieldConfigError(f"field.{key} must be >= 1, got {params[key]}")
    unknown = set(params["occlusion_cells"]) - set(comp.CELLS)
    if unknown:
        raise FieldConfigError(f"field.occlusion_cells {sorted(unknown)} are not cells; cells are {comp.CELLS}")
    return params


# --------------------------------------------------------------------------- scores
def classification(y: np.ndarray, pred: np.ndarray, class_names: list[str], params: dict[str, Any],
                   per_class: bool = True) -> dict[str, Any]:
    """Accuracy and macro-F1 (over the classes with rows) with intervals; per-class recall."""
    level, n = float(params["ci_level"]), len(y)
    if n == 0:
        return {"n": 0, "accuracy": interval_record(None, None, level, 0),
                "macro_f1": interval_record(None, None, level, 0)}
    scored = np.unique(y)
    indices = metrics.bootstrap_indices(n, int(params["bootstrap"]), int(params["seed"]))
    boot = metrics.bootstrap_metrics(y, pred, scored, len(class_names), indices)
    out: dict[str, Any] = {"n": n, **{m: interval_record(boot.point[m], boot.resampled[m], level, n)
                                      for m in ("accuracy", "macro_f1")}}
    if per_class:
        scores = metrics.per_class_scores(y, pred, len(class_names))
        out["per_class_recall"] = {
            class_names[k]: interval_record(float(scores["recall"][k]), boot.class_recall[:, k], level,
                                            int(scores["support"][k])) for k in scored}
    return out


def lab_test_records(ch: Chapter, states: dict[str, state_models.LoadedState]) -> dict[str, pd.DataFrame]:
    """Each state's recorded test predictions, proven to come from the file that was loaded."""
    records = {}
    for state in STATES:
        frame = ch.read_parquet(state.path)
        if len(frame) and (frame["model_state"] != states[state.name].sha256).any():
            raise FingerprintMismatch(f"{state.path} was not written by the {state.label} now in the run "
                                      f"(model_state differs); rerun chapter '{state.chapter}'")
        records[state.name] = frame
    return records


def field_results(record: pd.DataFrame, cohort: pd.DataFrame, class_names: list[str],
                  params: dict[str, Any]) -> dict[str, Any]:
    """Zero-shot results on the cohort: all rows, rows labelled directly, each symptom-mapped source."""
    rows = cohort.set_index("row_id").loc[record["row_id"]]
    y, pred = record["label"].to_numpy(), record["pred"].to_numpy()
    out = classification(y, pred, class_names, params)
    direct = (rows["source_label"] == rows["class_name"]).to_numpy()
    out["direct_labels"] = classification(y[direct], pred[direct], class_names, params, per_class=False)
    out["by_source_label"] = {}
    mapped = rows[~direct]
    for source, group in mapped.groupby("source_label"):
        keep = np.isin(record["row_id"].to_numpy(), group.index.to_numpy())
        correct = (pred[keep] == y[keep]).astype(float)
        out["by_source_label"][str(source)] = {
            "class_name": str(group["class_name"].iloc[0]), "mapping": "by symptom",
            "accuracy": mean_with_interval(correct, int(params["bootstrap"]), int(params["seed"]),
                                           float(params["ci_level"]), "rows")}
    return out


def confusion_long(record: pd.DataFrame, class_names: list[str], state: str) -> pd.DataFrame:
    from sklearn.metrics import confusion_matrix

    matrix = confusion_matrix(record["label"], record["pred"], labels=list(range(len(class_names))))
    true, predicted = np.nonzero(matrix)
    return pd.DataFrame({"state": state, "true": [class_names[i] for i in true],
                         "predicted": [class_names[j] for j in predicted], "count": matrix[true, predicted]})


# --------------------------------------------------------------------------- background swap
def cell_results(cells: dict[str, pd.DataFrame], params: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per cell, changed-prediction rates against the partner cell, and the background share."""
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    out: dict[str, Any] = {"cells": {}, "changed": {}}
    for cell in comp.CELLS:
        frame = cells.get(cell)
        if frame is None or len(frame) == 0:
            out["cells"][cell] = None
            continue
        correct = (frame["pred"] == frame["label"]).to_numpy(float)
        out["cells"][cell] = {"n": len(frame), "accuracy": mean_with_interval(correct, n_boot, seed, level)}
    for cell, partner in comp.PAIRED_WITH.items():
        if cells.get(cell) is None or cells.get(partner) is None or not len(cells[cell]):
            out["changed"][cell] = None
            continue
        joined = cells[cell].merge(cells[partner], on="source_row_id", suffixes=("", "_partner"))
        changed = (joined["pred"] != joined["pred_partner"]).to_numpy(float)
        out["changed"][cell] = {"against": partner, "n": len(joined),
                                "rate": mean_with_interval(changed, n_boot, seed, level)}
    out["background_share"] = share_record(cells, params)
    return out


def share_record(cells: dict[str, pd.DataFrame], params: dict[str, Any]) -> dict[str, Any]:
    """(lab_plain − lab_field) / (lab_plain − field_field) with a bootstrap interval.

    lab_plain and lab_field are the same leaves: they are resampled together; field_field apart.
    """
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    min_gap = float(params["min_gap"])
    needed = [c for c in ("lab_plain", "lab_field", "field_field") if cells.get(c) is None or not len(cells[c])]
    if needed:
        return {"value": None, "lo": None, "hi": None, "reason": f"cell(s) {needed} have no rows",
                "undefined_resamples": None}
    paired = cells["lab_plain"].merge(cells["lab_field"], on="source_row_id", suffixes=("_plain", "_field"))
    plain = (paired["pred_plain"] == paired["label_plain"]).to_numpy(float)
    swapped = (paired["pred_field"] == paired["label_field"]).to_numpy(float)
    field = (cells["field_field"]["pred"] == cells["field_field"]["label"]).to_numpy(float)
    value, reason = comp.background_share(plain.mean(), swapped.mean(), field.mean(), min_gap)
    indices = metrics.bootstrap_indices(len(plain), n_boot, seed)
    resampled = comp.background_share_resampled(plain[indices].mean(1), swapped[indices].mean(1),
                                                resampled_means(field, n_boot, seed + 1), min_gap)
    undefined = int(np.isnan(resampled).sum())
    if value is None:
        return {"value": None, "lo": None, "hi": None, "reason": reason, "undefined_resamples": undefined}
    record = interval_record(value, resampled, level, len(plain))
    return {"value": record["value"], "lo": record["lo"], "hi": record["hi"], "reason": None,
            "undefined_resamples": undefined, "n_lab": len(plain), "n_field": len(field),
            "gap": float(plain.mean() - field.mean())}


# --------------------------------------------------------------------------- attribution over the cells
def attribution_sets(ctx: RunContext, lab: bench.LeafSet, manifest: pd.DataFrame, field_rows: pd.DataFrame | None,
                     field_root: Path | None) -> dict[str, list[dict[str, Any]]]:
    """cell → items (key = the row_id its prediction is recorded under, path, native leaf mask)."""
    from .masks import load_mask

    composites_root = ctx.run_dir / bench.COMPOSITES
    sets: dict[str, list[dict[str, Any]]] = {"lab_plain": [
        {"key": r.row_id, "path": lab.root / r.rel_path, "mask": lab.masks[r.row_id]} for r in lab.rows.itertuples()]}
    field_masks: dict[str, np.ndarray] = {}
    if field_rows is not None and field_root is not None:
        for r in field_rows[field_rows["mask_rel_path"].notna()].itertuples():
            field_masks[r.row_id] = np.asarray(load_mask(field_root / r.mask_rel_path), dtype=bool)
        sets["field_field"] = [{"key": r.row_id, "path": field_root / r.rel_path, "mask": field_masks[r.row_id]}
                               for r in field_rows.itertuples() if r.row_id in field_masks]
    for cell, group in manifest.groupby("cell"):
        items = []
        for r in group.itertuples():
            mask = lab.masks.get(r.source_row_id) if cell != "field_plain" else field_masks.get(r.source_row_id)
            if mask is not None:
                items.append({"key": r.row_id, "path": composites_root / r.rel_path, "mask": mask})
        sets[str(cell)] = items
    return {cell: items for cell, items in sets.items() if items}


def _tensors(items: list[dict[str, Any]], spec: ImageSpec) -> tuple[Any, list[np.ndarray]]:
    import torch

    images = torch.stack([spec.load_tensor(item["path"]) for item in items])
    masks = [attr.mask_on_model_grid(item["mask"], spec.size) for item in items]
    return images, masks


def measure_attribution(states: dict[str, state_models.LoadedState], sets: dict[str, list[dict[str, Any]]],
                        preds: dict[str, pd.Series], spec: ImageSpec, params: dict[str, Any]
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Off-leaf mass per method, state and cell (mean with interval); gallery items on the side."""
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    result: dict[str, Any] = {"gradcam": {}, "occlusion": {}}
    gallery: list[dict[str, Any]] = []
    per_cell = int(params["gallery_n"])
    for method, names, limit, cells in (
            ("gradcam", FLOAT_STATES, int(params["gradcam_images"]), list(sets)),
            ("occlusion", tuple(states), int(params["occlusion_images"]), list(params["occlusion_cells"]))):
        for name in names:
            state = states[name]
            result[method][name] = {}
            for cell in cells:
                items = sets.get(cell, [])[:limit]
                if not items:
                    result[method][name][cell] = None
                    continue
                images, masks = _tensors(items, spec)
                targets = [int(preds[name][item["key"]]) for item in items]
                if method == "gradcam":
                    maps = attr.gradcam(state.module, images, targets, int(params["gradcam_stage"]),
                                        int(params["gradcam_batch"]))
                else:
                    maps = attr.occlusion(state.forward, images, targets, int(params["occlusion_window"]),
                                          int(params["occlusion_stride"]), state.max_batch)
                masses = attr.off_leaf_masses(maps, masks)
                result[method][name][cell] = mean_with_interval(masses, n_boot, seed, level, "maps")
                if name in ("compact", "pte"):
                    for item, image, amap, mask, mass in list(zip(items, images, maps, masks, masses,
                                                                  strict=True))[:per_cell]:
                        gallery.append({"method": method, "state": name, "cell": cell, "map": amap, "mask": mask,
                                        "image": _display(image, spec), "off_leaf": mass, "key": item["key"]})
    return result, gallery


def _display(tensor: Any, spec: ImageSpec) -> np.ndarray:
    mean, std = np.asarray(spec.mean)[:, None, None], np.asarray(spec.std)[:, None, None]
    return (np.clip(tensor.numpy() * std + mean, 0, 1).transpose(1, 2, 0) * 255).astype(np.uint8)


# --------------------------------------------------------------------------- chapter
def read_lab_test(ctx: RunContext, states: dict[str, state_models.LoadedState]) -> tuple[pd.DataFrame, list]:
    """The locked test rows, read once per state through the locked-test door (each read logged)."""
    rows, accesses = None, []
    for name, state in states.items():
        earlier = locked_test.accesses_for(ctx.run_dir, state.sha256)
        rows = locked_test.read_test_rows(ctx.run_dir, state.sha256, reader="field", override=bool(earlier),
                                          reason=TEST_REASON if earlier else None)
        accesses.append({"state": name, "model_state": state.sha256, "access": len(earlier) + 1,
                         "override": bool(earlier), "reason": TEST_REASON if earlier else None})
    return rows, accesses


def _mask_summary(table: pd.DataFrame, params: dict[str, Any], n_masked: int) -> dict[str, Any]:
    target = float(params["mask_iou_target"])
    base = {"method": "cropcop_utils.field.masks.leaf_mask", "n_estimated": n_masked, "target": target}
    if table.empty:
        return {**base, "iou": None, "reason": "no true leaf masks for these lab photos (a real corpus): "
                "IoU cannot be measured; the gallery shows the estimated masks"}
    iou = table["iou"].to_numpy()
    return {**base, "iou": mean_with_interval(iou, int(params["bootstrap"]), int(params["seed"]),
                                              float(params["ci_level"]), "masks"),
            "iou_median": float(np.median(iou)), "iou_min": float(iou.min()),
            "share_at_target": float((iou >= target).mean()), "meets_target": bool(iou.mean() >= target)}


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Score the field cohort with every state, measure where the models look, run the background swap."""
    from ..split import load_frozen
    from .cohort import field_root, scan_field

    params = field_params(ctx, **options)
    ch = Chapter(ctx.run_dir, "field")
    frozen = load_frozen(ch)
    names = frozen.class_names
    spec = ImageSpec.from_section(ctx.section("image"))
    states = state_models.load_states(ch, len(names))
    lab_records = lab_test_records(ch, states)
    preds = {s: lab_records[s].set_index("row_id")["pred"] for s in states}

    root = field_root(ctx)
    cohort = field_records = None
    scan_summary: dict[str, Any] | None = None
    if root is not None:
        scan = scan_field(root, names, max_image_pixels=ctx.section("corpus").get("max_image_pixels"))
        cohort, scan_summary = scan.rows, scan.summary
        ch.write_parquet(COHORT, cohort[COHORT_COLUMNS])
        ch.write_parquet("field/quarantine.parquet", scan.quarantine)
        field_records = state_models.score_rows(states, cohort, root, ctx.section("image"),
                                                int(params["batch_size"])) if len(cohort) else None
    results: dict[str, Any] = {}
    confusions = []
    for name in states:
        lab_y, lab_pred = lab_records[name]["label"].to_numpy(), lab_records[name]["pred"].to_numpy()
        matched = np.isin(lab_y, cohort["label"].unique()) if cohort is not None else np.ones(len(lab_y), bool)
        results[name] = {"label": STATE_LABELS[name], "model_state": states[name].sha256,
                         "lab_test": classification(lab_y, lab_pred, names, params, per_class=False),
                         "lab_test_matched": classification(lab_y[matched], lab_pred[matched], names, params),
                         "field": None}
        if field_records is not None:
            record = field_records[name]
            ch.write_parquet(f"field/predictions_{name}.parquet", record)
            results[name]["field"] = field_results(record, cohort, names, params)
            confusions.append(confusion_long(record, names, name))
            preds[name] = pd.concat([preds[name], record.set_index("row_id")["pred"]])
    if confusions:
        ch.write_parquet("field/confusion.parquet", pd.concat(confusions, ignore_index=True))

    # the lab side of the benchmark: a sample of the locked test, its masks, donors from train
    test_rows, accesses = read_lab_test(ctx, states)
    lab = bench.estimate_masks(bench.LeafSet(
        bench.sample_rows(test_rows, int(params["swap_n"]), int(params["seed"])), Path(ctx.corpus_root)))
    iou = bench.mask_iou_table(ctx.run_dir, lab)
    ch.write_parquet("field/mask_iou.parquet", iou)
    donors = bench.LeafSet(frozen.rows_for("train"), Path(ctx.corpus_root))
    manifest = bench.build(ch, lab, cohort, root, donors, int(params["seed"]))
    ch.write_parquet("field/composites.parquet", manifest)
    swap_records = state_models.score_rows(states, manifest, ctx.run_dir / bench.COMPOSITES,
                                           ctx.section("image"), int(params["batch_size"])) if len(manifest) else {}
    for name, record in swap_records.items():
        record = record.merge(manifest[["row_id", "cell", "source_row_id"]], on="row_id")
        ch.write_parquet(f"field/swap_predictions_{name}.parquet", record)
        preds[name] = pd.concat([preds[name], record.set_index("row_id")["pred"]])
    cells = bench.cell_frames(lab_records, lab.rows, field_records, swap_records, manifest)
    swap = {name: cell_results(cells[name], params) for name in states}

    sets = attribution_sets(ctx, lab, manifest, cohort, root)
    looks, gallery = measure_attribution(states, sets, preds, spec, params)
    grid = attr.gradcam_grid(states["compact"].module, spec.size, int(params["gradcam_stage"]))

    plots = save_figures(ch, results, swap, lab, iou, manifest, cohort, root, gallery, confusions, names)
    summary = headline_figures(results, swap, looks)
    record = ch.finish(
        figures=summary, plots=plots, params=params,
        status="measured" if cohort is not None else "no_field_cohort",
        reason=None if cohort is not None else (
            "this run has no field cohort (--field not given with a real corpus): nothing is known about "
            "these models outside the lab; the lab-side measurements below still ran"),
        field_root=None if root is None else str(root), cohort=scan_summary, states=results,
        masks=_mask_summary(iou, params, len(lab.rows)),
        attribution={"methods": {
            "gradcam": {"states": list(FLOAT_STATES), "package": "grad-cam (pytorch-grad-cam)",
                        "stage": int(params["gradcam_stage"]), "grid": grid, "target": "the state's predicted class"},
            "occlusion": {"states": list(states), "package": "captum (Occlusion)",
                          "window": int(params["occlusion_window"]), "stride": int(params["occlusion_stride"]),
                          "cells": list(params["occlusion_cells"]),
                          "why": "the INT8 graph and the .pte expose neither gradients nor layers to hook; "
                                 "occlusion only calls the forward function, so it measures all four states "
                                 "by one method"}},
            **looks},
        swap={"cells_described": comp.describe_cells(), "n": {c: int((manifest["cell"] == c).sum())
                                                              for c in comp.COMPOSITE_CELLS},
              "states": swap},
        test_access=accesses, classes=names, image=ctx.section("image"),
    )
    from .. import card

    card.write_card(ctx.run_dir)
    return record


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


def save_figures(ch: Chapter, results: dict[str, Any], swap: dict[str, Any], lab: bench.LeafSet,
                 iou: pd.DataFrame, manifest: pd.DataFrame, cohort: pd.DataFrame | None, root: Path | None,
                 gallery: list[dict[str, Any]], confusions: list[pd.DataFrame], names: list[str]) -> dict[str, str]:
    """Write the chapter's figures; returns name → path."""
    from .masks import load_mask

    made: dict[str, Any] = {"lab_vs_field": figures.plot_lab_vs_field(results),
                            "cells": figures.plot_cells(swap, comp.CELLS)}
    by_id = iou.set_index("row_id") if len(iou) else None
    items = []
    for r in lab.rows.head(6).itertuples():
        truth = bench.lab_true_mask(ch.run_dir, r.class_name, r.rel_path)
        items.append({"image": lab.rgb(r.rel_path), "mask": lab.masks[r.row_id], "title": r.class_name,
                      "truth": None if truth is None else np.asarray(load_mask(truth), dtype=bool),
                      "iou": None if by_id is None or r.row_id not in by_id.index else by_id.loc[r.row_id, "iou"]})
    made["mask_gallery"] = figures.mask_gallery(items)
    if gallery:
        made["heatmap_gallery"] = figures.heatmap_gallery([
            {**g, "title": f"{g['method']} · {g['state']} · {g['cell']}\noff-leaf "
                           + ("n/a" if np.isnan(g["off_leaf"]) else f"{g['off_leaf']:.2f}")} for g in gallery])
    rows = []
    for source_id, group in list(manifest.groupby("source_row_id", sort=False))[:4]:
        panels = []
        source = lab.rows[lab.rows["row_id"] == source_id]
        if len(source):
            panels.append(("lab photo", lab.rgb(source["rel_path"].iloc[0])))
        elif cohort is not None and root is not None:
            field_row = cohort[cohort["row_id"] == source_id]
            panels.append(("field photo", bench.LeafSet(field_row, root).rgb(field_row["rel_path"].iloc[0])))
        for r in group.itertuples():
            panels.append((r.cell, np.asarray(bench.imaging.open_rgb(ch.path(f"{bench.COMPOSITES}/{r.rel_path}")))))
        rows.append(panels)
    if rows:
        made["composite_gallery"] = figures.composite_gallery(rows)
    if confusions:
        pte = confusions[-1]
        field_classes = sorted(set(pte["true"]), key=names.index)
        shown = sorted(set(pte["true"]) | set(pte["predicted"]), key=names.index)
        matrix = np.zeros((len(field_classes), len(shown)), dtype=int)
        for r in pte.itertuples():
            matrix[field_classes.index(r.true), shown.index(r.predicted)] = r.count
        made["field_confusion"] = figures.plot_confusion(matrix, field_classes, shown,
                                                         f"field cohort, {STATE_LABELS[pte['state'].iloc[0]]}")
    paths = {}
    for name, fig in made.items():
        paths[name] = f"{FOLDER}/{name}.png"
        ch.save_figure(fig, paths[name], dpi=110)
    return paths
