"""Chapter 9 (fruit-label slice): mean recall and F1 of the classes a class-map rule selects, per state,
with paired intervals, against the other classes — exploratory and descriptive.

Outputs (``analysis/``): ``fruit_slice.json``, ``fruit_slice.parquet`` (slice classes) and its figure.
The states are loaded and paired by :mod:`.states`; the number formatting is chapter 8's
(:mod:`.per_class`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core import metrics, registry
from ..core.config import RunContext
from ..core.evidence import Chapter
from ..core.model_states import PAIRS, STATE_LABELS, STATE_NAMES, PairedStates
from .figures import plot_slice
from .per_class import _ci, defined, points
from .states import FOLDER, _test_access, analysis_params, class_table, load_states, pair_key, pair_states


class SliceRuleError(ValueError):
    """The slice rule names a class-map field that does not exist."""


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
    from ..split import load_frozen

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
