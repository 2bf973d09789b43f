"""Chapter 8 (per-class analysis): the model-state table, paired deltas, per-class table, support bins,
error taxonomy and transitions, with the chapter's prose and tables.

Outputs (``analysis/``): ``per_class.json`` and Parquets ``state_metrics``, ``paired_deltas``,
``mcnemar``, ``per_class``, ``support_bins``, ``taxonomy``, ``transitions``, ``identity`` (and
``regime_deltas`` when the run trains more than one regime); PNG figures.  The states are loaded and
paired by :mod:`.states`; the plots are drawn by :mod:`.figures`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core import metrics, registry
from ..core.config import RunContext
from ..core.evidence import Chapter
from ..core.model_states import (
    ERROR_KINDS,
    PAIRS,
    STATE_LABELS,
    STATE_NAMES,
    STATES,
    TRANSITIONS,
    PairedStates,
    states_for,
)
from ..training import regimes
from .figures import (
    plot_confusion,
    plot_error_gallery,
    plot_paired_deltas,
    plot_state_metrics,
    plot_support_bins,
    plot_taxonomy,
)
from .states import (
    FOLDER,
    StateMismatch,
    _test_access,
    analysis_params,
    class_table,
    load_states,
    pair_key,
    pair_states,
)


# --------------------------------------------------------------------------- error taxonomy
def classify_errors(y_true: np.ndarray, y_pred: np.ndarray, classes: pd.DataFrame) -> np.ndarray:
    """Operational kind of each error (None where the prediction is right).

    Exclusive, first match wins: cross-crop (the crop differs; a class without a crop differs from
    every class that names one), healthy→disease, disease→healthy, broad↔specific (one label names a
    category, the other a disease), else within-crop (two diseases, or two healthy labels, of one crop).
    """
    crop = classes.set_index("label")["crop"].fillna("").to_numpy()
    kind = classes.set_index("label")["type"].to_numpy()
    true_crop, pred_crop = crop[y_true], crop[y_pred]
    true_type, pred_type = kind[y_true], kind[y_pred]
    healthy_t, healthy_p = true_type == "healthy", pred_type == "healthy"
    conditions = [y_true == y_pred, true_crop != pred_crop, healthy_t & ~healthy_p, ~healthy_t & healthy_p,
                  ~healthy_t & ~healthy_p & (true_type != pred_type)]
    return np.select(conditions, [None, *ERROR_KINDS[:4]], default=ERROR_KINDS[4]).astype(object)


def taxonomy_counts(paired: PairedStates, classes: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for state in paired.preds:
        kinds = pd.Series(classify_errors(paired.y, paired.preds[state], classes)).dropna()
        for kind in ERROR_KINDS:
            errors = int((kinds == kind).sum())
            rows.append({"state": state, "kind": kind, "errors": errors,
                         "share_of_errors": errors / len(kinds) if len(kinds) else 0.0,
                         "share_of_rows": errors / len(paired.y)})
    return pd.DataFrame(rows)


def transitions(paired: PairedStates, classes: pd.DataFrame, a: str = "reference",
                b: str = "pte") -> pd.DataFrame:
    """Row-level change from state a to b, with the kind of b's error where b is wrong."""
    ok_a, ok_b = paired.correct(a), paired.correct(b)
    same = paired.preds[a] == paired.preds[b]
    change = np.select([ok_a & ok_b, ok_a & ~ok_b, ~ok_a & ok_b, ~ok_a & same], list(TRANSITIONS[:4]),
                       default=TRANSITIONS[4])
    frame = pd.DataFrame({"transition": change,
                          "kind": classify_errors(paired.y, paired.preds[b], classes)})
    frame["kind"] = frame["kind"].fillna("(correct)")
    frame["transition"] = pd.Categorical(frame["transition"], categories=TRANSITIONS, ordered=True)
    table = frame.groupby(["transition", "kind"], observed=True).size().rename("rows").reset_index()
    table["transition"] = table["transition"].astype(str)
    return table.assign(from_state=a, to_state=b)


# --------------------------------------------------------------------------- chapter 8
def _ci(values: np.ndarray, level: float) -> dict[str, float | None]:
    low, high = metrics.interval(values, level)
    return {"lo": defined(low), "hi": defined(high)}


def run_per_class(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Chapter 8: the model-state table, paired deltas, per-class table, support bins, error taxonomy."""
    params = analysis_params(ctx, **options)
    level = float(params["ci_level"])
    identity = registry.check(ctx.run_dir)  # every artifact so far still matches its registered SHA-256
    ch = Chapter(ctx.run_dir, "per_class", folder=FOLDER)
    from ..split import load_frozen

    frozen = load_frozen(ch)
    paired = pair_states(load_states(ch), frozen.rows, len(frozen.class_names))
    classes = class_table(frozen.class_map, frozen.rows)
    y, n_classes = paired.y, paired.n_classes
    scored = np.flatnonzero(np.bincount(y, minlength=n_classes) > 0)
    indices = metrics.bootstrap_indices(len(y), int(params["bootstrap"]), int(params["seed"]))
    boot = {s: metrics.bootstrap_metrics(y, paired.preds[s], scored, n_classes, indices) for s in STATE_NAMES}

    state_rows = [{"state": s, "state_label": STATE_LABELS[s], "model_state": paired.model_states[s],
                   "metric": m, "value": boot[s].point[m], **_ci(boot[s].resampled[m], level)}
                  for s in STATE_NAMES for m in metrics.METRICS]
    state_table = pd.DataFrame(state_rows)
    paired_table = pd.concat([metrics.paired_delta_table(boot[a], boot[b], level=level)
                              .assign(pair=pair_key(a, b), from_state=a, to_state=b) for a, b in PAIRS],
                             ignore_index=True)
    mcnemar = pd.DataFrame([{"pair": pair_key(a, b), "from_state": a, "to_state": b,
                             **metrics.mcnemar_exact(paired.correct(a), paired.correct(b))}
                            for a, b in PAIRS])
    per_class = per_class_table(paired, boot, classes, scored, params)
    bins = support_bin_table(per_class, boot, scored, params["support_bins"], level)
    taxonomy = taxonomy_counts(paired, classes)
    moves = transitions(paired, classes)

    for name, frame in {"state_metrics": state_table, "paired_deltas": paired_table, "mcnemar": mcnemar,
                        "per_class": per_class, "support_bins": bins, "taxonomy": taxonomy,
                        "transitions": moves, "identity": identity}.items():
        ch.write_parquet(f"{FOLDER}/{name}.parquet", frame)

    figures = {"state_metrics": plot_state_metrics(state_table),
               "paired_deltas": plot_paired_deltas(paired_table),
               "support_bins": plot_support_bins(bins), "taxonomy": plot_taxonomy(taxonomy),
               "confusion": plot_confusion(paired, classes, params["confusion_state"]),
               "error_gallery": plot_error_gallery(paired, per_class, ctx, params)}
    figure_paths = {}
    for name, fig in figures.items():
        figure_paths[name] = f"{FOLDER}/{name}.png"
        ch.save_figure(fig, figure_paths[name], dpi=110)

    summary = per_class_figures(state_table, paired_table, mcnemar, per_class, bins, taxonomy, moves,
                                paired, scored, params)
    compared = regime_deltas(ctx, ch, frozen, paired, indices, scored, level)
    if compared is not None:
        ch.write_parquet(f"{FOLDER}/regime_deltas.parquet", compared)
    return ch.finish(figures=summary, plots=figure_paths, params=params,
                     test_rows_read=_test_access(paired, "scoring the recorded predictions of every model "
                                                 "state; thumbnails of the gallery's errors"),
                     states=_state_identity(ctx, paired),
                     regimes=None if compared is None else {
                         "shipped": regimes.shipped(regimes.of_run(ctx)).name,
                         "deltas": f"{FOLDER}/regime_deltas.parquet",
                         "table": compared.to_dict("records")})


def regime_deltas(ctx: RunContext, ch: Chapter, frozen: Any, paired: PairedStates, indices: np.ndarray,
                  scored: np.ndarray, level: float) -> pd.DataFrame | None:
    """Each regime against the baseline, state by state, on the same test rows and the same resamples
    (paired deltas); None when the run trains one regime."""
    items = regimes.of_run(ctx)
    base = regimes.reference_regime(items)
    if len(items) < 2 or base is None:
        return None
    boots = {}
    for regime in items:
        mine = paired if regime.shipped else pair_states(
            load_states(ch, states_for(regime)), frozen.rows, paired.n_classes)
        if not mine.rows["row_id"].equals(paired.rows["row_id"]):
            raise StateMismatch(f"regime {regime.name} was scored on other test rows than the shipped regime")
        boots[regime.name] = {s: metrics.bootstrap_metrics(paired.y, mine.preds[s], scored, paired.n_classes,
                                                           indices) for s in STATE_NAMES}
    tables = [metrics.paired_delta_table(boots[base.name][s], boots[r.name][s], level=level)
              .assign(regime=r.name, against=base.name, state=s, state_label=STATE_LABELS[s])
              for r in items if r.name != base.name for s in STATE_NAMES]
    return pd.concat(tables, ignore_index=True)


def regime_prose(compared: dict[str, Any]) -> str:
    """One sentence per compared regime: the macro-F1 change of each state on the locked test."""
    table = pd.DataFrame(compared["table"])
    lines = [f"Shipped regime: **`{compared['shipped']}`**."]
    for regime, part in table[table["metric"] == "macro_f1"].groupby("regime", sort=False):
        changes = "; ".join(
            f"{STATE_LABELS[r.state]} {100 * r.value_b:.2f} against {100 * r.value_a:.2f} "
            f"({100 * r.delta:+.2f} points [{100 * r.lo:+.2f}, {100 * r.hi:+.2f}])"
            for r in part.itertuples())
        lines.append(f"- `{regime}` against `{part['against'].iloc[0]}`, test macro-F1: {changes}.")
    return "\n".join(lines)


def _state_identity(ctx: RunContext, paired: PairedStates) -> dict[str, Any]:
    """Each state's file, model-state SHA-256 and how often it read the locked test (test_access.jsonl)."""
    from ..split.locked_test import read_accesses

    reads = read_accesses(ctx.run_dir)["model_state"].value_counts()
    return {s.name: {"label": s.label, "file": s.path, "model_state": paired.model_states[s.name],
                     "test_reads": int(reads.get(paired.model_states[s.name], 0))} for s in STATES}


def per_class_table(paired: PairedStates, boot: dict[str, metrics.BootstrapMetrics], classes: pd.DataFrame,
                    scored: np.ndarray, params: dict[str, Any]) -> pd.DataFrame:
    table = classes.copy()
    bins = metrics.assign_support_bins(table["train_support"], params["support_bins"])
    table["support_bin"] = np.asarray(bins).astype(str)
    table["unstable"] = table["test_support"] < int(params["min_test_support"])
    for state in STATE_NAMES:
        scores = metrics.per_class_scores(paired.y, paired.preds[state], paired.n_classes)
        for column in ("precision", "recall", "f1"):
            table[f"{column}_{state}"] = scores[column].to_numpy()
    for a, b in PAIRS:
        table[f"delta_f1_{pair_key(a, b)}"] = table[f"f1_{b}"] - table[f"f1_{a}"]
    table["delta_recall_reference_to_pte"] = table["recall_pte"] - table["recall_reference"]
    deltas = boot["pte"].class_f1 - boot["reference"].class_f1
    level = float(params["ci_level"])
    low, high = np.nanpercentile(deltas, [50 * (1 - level), 50 * (1 + level)], axis=0)
    table["delta_f1_reference_to_pte_lo"], table["delta_f1_reference_to_pte_hi"] = low, high
    # a class without test rows has no score; keep it visible but empty
    table.loc[~table["label"].isin(scored), [c for c in table.columns if c.startswith(
        ("precision_", "recall_", "f1_", "delta_"))]] = np.nan
    return table


EMPTY_BIN = "no classes in this bin"
UNSCORED_BIN = "no class in this bin has test rows"


def defined(value: Any) -> float | None:
    """A number for the JSON record, or None where the statistic is undefined (NaN / inf)."""
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def support_bin_table(per_class: pd.DataFrame, boot: dict[str, metrics.BootstrapMetrics], scored: np.ndarray,
                      edges: list[int], level: float) -> pd.DataFrame:
    """Macro-F1 (mean class F1) of the classes in each training-support bin, per state, and the change.

    A bin without classes (or without a class that has test rows) has no macro-F1: its scores are
    null and ``note`` says why, e.g. every class of a corpus with ≥ 200 training images per class
    leaves the bins below 200 empty.
    """
    rows = []
    for label in metrics.support_bin_labels(edges):
        members = per_class[per_class["support_bin"] == label]
        in_bin = np.intersect1d(members["label"].to_numpy(), scored)
        row: dict[str, Any] = {"bin": label, "classes": len(members), "classes_scored": len(in_bin),
                               "train_rows": int(members["train_support"].sum()),
                               "test_rows": int(members["test_support"].sum()),
                               "unstable_classes": int(members["unstable"].sum()),
                               "note": None if len(in_bin) else (UNSCORED_BIN if len(members) else EMPTY_BIN)}
        scored_members = members[members["label"].isin(in_bin)]
        for state in STATE_NAMES:
            row[f"macro_f1_{state}"] = float(scored_members[f"f1_{state}"].mean()) if len(in_bin) else None
        low = high = None
        if len(in_bin):
            row["delta_reference_to_pte"] = row["macro_f1_pte"] - row["macro_f1_reference"]
            resampled = (boot["pte"].class_f1[:, in_bin].mean(1)
                         - boot["reference"].class_f1[:, in_bin].mean(1))
            low, high = metrics.interval(resampled, level)
        else:
            row["delta_reference_to_pte"] = None
        rows.append({**row, "lo": low, "hi": high})
    table = pd.DataFrame(rows)
    numbers = [c for c in table if c.startswith(("macro_f1_", "delta_")) or c in ("lo", "hi")]
    table[numbers] = table[numbers].astype("float64")  # null stays null in the Parquet
    return table


def per_class_figures(state_table: pd.DataFrame, paired_table: pd.DataFrame, mcnemar: pd.DataFrame,
                      per_class: pd.DataFrame, bins: pd.DataFrame, taxonomy: pd.DataFrame,
                      moves: pd.DataFrame, paired: PairedStates, scored: np.ndarray,
                      params: dict[str, Any]) -> dict[str, Any]:
    """The JSON figures: plain nested dicts the book's prose and the evidence summary read."""
    states = {s: {r.metric: {"value": defined(r.value), "lo": defined(r.lo), "hi": defined(r.hi)}
                  for r in state_table[state_table["state"] == s].itertuples()} for s in STATE_NAMES}
    deltas: dict[str, Any] = {}
    for r in paired_table.itertuples():
        deltas.setdefault(r.pair, {})[r.metric] = {"delta": defined(r.delta), "lo": defined(r.lo),
                                                   "hi": defined(r.hi),
                                                   "excludes_zero": bool(r.excludes_zero)}
    for r in mcnemar.itertuples():
        deltas[r.pair]["mcnemar"] = {"only_from_correct": r.only_a_correct,
                                     "only_to_correct": r.only_b_correct, "p_value": r.p_value}
    per_kind = taxonomy.pivot(index="kind", columns="state", values="errors")
    by_transition = moves.groupby("transition")["rows"].sum()
    worst = per_class[per_class["label"].isin(scored)].nsmallest(5, "delta_f1_reference_to_pte")
    return {
        "n_test_rows": len(paired.y), "n_classes": paired.n_classes, "n_classes_scored": len(scored),
        "classes_without_test_rows": per_class.loc[~per_class["label"].isin(scored), "class_name"].tolist(),
        "bootstrap_resamples": int(params["bootstrap"]), "bootstrap_seed": int(params["seed"]),
        "ci_level": float(params["ci_level"]),
        "states": states, "paired": deltas,
        "unstable_classes": int(per_class["unstable"].sum()),
        "min_test_support": int(params["min_test_support"]),
        "support_bins": {r.bin: {"classes": r.classes, "test_rows": r.test_rows,
                                 "macro_f1_reference": defined(r.macro_f1_reference),
                                 "macro_f1_pte": defined(r.macro_f1_pte),
                                 "delta": defined(r.delta_reference_to_pte), "lo": defined(r.lo),
                                 "hi": defined(r.hi), "note": r.note if isinstance(r.note, str) else None}
                         for r in bins.itertuples()},
        "errors": {s: {k: int(per_kind.loc[k, s]) for k in ERROR_KINDS} for s in STATE_NAMES},
        "transitions_reference_to_pte": {t: int(by_transition.get(t, 0)) for t in TRANSITIONS},
        "largest_f1_losses": [{"class_name": r.class_name, "delta_f1": defined(r.delta_f1_reference_to_pte),
                               "test_support": r.test_support, "unstable": bool(r.unstable)}
                              for r in worst.itertuples()],
    }


# --------------------------------------------------------------------------- prose
def points(value: float) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{100 * value:+.2f}"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def per_class_prose(record: dict[str, Any]) -> str:
    """Markdown sentences with every number read from ``analysis/per_class.json``."""
    f = record["figures"]
    whole = f["paired"][pair_key("reference", "pte")]
    level = round(100 * f["ci_level"])
    lines = [
        f"The four model states were scored on the same {f['n_test_rows']} locked test rows over "
        f"{f['n_classes_scored']} classes; intervals are paired percentile bootstraps ({level} %, "
        f"{f['bootstrap_resamples']} resamples drawn once and shared by every state).",
        "",
        "From the float reference to the .pte on the runtime:",
        "",
    ]
    for metric in metrics.PAIRED_METRICS:
        d = whole[metric]
        verdict = "excludes zero" if d["excludes_zero"] else "spans zero"
        lines.append(f"- {metrics.METRIC_LABELS[metric]}: {points(d['delta'])} points "
                     f"(interval {points(d['lo'])} to {points(d['hi'])}; {verdict})")
    reads = record.get("states", {})
    if reads:
        lines += ["", "Locked-test reads logged per model state (`test_access.jsonl`): "
                  + ", ".join(f"{STATE_LABELS[n]} {v['test_reads']}" for n, v in reads.items()) + "."]
    mc = whole["mcnemar"]
    lines += ["", "Exact McNemar test on top-1 correctness: "
              f"{mc['only_from_correct']} rows only the reference got right, "
              f"{mc['only_to_correct']} only the .pte got right, p = {mc['p_value']:.3g}.", ""]
    for name, b in f["support_bins"].items():
        if b["delta"] is None:
            lines.append(f"- training support {name}: {b.get('note') or EMPTY_BIN}")
        else:
            lines.append(f"- training support {name}: {_count(b['classes'], 'class', 'classes')}, "
                         f"macro-F1 change {points(b['delta'])} points "
                         f"(interval {points(b['lo'])} to {points(b['hi'])})")
    lines += ["", f"{_count(f['unstable_classes'], 'class has', 'classes have')} fewer than "
              f"{f['min_test_support']} test rows; their per-class numbers are flagged unstable."]
    return "\n".join(lines)


def state_metric_table(record: dict[str, Any]) -> pd.DataFrame:
    """Chapter 8's model-state table: one row per state, one column per metric, in percent with the
    bootstrap interval ("71.25 (68.10–74.30)")."""
    f = record["figures"]

    def cell(stat: dict[str, Any]) -> str:
        if stat["value"] is None:
            return "undefined"
        bounds = "" if stat["lo"] is None else f" ({100 * stat['lo']:.2f}–{100 * stat['hi']:.2f})"
        return f"{100 * stat['value']:.2f}{bounds}"

    rows = [{"state": STATE_LABELS[state], **{f"{metrics.METRIC_LABELS[m]} %": cell(stats[m])
                                              for m in metrics.METRICS if m in stats}}
            for state, stats in f["states"].items()]
    return pd.DataFrame(rows)


def state_identity_table(record: dict[str, Any]) -> pd.DataFrame:
    """Which file each state's predictions came from, its model-state SHA-256 and its locked-test reads."""
    return pd.DataFrame([{"state": v["label"], "prediction file": v["file"], "model state (SHA-256)":
                          v["model_state"], "locked-test reads": v["test_reads"]}
                         for v in record.get("states", {}).values()])
