"""The learning curve's figure, sentence and table, rendered from ``field/curve.json`` (no typed numbers)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from .curve_draws import FINETUNE, FROZEN, LEARNER_LABELS

COLOURS = {FROZEN: "tab:blue", FINETUNE: "tab:orange"}
SHORT = {FROZEN: "frozen features + logistic regression", FINETUNE: "fine-tuned compact model"}


def _axis(ax: Any, ks: list[int]) -> None:
    # symlog: linear below 10 photos, logarithmic above, so k = 0 sits on the axis beside 10 ... 500
    ax.set_xscale("symlog", linthresh=10, linscale=0.6)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlim(-1, max(ks) * 1.15 if ks else 1)
    ax.set_xlabel("labelled field photos per class added to the lab photos (k)")
    ax.grid(alpha=0.3)


def learning_curve_figure(by_k: dict[str, list[dict[str, Any]]], params: dict[str, Any]) -> Figure:
    """Left: field accuracy against k with the (mean) 95 % interval as a band and every draw's spread as a
    bar, the target accuracies as dashed lines.  Right: lab test macro-F1 against k, same axis."""
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    field_ax, lab_ax = fig.subplots(1, 2, sharex=True)
    ks = sorted({p["k"] for points in by_k.values() for p in points} | set(params["k"]))
    level = round(float(params["ci_level"]) * 100)
    for learner, points in by_k.items():
        colour = COLOURS.get(learner, "tab:gray")
        k = [p["k"] for p in points]
        field_ax.fill_between(k, [p["field_accuracy_lo"] for p in points],
                              [p["field_accuracy_hi"] for p in points], color=colour, alpha=0.18, lw=0)
        field_ax.plot(k, [p["field_accuracy"] for p in points], "o-", color=colour,
                      label=SHORT.get(learner, learner))
        unrelated = [(p["k"], p["field_accuracy_no_relative"]) for p in points
                     if p["field_accuracy_no_relative"] is not None]
        if unrelated:
            field_ax.plot(*zip(*unrelated, strict=True), ":", color=colour, lw=1.2,
                          label="… photos without a relative in field-train")
        spread = [p for p in points if p["draws"] > 1]
        if spread:
            field_ax.vlines([p["k"] for p in spread], [p["field_accuracy_draw_min"] for p in spread],
                            [p["field_accuracy_draw_max"] for p in spread], color=colour, lw=3, alpha=0.6)
        lab_ax.fill_between(k, [p["lab_test_macro_f1_lo"] for p in points],
                            [p["lab_test_macro_f1_hi"] for p in points], color=colour, alpha=0.18, lw=0)
        lab_ax.plot(k, [p["lab_test_macro_f1"] for p in points], "o-", color=colour,
                    label=SHORT.get(learner, learner))
    for target in params["targets"]:
        field_ax.axhline(float(target), color="k", ls="--", lw=0.8)
        field_ax.annotate(f"{round(float(target) * 100)} %", (ks[0], float(target)), xytext=(2, 2),
                          textcoords="offset points", fontsize=8)
    field_ax.set_ylabel(f"field accuracy ({level} % interval)")
    field_ax.set_title("Field cohort")
    lab_ax.set_ylabel(f"lab test macro-F1 ({level} % interval)")
    lab_ax.set_title("Lab test: does the lab suffer?")
    for ax in (field_ax, lab_ax):
        _axis(ax, ks)
        ax.set_ylim(0, 1.02)
    field_ax.legend(loc="lower right", fontsize=8)
    return fig


def _k_phrase(entry: dict[str, Any]) -> str:
    if entry["k"] is None:
        return f"not reached (up to k = {entry['largest_k_tried']})"
    safe = entry["k_lower_bound"]
    tail = (f"; its interval's lower end clears it from k = {safe}" if safe is not None and safe != entry["k"]
            else "" if safe is not None else "; the interval's lower end never clears it")
    return f"k = {entry['k']}{tail}"


def curve_headline(facts: dict[str, Any]) -> str:
    """The chapter's sentence: the smallest k reaching each target field accuracy, per learner."""
    if facts.get("status") != "measured":
        return f"**The learning curve was not measured.** {facts['reason']}."
    draws = facts["params"]["draws"]
    lines = [f"Smallest number of labelled field photos per class (k) at which field accuracy reaches each "
             f"target (mean over {draws} seeded draws for the frozen-feature learner, one for fine-tuning):"]
    for learner, entries in facts["smallest_k"].items():
        targets = "; ".join(f"{round(e['target'] * 100)} %: {_k_phrase(e)}" for e in entries)
        lines.append(f"- **{SHORT.get(learner, learner)}** — {targets}.")
    field = facts["field_train"]
    per_class = ", ".join(f"{c} {n}" for c, n in field["per_class"].items())
    lines.append(f"Field-train holds {field['train_rows']} train photos ({per_class}); a class with fewer "
                 "than k gives all it has (the table's smallest per-class count). The cohort: "
                 f"{facts['cohort']['n']} photos, never trained or selected on.")
    for k, note in (facts.get("finetune") or {}).get("reused", {}).items():
        lines.append(f"The fine-tuned point at k = {k} was not trained again: it is "
                     f"{note.removeprefix('reused: ')}.")
    return "\n".join(lines)


def curve_table(facts: dict[str, Any]) -> pd.DataFrame:
    """Per learner and k: field accuracy and macro-F1, lab test macro-F1 (means over draws, intervals)."""
    def cell(point: dict[str, Any], name: str) -> str:
        if point[name] is None:
            return "–"
        return (f"{point[name] * 100:.1f} [{point[name + '_lo'] * 100:.1f}, {point[name + '_hi'] * 100:.1f}]"
                if point[name + "_lo"] is not None else f"{point[name] * 100:.1f}")

    rows = []
    for learner, points in facts.get("by_k", {}).items():
        for p in points:
            rows.append({"learner": LEARNER_LABELS.get(learner, learner), "k": p["k"],
                         "smallest per-class k used": p["n_field_per_class_min"], "draws": p["draws"],
                         "field accuracy %": cell(p, "field_accuracy"),
                         "field macro-F1 %": cell(p, "field_macro_f1"),
                         "field accuracy, no relative in field-train %":
                             cell(p, "field_accuracy_no_relative"),
                         "lab test macro-F1 %": cell(p, "lab_test_macro_f1")})
    return pd.DataFrame(rows)
