"""Figures of the analysis chapters (8 and 9): matplotlib Figures drawn from their tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.metrics import confusion_matrix

from ..core import metrics
from ..core.config import RunContext
from ..core.model_states import ERROR_KINDS, STATE_LABELS, STATE_NAMES, PairedStates


def _interval_panels(table: pd.DataFrame, metric_names: tuple[str, ...], value: str, labels: str,
                     scale: float, title: str, panel_title: str, zero_line: bool) -> Figure:
    """One panel per metric: a point with its interval for each row of ``table`` (rows top to bottom)."""
    fig = Figure(figsize=(8, 3.2))
    axes = fig.subplots(1, len(metric_names), sharey=True)
    for ax, metric in zip(axes, metric_names, strict=True):
        part = table[table["metric"] == metric].reset_index(drop=True)
        centre, low, high = (scale * part[c] for c in (value, "lo", "hi"))
        ax.errorbar(centre, np.arange(len(part)), xerr=[centre - low, high - centre], fmt="o", capsize=3)
        if zero_line:
            ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_yticks(np.arange(len(part)), part[labels])
        ax.set_title(panel_title.format(metrics.METRIC_LABELS[metric]), fontsize=9)
        ax.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_state_metrics(state_table: pd.DataFrame) -> Figure:
    return _interval_panels(state_table, metrics.METRICS, "value", "state_label", 1.0,
                            "Model states on the locked test (bootstrap 95 % intervals)", "{}",
                            zero_line=False)


def plot_paired_deltas(paired_table: pd.DataFrame) -> Figure:
    table = paired_table.assign(pair_label=paired_table["pair"].str.replace("_to_", " → "))
    return _interval_panels(table, metrics.PAIRED_METRICS, "delta", "pair_label", 100.0,
                            "Paired changes along the deployment chain", "Δ {} (points)", zero_line=True)


def plot_support_bins(bins: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    x = np.arange(len(bins))
    for offset, state in zip(np.linspace(-0.3, 0.3, len(STATE_NAMES)), STATE_NAMES, strict=True):
        ax.bar(x + offset, bins[f"macro_f1_{state}"], width=0.18, label=STATE_LABELS[state])
    ticks = [f"{b}\n({c} classes)" for b, c in zip(bins["bin"], bins["classes"], strict=True)]
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_xlim(-0.5, len(bins) - 0.5)  # every bin keeps its slot, empty ones included
    for position, note in zip(x, bins["note"] if "note" in bins else [None] * len(bins), strict=True):
        if isinstance(note, str):  # an empty bin has no bars: say why instead of leaving a gap
            ax.text(position, 0.5, note.replace(" in this", "\nin this"), ha="center", va="center",
                    fontsize=7, color="grey")
    ax.set_xlabel("training examples per class")
    ax.set_ylabel("macro-F1 of the bin's classes")
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    return fig


def plot_taxonomy(taxonomy: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    table = taxonomy.pivot(index="state", columns="kind", values="errors").reindex(
        index=list(STATE_NAMES), columns=list(ERROR_KINDS))
    left = np.zeros(len(table))
    for kind in ERROR_KINDS:
        ax.barh(np.arange(len(table)), table[kind], left=left, label=kind)
        left += table[kind].to_numpy()
    ax.set_yticks(np.arange(len(table)), [STATE_LABELS[s] for s in table.index])
    ax.invert_yaxis()
    ax.set_xlabel("test errors")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_confusion(paired: PairedStates, classes: pd.DataFrame, state: str) -> Figure:
    """Row-normalised confusion matrix (recall on the diagonal) of one state."""
    import seaborn as sns

    labels = classes["label"].to_numpy()
    with metrics.quiet_empty_slices():
        matrix = confusion_matrix(paired.y, paired.preds[state], labels=labels, normalize="true")
    side = min(14.0, 3 + 0.25 * len(labels))
    fig = Figure(figsize=(side, side * 0.85))
    ax = fig.subplots()
    names = classes["class_name"].tolist() if len(labels) <= 40 else False
    sns.heatmap(matrix, ax=ax, cmap="viridis", vmin=0, vmax=1, square=True, xticklabels=names,
                yticklabels=names, cbar_kws={"label": "share of the true class"})
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.tick_params(labelsize=6)
    ax.set_title(f"Confusion of the {STATE_LABELS[state]} (rows normalised)", fontsize=10)
    fig.tight_layout()
    return fig


def worst_classes(per_class: pd.DataFrame, paired: PairedStates, state: str, count: int) -> list[int]:
    """The ``count`` classes with the lowest F1 for ``state`` among those the state gets wrong."""
    wrong = np.unique(paired.y[~paired.correct(state)])
    candidates = per_class[per_class["label"].isin(wrong)]
    ranked = candidates.sort_values([f"f1_{state}", "test_support"], ascending=[True, False])
    return ranked["label"].head(count).tolist()


def plot_error_gallery(paired: PairedStates, per_class: pd.DataFrame, ctx: RunContext,
                       params: dict[str, Any]) -> Figure:
    """Thumbnails of the worst classes' errors: true label, predicted label, margin (most confident first)."""
    from ..core.imaging import load_square

    state, per_row = params["gallery_state"], int(params["gallery_per_class"])
    chosen = worst_classes(per_class, paired, state, int(params["gallery_classes"]))
    names = per_class.set_index("label")["class_name"]
    if not chosen:
        fig = Figure(figsize=(5, 1))
        fig.text(0.5, 0.5, f"the {STATE_LABELS[state]} makes no test errors", ha="center", va="center")
        return fig
    frame = paired.rows.assign(pred=paired.preds[state], margin=paired.margins[state])
    fig = Figure(figsize=(1.6 * per_row, 1.9 * len(chosen)))
    axes = np.atleast_2d(fig.subplots(len(chosen), per_row, squeeze=False))
    for row, label in enumerate(chosen):
        errors = frame[(frame["label"] == label) & (frame["pred"] != label)].nlargest(per_row, "margin")
        for col in range(per_row):
            ax = axes[row, col]
            ax.axis("off")
            if col < len(errors):
                item = errors.iloc[col]
                ax.imshow(load_square(ctx.corpus_root / item["rel_path"], int(params["thumb_px"])))
                ax.set_title(f"→ {_short(names[item['pred']])}\nmargin {item['margin']:.2f}", fontsize=6)
        axes[row, 0].text(-0.1, 0.5, _short(names[label], 28), transform=axes[row, 0].transAxes, ha="right",
                          va="center", fontsize=7)
    fig.suptitle(f"Errors of the {STATE_LABELS[state]} in its lowest-F1 classes (true class at left)",
                 fontsize=9)
    return fig


def plot_slice(group_stats: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    for offset, group in ((-0.15, "slice"), (0.15, "rest")):
        stats = group_stats[group]["states"]
        if not stats:
            continue
        values, low, high = (np.array([stats[s]["mean_recall"][part] for s in STATE_NAMES], dtype=float)
                             for part in ("value", "lo", "hi"))  # an undefined bound (None) draws no bar
        low, high = np.nan_to_num(values - low), np.nan_to_num(high - values)
        ax.errorbar(np.arange(len(values)) + offset, values, yerr=[low, high], fmt="o", capsize=3,
                    label=f"{group} ({group_stats[group]['classes']} classes)")
    ax.set_xticks(np.arange(len(STATE_NAMES)), [STATE_LABELS[s] for s in STATE_NAMES], fontsize=8)
    ax.set_ylabel("mean class recall")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _short(name: str, width: int = 18) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"
