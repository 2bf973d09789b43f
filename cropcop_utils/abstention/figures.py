"""Figures of chapter 11 (calibration and abstention): matplotlib Figures drawn from the chapter's tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core.model_states import STATE_LABELS, STATE_NAMES

FOLDER = "abstention"


def _state_panels(n: int = len(STATE_NAMES), height: float = 3.0) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(2.6 * n, height))
    axes = np.atleast_1d(fig.subplots(1, n, sharey=True))
    return fig, axes


def plot_reliability(bins: pd.DataFrame) -> Figure:
    """Accuracy against mean confidence in equal-mass bins, before and after temperature scaling."""
    fig, axes = _state_panels()
    for ax, state in zip(axes, STATE_NAMES, strict=True):
        for stage, style in (("before", "o--"), ("after", "s-")):
            part = bins[(bins["state"] == state) & (bins["stage"] == stage)]
            ax.plot(part["confidence"], part["accuracy"], style, markersize=3, label=f"{stage} scaling")
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        ax.set_title(STATE_LABELS[state], fontsize=9)
        ax.set_xlabel("mean confidence (bin)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("accuracy (bin)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Reliability on the locked test (equal-mass bins)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_risk_coverage(curves: pd.DataFrame, states: dict[str, Any], score: str,
                       target_risk: float) -> Figure:
    """Selective risk against coverage for every score; the validation-chosen operating point on test."""
    fig, axes = _state_panels()
    for ax, state in zip(axes, STATE_NAMES, strict=True):
        part = curves[curves["state"] == state]
        for name, line in part.groupby("score", sort=False):
            ax.plot(line["coverage"], 100 * line["risk"], label=name, linewidth=1.2)
        test = states[state]["selective"][score]["test"]
        coverage, risk = test["coverage"]["value"], test["selective_risk"]["value"]
        if coverage and risk is not None:
            ax.plot([coverage], [100 * risk], "k*", markersize=9, label=f"threshold ({score})")
        ax.axhline(100 * target_risk, color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(STATE_LABELS[state], fontsize=9)
        ax.set_xlabel("coverage")
        ax.set_xlim(0, 1)
    axes[0].set_ylabel("selective risk (% errors among accepted)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Risk–coverage on the locked test (dotted: target risk)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_conformal_classes(per_class: pd.DataFrame, state: str = "pte") -> Figure:
    """Per-class coverage of marginal and class-conditional conformal sets, at each nominal level."""
    part = per_class[(per_class["state"] == state) & (per_class["rows"] > 0)]
    levels = sorted(part["level"].unique())
    fig = Figure(figsize=(max(6.0, 0.35 * part["label"].nunique() * len(levels)), 3.4))
    axes = np.atleast_1d(fig.subplots(1, max(len(levels), 1), sharey=True))
    for ax, level in zip(axes, levels, strict=False):
        at = part[part["level"] == level]
        names = at.drop_duplicates("label").sort_values("label")["class_name"].tolist()
        x = np.arange(len(names))
        for offset, method in ((-0.2, "marginal"), (0.2, "class_conditional")):
            rows = at[at["method"] == method].sort_values("label")
            ax.bar(x + offset, 100 * rows["coverage"].astype(float), width=0.4,
                   label=method.replace("_", "-"))
        ax.axhline(100 * level, color="black", linestyle=":", linewidth=0.8)
        ax.set_xticks(x, names, rotation=90, fontsize=6)
        ax.set_title(f"nominal {100 * level:.0f} %", fontsize=9)
    axes[0].set_ylabel("test coverage of the class (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Conformal coverage per class, {STATE_LABELS[state]}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_out_of_scope(lab_scores: np.ndarray, oos: pd.DataFrame, threshold: float, score: str,
                      state: str = "pte") -> Figure:
    """The confidence score of lab test images and of out-of-scope images, with the threshold."""
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    groups = {"lab test": np.asarray(lab_scores)}
    groups.update({source: part["score"].to_numpy() for source, part in oos.groupby("source")})
    values = np.concatenate([v for v in groups.values() if len(v)])
    edges = np.linspace(values.min(), values.max(), 30) if values.size and np.ptp(values) > 0 else 10
    for name, scores in groups.items():
        if len(scores):
            ax.hist(scores, bins=edges, density=True, histtype="step", linewidth=1.4,
                    label=f"{name} ({len(scores)})")
    ax.axvline(threshold, color="black", linestyle="--", linewidth=1, label="threshold")
    ax.set_xlabel(f"{score} score of the {STATE_LABELS[state]}")
    ax.set_ylabel("density")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save_all(ch: Any, frames: dict[str, pd.DataFrame], states: dict[str, Any], params: dict[str, Any],
             lab_scores: dict[str, np.ndarray]) -> dict[str, str]:
    """Draw and register every figure of the chapter; name → path relative to the run folder."""
    score = params["score"]
    oos = frames["out_of_scope_scores"]
    figures = {
        "reliability": plot_reliability(frames["reliability"]),
        "risk_coverage": plot_risk_coverage(frames["risk_coverage"], states, score,
                                            float(params["target_risk"])),
        "conformal_classes": plot_conformal_classes(frames["conformal_classes"]),
        "out_of_scope": plot_out_of_scope(lab_scores["pte"], oos[oos["state"] == "pte"],
                                          states["pte"]["selective"][score]["choice"]["threshold"], score),
    }
    paths = {}
    for name, fig in figures.items():
        paths[name] = f"{FOLDER}/{name}.png"
        ch.save_figure(fig, paths[name], dpi=110)
    return paths


def plot_protection(table: pd.DataFrame, chosen: str) -> Figure:
    """Per candidate score: the share of each out-of-scope kind rejected, and of each in-scope set answered
    and answered correctly (95 % Wilson intervals) — the chosen score drawn solid, the others hatched."""
    scores = list(dict.fromkeys(table["score"]))
    oos = table[table["kind"] != "in_scope"]
    ins = table[table["kind"] == "in_scope"]
    fig = Figure(figsize=(12, 3.8))
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [max(1, oos["set"].nunique()), 1.3, 1.3]})
    width = 0.8 / len(scores)
    panels = ((axes[0], oos, "rejected", "out of scope: share rejected"),
              (axes[1], ins, "coverage", "in scope: share answered"),
              (axes[2], ins, "selective_accuracy", "in scope: accuracy on answered"))
    for ax, part, column, title in panels:
        sets = list(dict.fromkeys(part["set"]))
        for i, score in enumerate(scores):
            rows = part[part["score"] == score].set_index("set").reindex(sets)
            value = rows[column].astype(float).to_numpy()
            low, high = rows[f"{column}_lo"].astype(float), rows[f"{column}_hi"].astype(float)
            err = np.nan_to_num(np.vstack([value - low, high - value]))
            ax.bar(np.arange(len(sets)) + (i - (len(scores) - 1) / 2) * width, value, width, yerr=err,
                   capsize=2, label=score, hatch=None if score == chosen else "//",
                   alpha=1.0 if score == chosen else 0.6)
        ax.set_xticks(np.arange(len(sets)))
        ax.set_xticklabels(sets, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_title(title, fontsize=9)
    # below the panels: above them the legend would cover the bars of the first kinds
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(scores), fontsize=8,
               title=f"score (chosen: {chosen}; the others hatched)", title_fontsize=8)
    fig.suptitle("What each candidate score does at its validation-chosen thresholds (the .pte's outputs)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def save_protection(ch: Any, table: pd.DataFrame, protection: dict[str, Any]) -> str:
    rel_path = f"{FOLDER}/protection.png"
    ch.save_figure(plot_protection(table, protection["chosen"]), rel_path)
    return rel_path
