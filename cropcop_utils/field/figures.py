"""Figures of the field chapter: lab vs field per state, every cohort side by side, the five cells, and the
three galleries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core.evidence import Chapter
from ..core.model_states import STATE_LABELS
from . import bench
from . import composites as comp

CELL_COLOURS = {
    "lab_plain": "tab:blue",
    "lab_field": "tab:red",
    "paste_control": "tab:cyan",
    "field_field": "tab:orange",
    "field_plain": "tab:green",
}


def _bar(
    ax: Any, x: float, entry: dict[str, Any] | None, colour: str, width: float, label: str | None
) -> None:
    if not entry or entry.get("value") is None:
        return
    value = entry["value"]
    err = None
    if entry.get("lo") is not None:
        err = [[value - entry["lo"]], [entry["hi"] - value]]
    ax.bar(x, value, width=width, color=colour, yerr=err, capsize=3, label=label)


def plot_lab_vs_field(states: dict[str, Any]) -> Figure:
    """Accuracy on the lab test and on the field cohort, per state, with 95 % intervals."""
    fig = Figure(figsize=(7.0, 3.2))
    ax = fig.subplots()
    names = list(states)
    for i, name in enumerate(names):
        entry = states[name]
        _bar(
            ax,
            i - 0.2,
            entry["lab_test_matched"]["accuracy"],
            "tab:blue",
            0.4,
            "lab test" if i == 0 else None,
        )
        field = entry.get("field")
        _bar(
            ax,
            i + 0.2,
            field["accuracy"] if field else None,
            "tab:orange",
            0.4,
            "field cohort" if i == 0 else None,
        )
    ax.set_xticks(range(len(names)), [STATE_LABELS.get(n, n) for n in names], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_cells(swap_states: dict[str, Any], cells: Sequence[str]) -> Figure:
    """Accuracy per background-swap cell and state, with intervals."""
    fig = Figure(figsize=(8.0, 3.4))
    ax = fig.subplots()
    names = list(swap_states)
    width = 0.8 / max(1, len(cells))
    for j, cell in enumerate(cells):
        for i, name in enumerate(names):
            entry = swap_states[name]["cells"].get(cell)
            _bar(
                ax,
                i - 0.4 + width * (j + 0.5),
                entry and entry["accuracy"],
                CELL_COLOURS.get(cell, "grey"),
                width,
                cell if i == 0 else None,
            )
    ax.set_xticks(range(len(names)), [STATE_LABELS.get(n, n) for n in names], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7, ncol=len(cells), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig


def _overlay(image: np.ndarray, mask: np.ndarray, colour: Sequence[float] = (1.0, 0.0, 1.0)) -> np.ndarray:
    out = image.astype(np.float32) / 255.0
    out[mask] = 0.55 * out[mask] + 0.45 * np.asarray(colour, dtype=np.float32)
    return out


def mask_gallery(items: Sequence[dict[str, Any]]) -> Figure:
    """Each item: ``image`` (H, W, 3 uint8), ``mask`` (estimated), optional ``truth`` and ``title``."""
    cols = 3 if any(item.get("truth") is not None for item in items) else 2
    fig = Figure(figsize=(1.8 * cols, 1.8 * max(1, len(items))))
    axes = np.atleast_2d(fig.subplots(max(1, len(items)), cols, squeeze=False))
    for row, item in zip(axes, items, strict=False):
        row[0].imshow(item["image"])
        row[0].set_title(item.get("title", ""), fontsize=7)
        row[1].imshow(_overlay(item["image"], item["mask"]))
        row[1].set_title("estimated leaf mask", fontsize=7)
        if cols == 3 and item.get("truth") is not None:
            row[2].imshow(_overlay(item["image"], item["truth"], (0.0, 1.0, 1.0)))
            row[2].set_title(
                f"true mask, IoU {item['iou']:.2f}" if item.get("iou") is not None else "true mask",
                fontsize=7,
            )
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    return fig


def heatmap_gallery(items: Sequence[dict[str, Any]]) -> Figure:
    """Each item: ``image`` (S, S, 3 uint8 on the model grid), ``map`` (S, S), ``mask`` (S, S), ``title``."""
    cols = 4
    rows = max(1, -(-len(items) // cols))
    fig = Figure(figsize=(2.0 * cols, 2.1 * rows))
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    for ax, item in zip(axes.ravel(), items, strict=False):
        ax.imshow(item["image"])
        ax.imshow(item["map"], cmap="jet", alpha=0.45)
        ax.contour(item["mask"].astype(float), levels=[0.5], colors="white", linewidths=0.8)
        ax.set_title(item.get("title", ""), fontsize=6.5)
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    return fig


def composite_gallery(rows: Sequence[Sequence[tuple[str, np.ndarray]]]) -> Figure:
    """One row per source leaf: (title, image) panels, e.g. the lab photo and its composites."""
    cols = max((len(r) for r in rows), default=1)
    fig = Figure(figsize=(1.9 * cols, 1.9 * max(1, len(rows))))
    axes = np.atleast_2d(fig.subplots(max(1, len(rows)), cols, squeeze=False))
    for ax_row, panels in zip(axes, rows, strict=False):
        for ax, (title, image) in zip(ax_row, panels, strict=False):
            ax.imshow(image)
            ax.set_title(title, fontsize=7)
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    return fig


def plot_confusion(
    matrix: np.ndarray, row_names: Sequence[str], col_names: Sequence[str], title: str
) -> Figure:
    """Row-normalised confusion of the field cohort (rows: field classes, columns: predicted lab class)."""
    shown = matrix / np.maximum(matrix.sum(1, keepdims=True), 1)
    fig = Figure(figsize=(max(4.0, 0.35 * len(col_names) + 2.5), max(2.5, 0.35 * len(row_names) + 1.5)))
    ax = fig.subplots()
    ax.imshow(shown, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(col_names)), col_names, rotation=90, fontsize=6)
    ax.set_yticks(range(len(row_names)), row_names, fontsize=6)
    for (i, j), count in np.ndenumerate(matrix):
        if count:
            ax.text(
                j,
                i,
                str(int(count)),
                ha="center",
                va="center",
                fontsize=5.5,
                color="white" if shown[i, j] > 0.5 else "black",
            )
    ax.set_xlabel("predicted (lab class)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    return fig


def save_figures(
    ch: Chapter,
    results: dict[str, Any],
    swap: dict[str, Any],
    lab: bench.LeafSet,
    iou: pd.DataFrame,
    manifest: pd.DataFrame,
    cohort: pd.DataFrame | None,
    root: Path | None,
    gallery: list[dict[str, Any]],
    confusions: list[pd.DataFrame],
    names: list[str],
) -> dict[str, str]:
    """Write the chapter's figures; returns name → path."""
    from ..core.masks import load_mask

    made: dict[str, Any] = {
        "lab_vs_field": plot_lab_vs_field(results),
        "cells": plot_cells(swap, comp.CELLS),
    }
    by_id = iou.set_index("row_id") if len(iou) else None
    items = []
    for r in lab.rows.head(6).itertuples():
        truth = bench.lab_true_mask(ch.run_dir, r.class_name, r.rel_path)
        items.append(
            {
                "image": lab.rgb(r.rel_path),
                "mask": lab.masks[r.row_id],
                "title": r.class_name,
                "truth": None if truth is None else np.asarray(load_mask(truth), dtype=bool),
                "iou": None if by_id is None or r.row_id not in by_id.index else by_id.loc[r.row_id, "iou"],
            }
        )
    made["mask_gallery"] = mask_gallery(items)
    if gallery:
        made["heatmap_gallery"] = heatmap_gallery(
            [
                {
                    **g,
                    "title": f"{g['method']} · {g['state']} · {g['cell']}\noff-leaf "
                    + ("n/a" if np.isnan(g["off_leaf"]) else f"{g['off_leaf']:.2f}"),
                }
                for g in gallery
            ]
        )
    rows = []
    # three lab leaves (lab photo, paste_control, lab_field) and two field leaves (field photo, field_plain)
    groups = list(manifest.groupby("source_row_id", sort=False))
    lab_ids = set(lab.rows["row_id"])
    shown = [g for g in groups if g[0] in lab_ids][:3] + [g for g in groups if g[0] not in lab_ids][:2]
    for source_id, group in shown:
        panels = []
        source = lab.rows[lab.rows["row_id"] == source_id]
        if len(source):
            panels.append(("lab photo", lab.rgb(source["rel_path"].iloc[0])))
        elif cohort is not None and root is not None:
            field_row = cohort[cohort["row_id"] == source_id]
            panels.append(("field photo", bench.LeafSet(field_row, root).rgb(field_row["rel_path"].iloc[0])))
        for r in group.itertuples():
            panels.append(
                (r.cell, np.asarray(bench.imaging.open_rgb(ch.path(f"{bench.COMPOSITES}/{r.rel_path}"))))
            )
        rows.append(panels)
    if rows:
        made["composite_gallery"] = composite_gallery(rows)
    if confusions:
        pte = confusions[-1]
        field_classes = sorted(set(pte["true"]), key=names.index)
        shown = sorted(set(pte["true"]) | set(pte["predicted"]), key=names.index)
        matrix = np.zeros((len(field_classes), len(shown)), dtype=int)
        for r in pte.itertuples():
            matrix[field_classes.index(r.true), shown.index(r.predicted)] = r.count
        made["field_confusion"] = plot_confusion(
            matrix, field_classes, shown, f"field cohort, {STATE_LABELS[pte['state'].iloc[0]]}"
        )
    paths = {}
    for name, fig in made.items():
        paths[name] = f"field/{name}.png"
        ch.save_figure(fig, paths[name], dpi=110)
    return paths


def change_rows(comparison: dict[str, Any]) -> pd.DataFrame:
    """One row per regime, state and measure: the change against the baseline with its interval."""
    rows = []
    for regime, entry in comparison.items():
        for state, measures in entry["states"].items():
            found: list[tuple[str, dict[str, Any] | None]] = [
                ("lab test macro-F1", measures["lab_test"]["macro_f1"]),
                ("field accuracy", (measures["field"] or {}).get("accuracy")),
                ("field macro-F1", (measures["field"] or {}).get("macro_f1")),
                *((f"cell {cell} accuracy", value) for cell, value in measures["cells"].items()),
                ("background share of the gap", measures["background_share"]),
                *(
                    (f"off-leaf {method} ({cell})", value)
                    for method, cells in measures["off_leaf"].items()
                    for cell, value in cells.items()
                ),
            ]
            for measure, value in found:
                if value is None:
                    continue
                rows.append(
                    {
                        "regime": regime,
                        "state": state,
                        "measure": measure,
                        "baseline": value.get("baseline"),
                        "regime_value": value.get("regime"),
                        "change": value.get("value"),
                        "lo": value.get("lo"),
                        "hi": value.get("hi"),
                        "n": value.get("n"),
                        "reason": value.get("reason"),
                    }
                )
    return pd.DataFrame(rows)


def plot_regime_changes(table: pd.DataFrame, states: Sequence[str] = ("compact", "pte")) -> Figure:
    """Regime minus baseline per measure, for the float compact model and the .pte (95 % intervals)."""
    measures = list(dict.fromkeys(table["measure"]))
    fig = Figure(figsize=(8.0, 0.32 * len(measures) + 1.4))
    ax = fig.subplots()
    for offset, state in zip((-0.15, 0.15), states, strict=True):
        part = table[(table["state"] == state) & table["change"].notna()]
        y = np.array([measures.index(m) for m in part["measure"]]) + offset
        change = part["change"].to_numpy(float)
        lo = part["lo"].fillna(part["change"]).to_numpy(float)
        hi = part["hi"].fillna(part["change"]).to_numpy(float)
        ax.errorbar(change, y, xerr=[change - lo, hi - change], fmt="o", capsize=2, label=STATE_LABELS[state])
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(measures)), measures, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("change against the baseline regime (same rows; paired 95 % interval)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def paired_heatmaps(
    galleries: dict[str, list[dict[str, Any]]],
    method: str = "gradcam",
    state: str = "compact",
    pairs: int = 8,
) -> list[dict[str, Any]]:
    """The same images under each regime, side by side: gallery items of one method and state, matched
    by the row their prediction is recorded under, alternating regimes."""
    names = list(galleries)
    chosen = {
        name: {(g["cell"], g["key"]): g for g in items if g["method"] == method and g["state"] == state}
        for name, items in galleries.items()
    }
    common = [k for k in chosen[names[0]] if all(k in chosen[n] for n in names[1:])][:pairs]
    out = []
    for key in common:
        for name in names:
            g = chosen[name][key]
            mass = "n/a" if np.isnan(g["off_leaf"]) else f"{g['off_leaf']:.2f}"
            out.append({**g, "title": f"{name} · {g['cell']}\n{method} {state}, off-leaf {mass}"})
    return out


def save_regime_figure(
    ch: Chapter, comparison: dict[str, Any], galleries: dict[str, list[dict[str, Any]]] | None = None
) -> dict[str, str]:
    """The change table (``field/regime_changes.parquet``), its figure and the paired heat maps;
    returns the figures' name → path (the chapter's ``plots``)."""
    table = change_rows(comparison)
    ch.write_parquet("field/regime_changes.parquet", table)
    ch.save_figure(plot_regime_changes(table), "field/regime_changes.png", dpi=110)
    paths = {"regime_changes": "field/regime_changes.png"}
    items = paired_heatmaps(galleries) if galleries and len(galleries) > 1 else []
    if items:
        ch.save_figure(heatmap_gallery(items), "field/regime_heatmaps.png", dpi=110)
        paths["regime_heatmaps"] = "field/regime_heatmaps.png"
    return paths


SHORT_LABELS = {"reference": "reference", "compact": "compact", "int8": "INT8 graph", "pte": ".pte"}


def plot_cohorts(table: pd.DataFrame, lab: dict[str, Any]) -> Figure:
    """Accuracy per state on the lab test and on each scored cohort (95 % intervals), one panel per regime:
    a cohort from another source next to the one the model was adapted to, at a glance."""
    regimes = list(dict.fromkeys(table["regime"]))
    cohorts = list(dict.fromkeys(table["cohort"]))
    states = list(dict.fromkeys(table["state"]))
    colours = ["tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    fig = Figure(figsize=(3.4 * len(regimes) + 1.5, 3.2))
    axes = np.atleast_1d(fig.subplots(1, len(regimes), sharey=True))
    width = 0.8 / (len(cohorts) + 1)
    for ax, regime in zip(axes, regimes, strict=True):
        for i, state in enumerate(states):
            _bar(ax, i - 0.4 + width / 2, lab[regime][state], "tab:blue", width,
                 "lab test" if i == 0 else None)
            for j, cohort in enumerate(cohorts):
                row = table[(table["regime"] == regime) & (table["state"] == state)
                            & (table["cohort"] == cohort)]
                entry = (None if row.empty or pd.isna(row.iloc[0]["accuracy"]) else
                         {k: float(row.iloc[0][c]) for k, c in
                          (("value", "accuracy"), ("lo", "accuracy_lo"), ("hi", "accuracy_hi"))})
                relation = row.iloc[0]["relation"] if not row.empty else ""
                _bar(ax, i - 0.4 + width * (j + 1.5), entry, colours[j % len(colours)], width,
                     f"{cohort} ({relation})" if i == 0 else None)
        ax.set_xticks(range(len(states)), [SHORT_LABELS.get(s, s) for s in states], fontsize=8)
        ax.set_title(f"regime: {regime}", fontsize=9)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("accuracy")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
