"""Where the models look, over the chapter's cells: Grad-CAM (float models) and occlusion (every state).

Each cell's items carry the row_id its prediction is recorded under (the attribution target is the
state's own predicted class), the image path and the leaf mask at native resolution; masks are carried
onto the model's input grid (:func:`.attribution.mask_on_model_grid`) before off-leaf mass is taken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.config import RunContext
from ..core.imaging import ImageSpec
from ..nets import states as state_models
from . import attribution as attr
from . import bench
from .stats import mean_with_interval

FLOAT_STATES = ("reference", "compact")


def attribution_sets(
    ctx: RunContext,
    lab: bench.LeafSet,
    manifest: pd.DataFrame,
    field_rows: pd.DataFrame | None,
    field_root: Path | None,
) -> dict[str, list[dict[str, Any]]]:
    """cell → items (key = the row_id its prediction is recorded under, path, native leaf mask)."""
    from ..core.masks import load_mask

    composites_root = ctx.run_dir / bench.COMPOSITES
    sets: dict[str, list[dict[str, Any]]] = {
        "lab_plain": [
            {"key": r.row_id, "path": lab.root / r.rel_path, "mask": lab.masks[r.row_id]}
            for r in lab.rows.itertuples()
        ]
    }
    field_masks: dict[str, np.ndarray] = {}
    if field_rows is not None and field_root is not None:
        for r in field_rows[field_rows["mask_rel_path"].notna()].itertuples():
            field_masks[r.row_id] = np.asarray(load_mask(field_root / r.mask_rel_path), dtype=bool)
        sets["field_field"] = [
            {"key": r.row_id, "path": field_root / r.rel_path, "mask": field_masks[r.row_id]}
            for r in field_rows.itertuples()
            if r.row_id in field_masks
        ]
    for cell, group in manifest.groupby("cell"):
        items = []
        for r in group.itertuples():
            mask = (
                lab.masks.get(r.source_row_id) if cell != "field_plain" else field_masks.get(r.source_row_id)
            )
            if mask is not None:
                items.append({"key": r.row_id, "path": composites_root / r.rel_path, "mask": mask})
        sets[str(cell)] = items
    return {cell: items for cell, items in sets.items() if items}


def _tensors(items: list[dict[str, Any]], spec: ImageSpec) -> tuple[Any, list[np.ndarray]]:
    import torch

    images = torch.stack([spec.load_tensor(item["path"]) for item in items])
    masks = [attr.mask_on_model_grid(item["mask"], spec.size) for item in items]
    return images, masks


def measure_attribution(
    states: dict[str, state_models.LoadedState],
    sets: dict[str, list[dict[str, Any]]],
    preds: dict[str, pd.Series],
    spec: ImageSpec,
    params: dict[str, Any],
    masses_out: dict[tuple[str, str, str], np.ndarray] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Off-leaf mass per method, state and cell (mean with interval); gallery items on the side.

    Each state's maps come from that state's own program: Grad-CAM from ``state.module`` (float states
    only), occlusion from ``state.forward`` (the INT8 graph, the executed .pte).  ``model_states`` maps
    every measured state to the SHA-256 of the file its figures came from (``state.sha256``).

    ``masses_out`` (when given) receives each image's mass under ``(method, state, cell)``, in the
    cell's item order, so two regimes measured on the same items can be compared image by image."""
    n_boot, seed, level = int(params["bootstrap"]), int(params["seed"]), float(params["ci_level"])
    result: dict[str, Any] = {"gradcam": {}, "occlusion": {}, "model_states": {}}
    gallery: list[dict[str, Any]] = []
    per_cell = int(params["gallery_n"])
    for method, names, limit, cells in (
        ("gradcam", FLOAT_STATES, int(params["gradcam_images"]), list(sets)),
        ("occlusion", tuple(states), int(params["occlusion_images"]), list(params["occlusion_cells"])),
    ):
        for name in names:
            state = states[name]
            result["model_states"][name] = state.sha256
            result[method][name] = {}
            for cell in cells:
                items = sets.get(cell, [])[:limit]
                if not items:
                    result[method][name][cell] = None
                    continue
                images, masks = _tensors(items, spec)
                targets = [int(preds[name][item["key"]]) for item in items]
                if method == "gradcam":
                    maps = attr.gradcam(
                        state.module,
                        images,
                        targets,
                        int(params["gradcam_stage"]),
                        int(params["gradcam_batch"]),
                    )
                else:
                    maps = attr.occlusion(
                        state.forward,
                        images,
                        targets,
                        int(params["occlusion_window"]),
                        int(params["occlusion_stride"]),
                        state.max_batch or int(params["batch_size"]),
                    )
                masses = attr.off_leaf_masses(maps, masks)
                if masses_out is not None:
                    masses_out[(method, name, cell)] = np.asarray(masses, dtype=np.float64)
                result[method][name][cell] = mean_with_interval(masses, n_boot, seed, level, "maps")
                if name in ("compact", "pte"):
                    for item, image, amap, mask, mass in list(
                        zip(items, images, maps, masks, masses, strict=True)
                    )[:per_cell]:
                        gallery.append(
                            {
                                "method": method,
                                "state": name,
                                "cell": cell,
                                "map": amap,
                                "mask": mask,
                                "image": _display(image, spec),
                                "off_leaf": mass,
                                "key": item["key"],
                            }
                        )
    return result, gallery


def _display(tensor: Any, spec: ImageSpec) -> np.ndarray:
    mean, std = np.asarray(spec.mean)[:, None, None], np.asarray(spec.std)[:, None, None]
    return (np.clip(tensor.numpy() * std + mean, 0, 1).transpose(1, 2, 0) * 255).astype(np.uint8)
