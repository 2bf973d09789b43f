"""The notebook's view of ``training/training.json``: tables, plain sentences and the history figure.

Everything here reads the chapter's record (or the models' ``history.parquet``) and trains nothing; kept
apart from the chapter so the book's prose and tables have one place.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd

from .regimes import BACKGROUND_ROBUST, BASELINE, Regime
from .settings import MODELS, model_dir


# --------------------------------------------------------------------------- book helpers
def load_histories(run_dir: str | os.PathLike, items: list[Regime] | None = None) -> dict[str, pd.DataFrame]:
    """History per model; with several regimes the key names the regime too (``baseline compact``)."""
    items = items or [Regime(BASELINE, True)]
    out = {}
    for regime in items:
        for kind in MODELS:
            path = model_dir(run_dir, kind, regime) / "history.parquet"
            if path.exists():
                out[kind if len(items) == 1 else f"{regime.name} {kind}"] = pd.read_parquet(path)
    return out


def plot_history(histories: dict[str, pd.DataFrame]) -> Any:
    """Training loss, validation accuracy and validation macro-F1 per epoch, one line per model."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    panels = (("train_loss", "training loss (compact: with distillation)"),
              ("val_acc", "validation accuracy"), ("val_macro_f1", "validation macro-F1"))
    for kind, frame in histories.items():
        for ax, (column, title) in zip(axes, panels, strict=True):
            line, = ax.plot(frame["epoch"], frame[column], marker="o", label=kind)
            ema = f"{column}_ema"
            if ema in frame and frame[ema].notna().any():
                ax.plot(frame["epoch"], frame[ema], linestyle="--", color=line.get_color(),
                        label=f"{kind} (EMA)")
            best = frame[frame["best"]]
            if column != "train_loss" and len(best):
                ax.scatter(best["epoch"].iloc[-1:], best[f"selected_{column.split('_', 1)[1]}"].iloc[-1:],
                           s=120, facecolors="none", edgecolors=line.get_color(), zorder=3)
            ax.set_title(title)
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[1:]:  # the scores' own range: on a 0-1 axis epochs at 0.96-0.99 read as one flat line
        values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
                                or [[]])
        values = values[np.isfinite(values)]
        low = float(values.min()) if len(values) else 0.0
        ax.set_ylim(max(0.0, low - 0.15 * (1.0 - low) - 0.005), 1.0 + 0.05 * (1.0 - low) + 0.002)
    axes[2].legend(fontsize=7, loc="lower right")
    fig.suptitle("Training history (circle: the selected checkpoint)")
    fig.tight_layout()
    return fig


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return flat


def hyperparameter_table(record: dict[str, Any]) -> pd.DataFrame:
    """Every hyper-parameter of both models side by side (flattened keys)."""
    columns = {kind: _flatten(m["hyperparameters"]) for kind, m in record["models"].items()}
    frame = pd.DataFrame(columns).rename_axis("hyper-parameter").reset_index()
    return frame.astype({k: "string" for k in columns}).fillna("—")


def results_table(record: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for kind, m in record["models"].items():
        rows.append({"model": kind, "arch": m["arch"], "parameters": m["params"],
                     "started from": "pretrained" if m["pretrained"]["pretrained"] else "scratch",
                     "teacher": "reference" if m["teacher"] else "none", "best epoch": m["best_epoch"],
                     "weights": m["best_weights"], "val accuracy": m["val_acc"],
                     "val macro-F1": m["val_macro_f1"],
                     "test accuracy": m["test_acc"], "test macro-F1": m["test_macro_f1"],
                     "train images/s": m["images_per_s"], "wall seconds": m["wall_seconds"]})
    return pd.DataFrame(rows)


def describe_models(record: dict[str, Any]) -> str:
    """Plain sentences: what each model is and which weights it started from."""
    lines = []
    for kind, m in record["models"].items():
        start = m["pretrained"]["description"]
        teacher = (f" It learned from the reference's best checkpoint (SHA-256 "
                   f"`{m['teacher']['checkpoint_sha256'][:12]}…`) by knowledge distillation at temperature "
                   f"T = {m['teacher']['temperature']} with weight α = {m['teacher']['alpha']} on the "
                   "T²-scaled KL term." if m["teacher"] else
                   (" It was trained on the labels alone, without a teacher." if kind == "compact" else ""))
        sha = m["pretrained"].get("sha256")
        lines.append(f"- **{kind}**: `{m['arch']}` with a {m['num_classes']}-way head, "
                     f"{m['params']:,} parameters, {m['image_size']}×{m['image_size']} inputs; "
                     f"started from {start}{f' (SHA-256 `{sha}`)' if sha else ''}.{teacher}"
                     f"{describe_frozen(m)}")
    return "\n".join(lines)


def describe_frozen(model: dict[str, Any]) -> str:
    """What of a model stayed at its starting weights (empty when every layer trained)."""
    groups = int((model.get("hyperparameters") or {}).get("frozen_groups") or 0)
    trainable = model.get("trainable_params")
    if not groups or trainable is None:
        return ""
    return (f" Its first {groups} layer groups (the stem and the first {groups - 1} stages, "
            f"{model['params'] - trainable:,} parameters) kept their pretrained weights and batch-norm "
            f"statistics; {trainable:,} parameters were trained.")


def describe_starts(record: dict[str, Any]) -> str:
    """One sentence on which models started from pretrained weights and which from scratch."""
    tuned = [k for k, m in record["models"].items() if m["pretrained"]["pretrained"]]
    scratch = [k for k in record["models"] if k not in tuned]
    if not tuned:
        return ("No pretrained weights were used, so **both models were trained from scratch**; their "
                "numbers say what these architectures learn from this corpus alone, not what a "
                "pretrained model reaches.")
    text = f"**Fine-tuned from pretrained weights:** {', '.join(tuned)}."
    if scratch:
        text += f" **Trained from scratch:** {', '.join(scratch)}."
    return text


def regime_table(record: dict[str, Any]) -> pd.DataFrame:
    """Both models of every regime: validation and test macro-F1, wall time, where the files are."""
    rows = []
    for name, entry in (record.get("regimes") or {}).items():
        for kind, m in entry["models"].items():
            rows.append({"regime": name, "shipped": entry["shipped"], "model": kind,
                         "folder": entry["folder"], "val macro-F1": m["val_macro_f1"],
                         "test macro-F1": m["test_macro_f1"],
                         "test accuracy": m["test_acc"], "wall seconds": m["wall_seconds"],
                         "checkpoint SHA-256": m["checkpoint_sha256"][:12]})
    return pd.DataFrame(rows)


def describe_regimes(record: dict[str, Any]) -> str:
    """Which regimes ran, which ships, and what the background-robust regime pasted on (from the record)."""
    entries = record.get("regimes") or {}
    names = ", ".join(f"`{n}`" for n in entries) or "`baseline`"
    text = [f"Regimes trained: {names}; the shipped regime is **`{record.get('shipped_regime', BASELINE)}`** "
            "(its files are on the chain's plain paths; the other regimes' files one folder deeper)."]
    robust = (entries.get(BACKGROUND_ROBUST) or {}).get("background")
    if robust:
        pool, masks, p = robust["pool"], robust["masks"], robust["params"]
        kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in pool["per_kind"].items())
        text.append(
            f"The background-robust regime cut each train leaf out with its mask ({masks['usable']:,} of "
            f"{masks['rows']:,} train photos have a usable mask; mean leaf share "
            f"{masks['mean_leaf_share']:.2f}; masks SHA-256 `{masks['sha256'][:12]}…`) and pasted it, on "
            f"{p['paste_p']:.0%} of samples, on one of {pool['n']} backgrounds ({kinds}; pool SHA-256 "
            f"`{pool['sha256'][:12]}…`), the leaf scaled to {p['leaf_scale'][0]:g}–{p['leaf_scale'][1]:g} of "
            f"its lab size, then changed light ({p['light'][0]:g}–{p['light'][1]:g}), white balance "
            f"(±{p['white_balance']:g} per channel), gamma and focus on {p['photometric_p']:.0%} of pasted "
            f"samples. Pool sources: {pool['sources']}.")
    return "\n\n".join(text)


def describe_penalty(record: dict[str, Any]) -> str:
    """One sentence on the attribution penalty: whether it ran and why, from its measured cost."""
    decision = record.get("attribution_penalty") or {}
    if not decision:
        return "The off-leaf attribution penalty was not considered in this run."
    status = "ran" if decision.get("ran") else "was **not run**"
    cost = decision.get("cost") or {}
    timing = (f" (plain step {cost['plain_step_s']:.2f} s, penalised step {cost['penalised_step_s']:.2f} s)"
              if cost.get("plain_step_s") else "")
    return f"The off-leaf attribution penalty {status}: {decision['reason']}{timing}."
