"""Planning the split: the target fractions, the fold count that expresses them, scikit-learn's
``StratifiedGroupKFold`` (with a vectorised fold search that gives the same folds), the choice of folds
per split and the coverage repair (:func:`plan_split`).

Method (see ``plan_split``):

1. Every admitted row carries its leakage ``group_id`` from ``audit/groups.parquet``.  A group is the
   unit of assignment: all its rows land in one split.  A label-conflict group (rows of two classes)
   is stratified by its majority class (ties: the alphabetically first class) and kept together;
   each row keeps its own label.
2. Classes that cannot appear in every split are quarantined before assignment (fewer leakage groups
   than splits, or fewer rows than ``min_per_split`` times the number of splits).
3. scikit-learn's ``StratifiedGroupKFold`` (shuffle=True, the profile seed) cuts the groups into ``n``
   equal folds, with ``n`` the smallest fold count that expresses the target fractions exactly (20 for
   70/15/15: 14 + 3 + 3 folds).  The test folds, then the val folds, are the combination of folds whose
   per-class shares best match the target; the remaining folds are train.
4. A class still short of ``min_per_split`` rows in some split gets a whole group moved into that split
   (smallest eligible group first); when no group can move without starving its donor split, the class
   is quarantined.  Every move and every quarantine is recorded in ``split/split.json``.
"""

from __future__ import annotations

import inspect
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedGroupKFold

from .frozen import SPLITS, _plain

MAX_FOLDS = 20  # 5 % resolution; sklearn's greedy fold filler costs O(groups x folds x classes)


class SplitInputError(ValueError):
    """The corpus / audit artifacts the split is built from are inconsistent or unusable."""


# --------------------------------------------------------------------------- planning
@dataclass
class SplitPlan:
    assignment: pd.DataFrame  # the admitted rows of surviving classes + "split"
    quarantined_rows: pd.DataFrame  # admitted rows of quarantined classes + "reason"
    quarantined_classes: list[dict[str, Any]]
    repairs: list[dict[str, Any]]
    n_folds: int
    folds_per_split: dict[str, int]
    selected_folds: dict[str, list[int]]


def parse_fractions(fractions: dict[str, float]) -> dict[str, float]:
    if set(fractions) != set(SPLITS) or any(float(v) <= 0 for v in fractions.values()):
        raise SplitInputError(f"split.fractions must give train, val and test, each > 0; got {fractions}")
    total = sum(float(v) for v in fractions.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise SplitInputError(f"split.fractions must sum to 1; {fractions} sums to {total:.6f}")
    return {name: float(fractions[name]) for name in SPLITS}


def folds_for(fractions: dict[str, float], max_folds: int = MAX_FOLDS) -> tuple[int, dict[str, int]]:
    """The fewest equal folds that express the fractions exactly (70/15/15 -> 20 = 14+3+3).

    Fractions that no fold count up to ``max_folds`` expresses are rounded (largest remainder).
    """
    for n in range(len(SPLITS), max_folds + 1):
        counts = {k: round(v * n) for k, v in fractions.items()}
        if all(abs(v * n - counts[k]) < 1e-6 and counts[k] >= 1 for k, v in fractions.items()):
            return n, counts
    raw = {k: v * max_folds for k, v in fractions.items()}
    counts = {k: max(1, math.floor(v)) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: raw[k] - math.floor(raw[k]), reverse=True):
        if sum(counts.values()) >= max_folds:
            break
        counts[k] += 1
    return max_folds, counts


def majority_class(rows: pd.DataFrame) -> pd.Series:
    """group_id -> the class most rows of the group carry (ties: alphabetically first)."""
    counts = rows.groupby(["group_id", "class_name"], sort=True).size().rename("n").reset_index()
    counts = counts.sort_values(["group_id", "n", "class_name"], ascending=[True, False, True], kind="stable")
    return counts.drop_duplicates("group_id").set_index("group_id")["class_name"]


def plan_split(rows: pd.DataFrame, fractions: dict[str, float], seed: int,
               min_per_split: int = 1) -> SplitPlan:
    """Assign every admitted row (row_id, class_name, group_id, ...) to a split or a quarantine.

    Deterministic: rows are sorted by row_id first, so the input order does not matter.
    """
    fractions = parse_fractions(fractions)
    min_per_split = max(1, int(min_per_split))
    rows = rows.sort_values("row_id", kind="stable").reset_index(drop=True)
    quarantined: list[dict[str, Any]] = []

    # Classes that cannot reach every split whatever the assignment.
    stats = rows.groupby("class_name").agg(support=("row_id", "size"), groups=("group_id", "nunique"))
    for name, stat in stats.iterrows():
        if stat["groups"] < len(SPLITS):
            quarantined.append(_quarantine(name, "fewer_groups_than_splits", stat,
                                           f"{stat['groups']} leakage group(s) for {len(SPLITS)} splits"))
        elif stat["support"] < min_per_split * len(SPLITS):
            quarantined.append(_quarantine(name, "below_min_per_split", stat,
                                           f"{stat['support']} rows < {min_per_split} x {len(SPLITS)}"))
    live = rows[~rows["class_name"].isin({q["name"] for q in quarantined})].reset_index(drop=True)

    n_folds, per_split = folds_for(fractions)
    n_groups = live["group_id"].nunique()
    if n_groups < n_folds:
        raise SplitInputError(f"only {n_groups} leakage groups remain for a {n_folds}-fold grouped split "
                              f"({fractions}); the corpus is too small for these fractions.")
    largest = int(live["group_id"].map(majority_class(live)).value_counts().max()) if len(live) else 0
    if largest < n_folds:  # sklearn's stratified folds need one class with a row in every fold
        raise SplitInputError(f"every class has fewer than {n_folds} images (the largest: {largest}), the "
                              f"folds a {fractions} split is cut from; the corpus (or its sample, "
                              "corpus.sample_fraction) is too small for these fractions.")
    fold, counts = fold_counts(live, n_folds, seed)
    test_folds = _best_folds(counts, list(range(n_folds)), per_split["test"], fractions["test"],
                             min_per_split, rest_need=2 * min_per_split)
    rest = [f for f in range(n_folds) if f not in test_folds]
    val_folds = _best_folds(counts, rest, per_split["val"], fractions["val"], min_per_split,
                            rest_need=min_per_split, taken=counts[list(test_folds)].sum(axis=0))
    split_of_fold = {f: "train" for f in range(n_folds)}
    split_of_fold.update({f: "test" for f in test_folds})
    split_of_fold.update({f: "val" for f in val_folds})
    live["split"] = fold.map(split_of_fold)

    live, repairs, late = _repair_coverage(live, min_per_split)
    quarantined += late
    reasons = {q["name"]: q["reason"] for q in quarantined}
    held = rows[rows["class_name"].isin(reasons)].assign(reason=lambda d: d["class_name"].map(reasons))
    return SplitPlan(assignment=live.reset_index(drop=True), quarantined_rows=held.reset_index(drop=True),
                     quarantined_classes=sorted(quarantined, key=lambda q: q["name"]), repairs=repairs,
                     n_folds=n_folds, folds_per_split=per_split,
                     selected_folds={"train": [f for f in rest if f not in val_folds],
                                     "val": sorted(val_folds), "test": sorted(test_folds)})


class VectorisedStratifiedGroupKFold(StratifiedGroupKFold):
    """scikit-learn's StratifiedGroupKFold with its per-group fold search done in one numpy pass.

    Why: sklearn scores each candidate fold in a Python loop (one ``np.std`` per fold per group): about
    100 s for an 11,000-image corpus in 20 folds on a busy 2-core machine (this version: 7 s), and ten
    times that for the study's 109,000 images.  This override computes the same per-fold scores with
    the same numpy reductions (bit-identical) for all folds at once and applies sklearn's own selection
    rule (lowest mean per-class std; near-ties to the fold with fewer samples), so the folds equal
    sklearn's; ``tests/split/test_plan.py`` checks that against the parent class.  Everything else
    (validation, shuffling, group order) is sklearn's.
    """

    def _find_best_fold(self, y_counts_per_fold: np.ndarray, y_cnt: np.ndarray,
                        group_y_counts: np.ndarray) -> int:
        n = self.n_splits
        trial = np.repeat(y_counts_per_fold[None], n, axis=0)
        trial[np.arange(n), np.arange(n)] += group_y_counts  # candidate i: the group added to fold i
        fold_eval = np.mean(np.std(trial / y_cnt.reshape(1, 1, -1), axis=1), axis=1).tolist()
        samples = np.sum(y_counts_per_fold, axis=1).tolist()
        best_fold, min_eval, min_samples = None, np.inf, np.inf
        for i in range(n):
            if fold_eval[i] < min_eval or (np.isfinite(min_eval) and _np_isclose(fold_eval[i], min_eval)
                                           and samples[i] < min_samples):
                best_fold, min_eval, min_samples = i, fold_eval[i], samples[i]
        return best_fold


def _np_isclose(a: float, b: float) -> bool:
    # np.isclose's rule for finite scalars (rtol=1e-5, atol=1e-8) without its per-call array overhead.
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)


# Fall back to the plain (slow, identical) class if a future sklearn changes the hook we override.
_HOOK = getattr(StratifiedGroupKFold, "_find_best_fold", None)
_HOOK_ARGS = list(inspect.signature(_HOOK).parameters) if callable(_HOOK) else []
GroupedSplitter = (VectorisedStratifiedGroupKFold
                   if _HOOK_ARGS == ["self", "y_counts_per_fold", "y_cnt", "group_y_counts"]
                   else StratifiedGroupKFold)


def require_groups(row_ids: pd.Series, grouped: pd.DataFrame, groups_file: str, rows_name: str) -> None:
    """Every one of ``row_ids`` has exactly one leakage group in ``grouped`` (row_id, group_id) and no other
    row has one; refuses naming ``groups_file`` and what to rerun."""
    if grouped["row_id"].duplicated().any() or grouped["group_id"].isna().any():
        raise SplitInputError(f"{groups_file} lists a row_id twice or a row without a group_id; rerun "
                              "chapter 'audit' (02_audit).")
    missing = sorted(set(row_ids) - set(grouped["row_id"]))
    extra = sorted(set(grouped["row_id"]) - set(row_ids))
    if missing or extra:
        raise SplitInputError(
            f"{groups_file} does not cover {rows_name}: {len(missing)} row(s) without a group (e.g. "
            f"{missing[:3]}), {len(extra)} grouped row(s) not admitted (e.g. {extra[:3]}). Rerun chapter "
            "'audit' (02_audit) after chapter 'corpus' (01_corpus).")


def fold_counts(rows: pd.DataFrame, n_folds: int, seed: int) -> tuple[pd.Series, np.ndarray]:
    """Each row's grouped, stratified fold and the rows per fold and class (folds x sorted classes)."""
    fold = _fold_of_rows(rows, n_folds, seed)
    classes = sorted(rows["class_name"].unique())
    counts = pd.crosstab(fold, rows["class_name"]).reindex(index=range(n_folds), columns=classes,
                                                           fill_value=0).to_numpy(float)
    return fold, counts


def _fold_of_rows(rows: pd.DataFrame, n_folds: int, seed: int) -> pd.Series:
    y = rows["group_id"].map(majority_class(rows))
    splitter = GroupedSplitter(n_splits=n_folds, shuffle=True, random_state=seed)
    fold = np.full(len(rows), -1)
    with warnings.catch_warnings():
        # "least populated class has fewer members than n_splits": small classes are expected here;
        # coverage of every split is enforced by fold selection and _repair_coverage, not by sklearn.
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        for k, (_, test_idx) in enumerate(splitter.split(np.zeros(len(rows)), y, rows["group_id"])):
            fold[test_idx] = k
    return pd.Series(fold, index=rows.index)


def _best_folds(counts: np.ndarray, candidates: list[int], k: int, target: float, min_per_split: int,
                rest_need: int, taken: np.ndarray | None = None) -> tuple[int, ...]:
    """The k folds whose union best matches ``target`` of every class (first combination wins ties).

    Cost, lexicographic: classes left short (fewer than ``min_per_split`` rows in the union, or fewer than
    ``rest_need`` in what stays for the later splits), then the mean per-class |share - target| plus the
    overall |share - target|.  Exhaustive: at most C(20, 10) combinations, scored in batches.
    """
    totals = counts.sum(axis=0)
    left = totals - (taken if taken is not None else 0)
    best, best_cost = None, np.inf
    combos = itertools.combinations(candidates, k)
    while batch := list(itertools.islice(combos, 4096)):
        union = np.stack([counts[list(c)].sum(axis=0) for c in batch])
        short = (union < min_per_split).sum(axis=1) + (left - union < rest_need).sum(axis=1)
        cost = (short * 1e3 + np.abs(union / totals - target).mean(axis=1)
                + np.abs(union.sum(axis=1) / totals.sum() - target))
        i = int(np.argmin(cost))
        if cost[i] < best_cost:
            best, best_cost = batch[i], cost[i]
    return tuple(best)


def _repair_coverage(live: pd.DataFrame, min_per_split: int
                     ) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """Move whole groups so every class has >= min_per_split rows in every split, else quarantine it."""
    repairs: list[dict[str, Any]] = []
    quarantined: list[dict[str, Any]] = []
    while True:
        table = pd.crosstab(live["class_name"], live["split"]).reindex(columns=list(SPLITS), fill_value=0)
        short = [(c, s) for c in table.index for s in SPLITS if table.at[c, s] < min_per_split]
        if not short:
            return live, repairs, quarantined
        name, target = short[0]
        move = _movable_group(live, table, name, target, min_per_split)
        if move is None:
            stat = pd.Series({"support": int(table.loc[name].sum()),
                              "groups": live.loc[live["class_name"] == name, "group_id"].nunique()})
            quarantined.append(_quarantine(name, "cannot_cover_every_split", stat,
                                           f"no whole group can move into {target} without leaving "
                                           "another split short"))
            live = live[live["class_name"] != name]
            continue
        group_id, donor, size = move
        live.loc[live["group_id"] == group_id, "split"] = target
        repairs.append({"class_name": name, "group_id": _plain(group_id), "from": donor, "to": target,
                        "rows": size})


def _movable_group(live: pd.DataFrame, table: pd.DataFrame, name: str, target: str,
                   min_per_split: int) -> tuple[Any, str, int] | None:
    """The smallest group holding ``name`` outside ``target`` whose move leaves its donor split covered."""
    candidates = live.loc[(live["class_name"] == name) & (live["split"] != target), "group_id"].unique()
    members = live[live["group_id"].isin(candidates)]
    options = []
    for group_id, rows in members.groupby("group_id", sort=True):
        donor = rows["split"].iloc[0]
        per_class = rows["class_name"].value_counts()
        if all(table.at[c, donor] - n >= min_per_split for c, n in per_class.items()):
            options.append((len(rows), str(group_id), group_id, donor))
    if not options:
        return None
    size, _, group_id, donor = min(options, key=lambda o: o[:2])
    return group_id, donor, size


def _quarantine(name: str, reason: str, stat: pd.Series, detail: str) -> dict[str, Any]:
    return {"name": name, "reason": reason, "support": int(stat["support"]), "groups": int(stat["groups"]),
            "detail": detail}
