"""Chapters 8 (per-class analysis) and 9 (fruit-label slice): paired comparisons of four model states.

The four states — float reference, float compact, converted INT8 graph, the .pte on its runtime —
were scored on the same locked test rows with the same frozen class order.  Every comparison here is
paired: the chapter first proves the rows and labels are identical across states, then draws one
bootstrap index matrix and scores every state on it (see :mod:`cropcop_utils.metrics`).

Outputs (``analysis/``): ``per_class.json`` and Parquets ``state_metrics``, ``paired_deltas``,
``mcnemar``, ``per_class``, ``support_bins``, ``taxonomy``, ``transitions``, ``identity``; PNG figures.
Chapter 9 writes ``fruit_slice.json``, ``fruit_slice.parquet`` (slice classes) and its figure.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import metrics, regimes, registry
from .analysis_figures import (
    plot_confusion,
    plot_error_gallery,
    plot_paired_deltas,
    plot_slice,
    plot_state_metrics,
    plot_support_bins,
    plot_taxonomy,
)
from .config import RunContext
from .evidence import Chapter
from .model_states import (
    ERROR_KINDS,
    PAIRS,
    PREDICTION_COLUMNS,
    STATE_LABELS,
    STATE_NAMES,
    STATES,
    TRANSITIONS,
    ModelState,
    PairedStates,
    states_for,
)

FOLDER = "analysis"



DEFAULTS: dict[str, Any] = {
    "bootstrap": 1000, "seed": 0, "ci_level": 0.95, "min_test_support": 30,
    "support_bins": [100, 200, 500, 1000], "confusion_state": "pte", "gallery_state": "pte",
    "gallery_classes": 4, "gallery_per_class": 6, "thumb_px": 96,
    "slice": {"field": "fruit", "equals": True},
}


class MissingModelState(FileNotFoundError):
    """A model state's prediction file is absent (the chain stopped before the chapter that writes it)."""


class StateMismatch(ValueError):
    """Model states that do not cover identical test rows with identical labels cannot be compared."""


class SliceRuleError(ValueError):
    """The slice rule names a class-map field that does not exist."""


def pair_key(a: str, b: str) -> str:
    return f"{a}_to_{b}"


def analysis_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """The profile's ``analysis`` section over the defaults (older run folders may lack the section)."""
    params = {**DEFAULTS, **ctx.section("analysis"), **options}
    for key in ("confusion_state", "gallery_state"):
        if params[key] not in STATE_NAMES:
            raise ValueError(f"analysis.{key} = {params[key]!r}; choose one of {', '.join(STATE_NAMES)}")
    return params


# --------------------------------------------------------------------------- loading and pairing
def load_states(ch: Chapter, states: tuple[ModelState, ...] = STATES,
                required: bool = True) -> dict[str, pd.DataFrame]:
    """Verified reads of the prediction files; every absent one is named in one error."""
    missing = [s for s in states if not ch.path(s.path).exists()]
    if missing and required:
        named = "; ".join(f"{s.path} ({s.label}, written by chapter '{s.chapter}')" for s in missing)
        raise MissingModelState(
            f"chapter '{ch.name}' compares {len(states)} model states but {len(missing)} prediction "
            f"file(s) are missing from {ch.run_dir}: {named}. Run the chain through chapter 07 "
            "(runtime) first.")
    frames = {}
    for state in states:
        if state not in missing:
            frame = ch.read_parquet(state.path)
            absent = [c for c in PREDICTION_COLUMNS if c not in frame.columns]
            if absent:
                raise StateMismatch(f"{state.path} lacks column(s) {absent}; rerun chapter '{state.chapter}'")
            frames[state.name] = frame
    return frames


def pair_states(frames: dict[str, pd.DataFrame], split_rows: pd.DataFrame, n_classes: int) -> PairedStates:
    """Refuse unless every state covers the same test rows (row_id set) with the same label per row,
    and those are the frozen split's test rows and labels."""
    path_of = {s.name: s.path for s in STATES}
    first = next(iter(frames))
    base = frames[first].set_index("row_id")
    for name, frame in frames.items():
        duplicated = frame["row_id"].duplicated()
        if duplicated.any():
            raise StateMismatch(f"{path_of[name]} lists {int(duplicated.sum())} row_id(s) twice "
                                f"(e.g. {frame.loc[duplicated, 'row_id'].iloc[0]})")
        if frame["model_state"].nunique() > 1:
            raise StateMismatch(f"{path_of[name]} mixes {frame['model_state'].nunique()} model states")
        only_here = set(frame["row_id"]) - set(base.index)
        only_base = set(base.index) - set(frame["row_id"])
        if only_here or only_base:
            raise StateMismatch(
                f"{path_of[name]} and {path_of[first]} do not cover identical test rows: "
                f"{len(only_here)} row(s) only in {path_of[name]}, {len(only_base)} only in "
                f"{path_of[first]}; "
                "paired comparisons need every state scored on the same locked test.")
        labels = frame.set_index("row_id")["label"].reindex(base.index)
        differ = labels != base["label"]
        if differ.any():
            raise StateMismatch(f"{path_of[name]} and {path_of[first]} disagree on the label of "
                                f"{int(differ.sum())} row(s) (e.g. {differ[differ].index[0]}): the class "
                                "order differs between model states.")
        bad = (frame["pred"] < 0) | (frame["pred"] >= n_classes)
        if bad.any():
            raise StateMismatch(f"{path_of[name]} predicts class indices outside 0..{n_classes - 1}: it was "
                                "made with another class map than split/class_map.json.")
    test = split_rows[split_rows["split"] == "test"].set_index("row_id")
    foreign = set(base.index) - set(test.index)
    if foreign:
        raise StateMismatch(f"{len(foreign)} predicted row(s) are not test rows of the frozen split "
                            f"(e.g. {sorted(foreign)[0]}); the predictions were made on another split.")
    unscored = set(test.index) - set(base.index)
    if unscored:
        raise StateMismatch(f"{len(unscored)} test row(s) of the frozen split have no prediction "
                            f"(e.g. {sorted(unscored)[0]}); rerun the chapters that score the test.")
    order = sorted(base.index)
    split_label = test.loc[order, "label"].to_numpy()
    if not np.array_equal(split_label, base.loc[order, "label"].to_numpy()):
        raise StateMismatch("prediction labels disagree with split/split.parquet: the predictions "
                            "were made with another class order; rerun training and what follows.")
    rows = pd.DataFrame({"row_id": order, "label": split_label.astype(np.int64),
                         "rel_path": test.loc[order, "rel_path"].to_numpy()})
    indexed = {name: frame.set_index("row_id").loc[order] for name, frame in frames.items()}
    return PairedStates(
        rows=rows,
        preds={n: f["pred"].to_numpy().astype(np.int64) for n, f in indexed.items()},
        margins={n: f["margin"].to_numpy().astype(np.float64) for n, f in indexed.items()},
        model_states={n: str(f["model_state"].iloc[0]) if len(f) else "" for n, f in indexed.items()},
        n_classes=n_classes,
    )


def _test_access(paired: PairedStates, purpose: str) -> dict[str, Any]:
    # No model runs here: the test rows are read as recorded predictions (and, for the gallery, pixels).
    return {"count": len(paired.rows), "via": "prediction records + split.load_frozen", "purpose": purpose}


def class_table(class_map: dict[str, Any], split_rows: pd.DataFrame) -> pd.DataFrame:
    """One row per frozen class: taxonomy fields plus train and test support (counted)."""
    defaults = {"crop": "", "condition": "", "type": "", "fruit": False, "pest": False}
    entries = sorted(class_map["classes"], key=lambda c: c["index"])
    classes = pd.DataFrame([{**defaults, **c} for c in entries])
    counts = pd.crosstab(split_rows["label"], split_rows["split"])
    out = pd.DataFrame({
        "label": classes["index"].astype(int), "class_name": classes["name"],
        "crop": classes["crop"].fillna(""), "condition": classes["condition"].fillna(""),
        "type": classes["type"], "fruit": classes["fruit"].astype(bool),
        "pest": classes["pest"].astype(bool)})
    for split in ("train", "test"):
        column = counts[split] if split in counts else pd.Series(dtype=int)
        out[f"{split}_support"] = out["label"].map(column).fillna(0).astype(int)
    return out


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
    from .split import load_frozen

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
    from .locked_test import read_accesses

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


# --------------------------------------------------------------------------- chapter 9
def slice_classes(class_map: dict[str, Any], rule: dict[str, Any]) -> list[int]:
    """Class indices the rule selects: ``{field: fruit, equals: true}`` → classes whose fruit flag is true."""
    if not isinstance(rule, dict) or "field" not in rule or "equals" not in rule:
        raise SliceRuleError("analysis.slice must be {field: <class-map field>, equals: <value>}, "
                             f"got {rule!r}")
    classes = class_map["classes"]
    fields = sorted({key for c in classes for key in c})
    if rule["field"] not in fields:
        raise SliceRuleError(f"analysis.slice.field {rule['field']!r} is not a class-map field; "
                             f"split/class_map.json has {', '.join(fields)}")
    return sorted(int(c["index"]) for c in classes if c.get(rule["field"]) == rule["equals"])


def run_fruit_slice(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Chapter 9: mean recall and F1 of the fruit-label slice per state, with paired intervals.

    Exploratory and descriptive: the slice was defined after the study's main comparisons.
    """
    params = analysis_params(ctx, **options)
    level = float(params["ci_level"])
    registry.check(ctx.run_dir)
    ch = Chapter(ctx.run_dir, "fruit_slice", folder=FOLDER)
    from .split import load_frozen

    frozen = load_frozen(ch)
    paired = pair_states(load_states(ch), frozen.rows, len(frozen.class_names))
    classes = class_table(frozen.class_map, frozen.rows)
    y, n_classes = paired.y, paired.n_classes
    chosen = np.asarray(slice_classes(frozen.class_map, params["slice"]), dtype=np.int64)
    present = np.bincount(y, minlength=n_classes) > 0
    in_slice = chosen[present[chosen]]
    rest = np.setdiff1d(np.flatnonzero(present), chosen)
    indices = metrics.bootstrap_indices(len(y), int(params["bootstrap"]), int(params["seed"]))
    scored = np.flatnonzero(present)
    boot = {s: metrics.bootstrap_metrics(y, paired.preds[s], scored, n_classes, indices) for s in STATE_NAMES}
    group_stats = {"slice": _group_summary(paired, boot, in_slice, level),
                   "rest": _group_summary(paired, boot, rest, level)}

    table = classes[classes["label"].isin(chosen)].copy()
    for state in STATE_NAMES:
        scores = metrics.per_class_scores(y, paired.preds[state], n_classes).set_index("label")
        table[f"recall_{state}"] = table["label"].map(scores["recall"])
        table[f"f1_{state}"] = table["label"].map(scores["f1"])
    table["delta_recall_reference_to_pte"] = table["recall_pte"] - table["recall_reference"]
    score_columns = [c for c in table if c.startswith(("recall_", "f1_", "delta_"))]
    table.loc[~table["label"].isin(in_slice), score_columns] = np.nan
    ch.write_parquet(f"{FOLDER}/fruit_slice.parquet", table.reset_index(drop=True))
    plots = {}
    if len(in_slice):
        plots["slice"] = f"{FOLDER}/fruit_slice.png"
        ch.save_figure(plot_slice(group_stats), plots["slice"], dpi=110)
    figures = {
        "exploratory": True,
        "rule": params["slice"],
        "n_slice_classes": len(chosen), "n_slice_classes_scored": len(in_slice),
        "slice_classes": classes.loc[classes["label"].isin(chosen), "class_name"].tolist(),
        "n_slice_test_rows": int(np.isin(y, in_slice).sum()), "n_test_rows": len(y),
        "bootstrap_resamples": int(params["bootstrap"]), "ci_level": level,
        **group_stats,
    }
    return ch.finish(figures=figures, plots=plots, params=params,
                     test_rows_read=_test_access(paired, "scoring the recorded predictions on the slice"),
                     note="Exploratory and descriptive: the slice is a rule over the class map chosen after "
                          "the main comparisons; its intervals are not corrected for that choice.")


def _group_summary(paired: PairedStates, boot: dict[str, metrics.BootstrapMetrics], members: np.ndarray,
                   level: float) -> dict[str, Any]:
    """Mean class recall and F1 over ``members`` per state, and paired changes along the chain."""
    if not len(members):
        return {"classes": 0, "states": {}, "paired": {}}

    def resampled(state: str, what: str) -> np.ndarray:
        values = getattr(boot[state], f"class_{what}")[:, members]
        with metrics.quiet_empty_slices():
            return np.nanmean(values, axis=1)

    point = {}
    for state in STATE_NAMES:
        scores = metrics.per_class_scores(paired.y, paired.preds[state], paired.n_classes).set_index("label")
        point[state] = {"mean_recall": float(scores.loc[members, "recall"].mean()),
                        "mean_f1": float(scores.loc[members, "f1"].mean())}
    states = {s: {m: {"value": point[s][m], **_ci(resampled(s, m.split("_")[1]), level)}
                  for m in ("mean_recall", "mean_f1")} for s in STATE_NAMES}
    deltas = {}
    for a, b in PAIRS:
        deltas[pair_key(a, b)] = {}
        for m in ("mean_recall", "mean_f1"):
            what = m.split("_")[1]
            low, high = metrics.interval(resampled(b, what) - resampled(a, what), level)
            deltas[pair_key(a, b)][m] = {"delta": point[b][m] - point[a][m], "lo": defined(low),
                                         "hi": defined(high),
                                         "excludes_zero": bool(low > 0 or high < 0)}
    rows = int(np.isin(paired.y, members).sum())
    return {"classes": len(members), "test_rows": rows, "states": states, "paired": deltas}


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


def fruit_slice_prose(record: dict[str, Any]) -> str:
    f = record["figures"]
    rule = f"`{f['rule']['field']} == {f['rule']['equals']}`"
    if not f["slice"]["classes"]:
        return (f"**Exploratory.** The slice rule {rule} selects {f['n_slice_classes']} classes with "
                "test rows in this run's class map, so there is nothing to describe.")
    d = f["slice"]["paired"][pair_key("reference", "pte")]
    r = f["rest"]["paired"].get(pair_key("reference", "pte"))
    text = (f"**Exploratory and descriptive.** The slice rule {rule} selects {f['slice']['classes']} classes "
            f"({f['slice']['test_rows']} of {f['n_test_rows']} test rows). From the float reference to "
            f"the .pte, the slice's mean recall changed by {points(d['mean_recall']['delta'])} points "
            "(paired "
            f"{round(100 * f['ci_level'])} % interval {points(d['mean_recall']['lo'])} to "
            f"{points(d['mean_recall']['hi'])}) and its mean F1 by {points(d['mean_f1']['delta'])} points.")
    if r:
        text += (f" The other {f['rest']['classes']} classes changed by {points(r['mean_recall']['delta'])} "
                 "points of mean recall.")
    return text + (" The slice was chosen after the main comparisons; read it as a description of where the "
                   "loss sits, not as a tested hypothesis.")


def slice_tables(record: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chapter 9's per-state values and paired changes (slice and the other classes) as two tables."""
    f = record["figures"]
    values, changes = [], []
    for group in ("slice", "rest"):
        for state, stats in f[group]["states"].items():
            values.append({"group": group, "state": STATE_LABELS[state],
                           **{f"{m}{suffix}": stats[m][part] for m in ("mean_recall", "mean_f1")
                              for suffix, part in (("", "value"), ("_lo", "lo"), ("_hi", "hi"))}})
        for pair, stats in f[group]["paired"].items():
            changes.append({"group": group, "pair": pair.replace("_to_", " → "),
                            **{f"{m}_{part}": stats[m][part] for m in ("mean_recall", "mean_f1")
                               for part in ("delta", "lo", "hi", "excludes_zero")}})
    return pd.DataFrame(values), pd.DataFrame(changes)
