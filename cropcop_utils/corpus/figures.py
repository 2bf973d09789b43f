"""The corpus chapter's figures: class support, and stored pixels next to what the loading contract
hands a model."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..core import imaging


def plot_class_support(table: pd.DataFrame, min_class_support: int | None = None) -> Figure:
    """Horizontal bars of admissible images per class; quarantined classes in grey (log scale if skewed)."""
    table = table.sort_values(["admissible", "class_name"], ascending=[True, False])
    height = max(2.5, 0.22 * len(table) + 1.2)
    fig = Figure(figsize=(8, height))
    ax = fig.subplots()
    colours = ["#3b7d3b" if s == "admitted" else "#9e9e9e" for s in table["status"]]
    ax.barh(table["class_name"], table["admissible"].clip(lower=0.8), color=colours)
    positive = table.loc[table["admissible"] > 0, "admissible"]
    if len(positive) and positive.max() / positive.min() >= 10:
        ax.set_xscale("log")
    if min_class_support:
        ax.axvline(min_class_support, color="#b22222", linestyle="--", linewidth=1,
                   label=f"min_class_support = {min_class_support}")
        ax.legend(loc="lower right", fontsize=8)
    for y, value in enumerate(table["admissible"]):
        ax.text(value if value > 0 else 0.8, y, f" {value}", va="center", fontsize=7)
    ax.set_xlabel("images that passed the file checks (grey: class quarantined)")
    ax.set_title(f"Class support ({int((table['status'] == 'admitted').sum())} admitted classes)")
    ax.tick_params(axis="y", labelsize=7 if len(table) > 30 else 8)
    ax.margins(x=0.12)
    fig.tight_layout()
    return fig


def plot_contract_examples(manifest: pd.DataFrame, corpus_root: str | os.PathLike, size: int,
                           n: int = 6) -> Figure:
    """Stored pixels (top) next to what the loading contract hands a model (bottom).

    EXIF-rotated and non-square files are shown first, because that is where the contract acts.
    """
    admitted = manifest[manifest["admitted"]]
    rotated = admitted[admitted["exif_orientation"].fillna(1).astype(int) != 1]
    oblong = admitted[admitted["width"] != admitted["height"]]
    spread = admitted.iloc[:: max(1, len(admitted) // n)]
    picks = pd.concat([rotated.head(2), oblong.head(2), spread]).drop_duplicates("rel_path").head(n)
    fig = Figure(figsize=(1.9 * max(len(picks), 1), 4.4))
    axes = fig.subplots(2, max(len(picks), 1), squeeze=False)
    for column, (_, row) in enumerate(picks.iterrows()):
        path = Path(corpus_root) / row["rel_path"]
        stored = imaging.open_decoded(path).convert("RGB")  # no EXIF transpose, no padding
        orientation = "" if pd.isna(row["exif_orientation"]) else f", EXIF {int(row['exif_orientation'])}"
        axes[0, column].imshow(stored)
        axes[0, column].set_title(f"{row['class_name'][:22]}\n{row['width']}×{row['height']}{orientation}",
                                  fontsize=7)
        axes[1, column].imshow(imaging.load_array(path, size))
        axes[1, column].set_title(f"contract {size}×{size}", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_ylabel("stored", fontsize=8)
    axes[1, 0].set_ylabel("loaded", fontsize=8)
    fig.tight_layout()
    return fig
