"""Chapter 3: the frozen, stratified, leakage-group-aware train/val/test split.

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

The files are then read back from disk and checked: zero groups (and zero trusted audit pairs) across
splits, no row twice, every admitted row either split or quarantined.  ``load_frozen`` repeats the
fingerprint and crossing checks for every later chapter.
"""

from __future__ import annotations

import inspect
import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedGroupKFold

from .config import RunContext
from .evidence import Chapter, FingerprintMismatch, sha256_file, sha256_json, verify_artifact

SPLITS = ("train", "val", "test")
MAX_FOLDS = 20  # 5 % resolution; sklearn's greedy fold filler costs O(groups x folds x classes)
SPLIT_COLUMNS = ["row_id", "rel_path", "class_name", "label", "group_id", "split"]
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "group_id", "reason"]
FROZEN_FILES = ("corpus/manifest.parquet", "corpus/class_map.json", "audit/relationships.parquet",
                "audit/groups.parquet", "split/class_map.json", "split/split.parquet",
                "split/quarantine.parquet")
_WRITER = {"corpus": "corpus (01_corpus)", "audit": "audit (02_audit)", "split": "split (03_split)"}


class SplitInputError(ValueError):
    """The corpus / audit artifacts the split is built from are inconsistent or unusable."""


class SplitIntegrityError(RuntimeError):
    """A split on disk double-books or loses rows, or disagrees with its class map."""


class LeakageError(SplitIntegrityError):
    """A leakage group (or a trusted audit pair) spans more than one split."""


# --------------------------------------------------------------------------- checks
@dataclass
class CrossingReport:
    """What the read-back check found; ``ok`` only when every list is empty."""

    n_rows: int
    n_groups: int
    n_multi_row_groups: int
    crossing_groups: list[dict[str, Any]] = field(default_factory=list)
    crossing_pairs: list[dict[str, Any]] = field(default_factory=list)
    trusted_pairs_checked: int = 0
    untrusted_pairs_across: int = 0
    duplicate_row_ids: list[str] = field(default_factory=list)
    rows_without_group: list[str] = field(default_factory=list)
    unaccounted_row_ids: list[str] = field(default_factory=list)
    double_booked_row_ids: list[str] = field(default_factory=list)

    @property
    def leaks(self) -> bool:
        return bool(self.crossing_groups or self.crossing_pairs)

    @property
    def ok(self) -> bool:
        return not (self.leaks or self.duplicate_row_ids or self.rows_without_group
                    or self.unaccounted_row_ids or self.double_booked_row_ids)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": "zero crossings" if self.ok else "FAILED", "ok": self.ok,
                "rows_checked": self.n_rows, "groups_checked": self.n_groups,
                "multi_row_groups": self.n_multi_row_groups,
                "groups_across_splits": len(self.crossing_groups),
                "trusted_pairs_checked": self.trusted_pairs_checked,
                "trusted_pairs_across_splits": len(self.crossing_pairs),
                "untrusted_pairs_across_splits": self.untrusted_pairs_across,
                "duplicate_rows": len(self.duplicate_row_ids),
                "rows_without_group": len(self.rows_without_group),
                "unaccounted_rows": len(self.unaccounted_row_ids),
                "double_booked_rows": len(self.double_booked_row_ids)}

    def raise_if_failed(self, source: str = "the split") -> CrossingReport:
        if self.leaks:
            shown = "; ".join(f"group {g['group_id']} in {'+'.join(g['splits'])} ({g['rows']} rows)"
                              for g in self.crossing_groups[:10])
            pairs = "; ".join(f"{p['row_id_a']} ({p['split_a']}) ~ {p['row_id_b']} ({p['split_b']})"
                              for p in self.crossing_pairs[:5])
            raise LeakageError(
                f"{source} leaks: {len(self.crossing_groups)} leakage group(s) span more than one split"
                f"{': ' + shown if shown else ''}"
                f"{'; trusted audit pairs across splits: ' + pairs if pairs else ''}. "
                "Rerun chapter 'split' (03_split) so whole groups are assigned together."
            )
        problems = {"row(s) appear twice": self.duplicate_row_ids,
                    "split row(s) have no leakage group": self.rows_without_group,
                    "admitted row(s) are neither split nor quarantined": self.unaccounted_row_ids,
                    "row(s) are both split and quarantined": self.double_booked_row_ids}
        found = [f"{len(ids)} {what} (e.g. {', '.join(map(str, ids[:5]))})"
                 for what, ids in problems.items() if ids]
        if found:
            raise SplitIntegrityError(f"{source} is inconsistent: {'; '.join(found)}. "
                                      "Rerun chapter 'split' (03_split) from the current audit.")
        return self


def check_zero_crossings(split_rows: pd.DataFrame, groups: pd.DataFrame,
                         quarantined: pd.DataFrame | None = None,
                         relationships: pd.DataFrame | None = None,
                         raise_on_failure: bool = True) -> CrossingReport:
    """Check a split (row_id, group_id?, split) against the audit's groups.

    Groups come from ``groups`` (row_id, group_id), never from the split's own column, so a split that
    rewrote its group ids cannot hide a crossing.  With ``quarantined`` every row of ``groups`` (the
    audit lists every admitted row) must be split or quarantined, not both.  With ``relationships``,
    trusted pairs whose two rows were both split must share a split.  Raises :class:`LeakageError`
    (crossings) or :class:`SplitIntegrityError` (bookkeeping) unless ``raise_on_failure`` is False.
    """
    group_of = groups.drop_duplicates("row_id").set_index("row_id")["group_id"]
    rows = split_rows[["row_id", "split"]].copy()
    duplicates = sorted(rows.loc[rows["row_id"].duplicated(), "row_id"].unique().tolist())
    rows["group_id"] = rows["row_id"].map(group_of)
    no_group = sorted(rows.loc[rows["group_id"].isna(), "row_id"].tolist())
    grouped = rows.dropna(subset=["group_id"])
    per_group = grouped.groupby("group_id", sort=True).agg(n_splits=("split", "nunique"),
                                                           rows=("row_id", "size"))
    crossing = per_group[per_group["n_splits"] > 1]
    splits_of = grouped[grouped["group_id"].isin(crossing.index)].groupby("group_id")["split"].unique()
    report = CrossingReport(
        n_rows=len(rows), n_groups=len(per_group), n_multi_row_groups=int((per_group["rows"] > 1).sum()),
        crossing_groups=[{"group_id": _plain(g), "splits": sorted(splits_of[g], key=_split_order),
                          "rows": int(r.rows)} for g, r in crossing.iterrows()],
        duplicate_row_ids=duplicates, rows_without_group=no_group)
    if quarantined is not None:
        split_ids, quarantined_ids = set(rows["row_id"]), set(quarantined["row_id"])
        report.unaccounted_row_ids = sorted(set(group_of.index) - split_ids - quarantined_ids)
        report.double_booked_row_ids = sorted(split_ids & quarantined_ids)
    if relationships is not None and len(relationships):
        split_of = rows.drop_duplicates("row_id").set_index("row_id")["split"]
        pairs = relationships.assign(split_a=relationships["row_id_a"].map(split_of),
                                     split_b=relationships["row_id_b"].map(split_of))
        pairs = pairs.dropna(subset=["split_a", "split_b"])
        across = pairs["split_a"] != pairs["split_b"]
        trusted = pairs["trusted"].astype(bool)
        report.trusted_pairs_checked = int(trusted.sum())
        report.untrusted_pairs_across = int((across & ~trusted).sum())
        report.crossing_pairs = pairs.loc[across & trusted, ["row_id_a", "row_id_b", "kind", "split_a",
                                                             "split_b"]].to_dict("records")
    if raise_on_failure:
        report.raise_if_failed()
    return report


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
    fold = _fold_of_rows(live, n_folds, seed)
    classes = sorted(live["class_name"].unique())
    counts = pd.crosstab(fold, live["class_name"]).reindex(index=range(n_folds), columns=classes,
                                                           fill_value=0).to_numpy(float)
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
    sklearn's; ``tests/test_split.py`` checks that against the parent class.  Everything else
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


# --------------------------------------------------------------------------- inputs and outputs
def admitted_rows(manifest: pd.DataFrame, groups: pd.DataFrame, corpus_map: dict[str, Any]) -> pd.DataFrame:
    """The admitted manifest rows with their leakage group; refuses when corpus and audit disagree."""
    admitted = manifest[manifest["admitted"].astype(bool)][["row_id", "rel_path", "class_name"]]
    if admitted["row_id"].duplicated().any():
        raise SplitInputError("corpus/manifest.parquet lists an admitted row_id twice; rerun chapter "
                              "'corpus' (01_corpus).")
    if groups["group_id"].isna().any():
        raise SplitInputError("audit/groups.parquet has rows without a group_id; rerun chapter 'audit' "
                              "(02_audit).")
    if groups["row_id"].duplicated().any():
        raise SplitInputError("audit/groups.parquet lists a row_id twice; rerun chapter 'audit' (02_audit).")
    missing = sorted(set(admitted["row_id"]) - set(groups["row_id"]))
    extra = sorted(set(groups["row_id"]) - set(admitted["row_id"]))
    if missing or extra:
        raise SplitInputError(
            f"audit/groups.parquet does not cover the admitted rows of corpus/manifest.parquet: "
            f"{len(missing)} admitted row(s) without a group (e.g. {missing[:3]}), {len(extra)} grouped "
            f"row(s) not admitted (e.g. {extra[:3]}). Rerun chapter 'audit' (02_audit) on this corpus.")
    known = {c["name"] for c in corpus_map["classes"]}
    unknown = sorted(set(admitted["class_name"]) - known)
    if unknown:
        raise SplitInputError(f"admitted classes {unknown} are missing from corpus/class_map.json; rerun "
                              "chapter 'corpus' (01_corpus).")
    return admitted.merge(groups[["row_id", "group_id"]], on="row_id", how="left", validate="one_to_one")


def frozen_class_map(corpus_map: dict[str, Any], plan: SplitPlan) -> dict[str, Any]:
    """corpus/class_map.json re-indexed over the classes that survived the split."""
    support = plan.assignment["class_name"].value_counts()
    survivors = sorted(support.index)
    by_name = {c["name"]: c for c in corpus_map["classes"]}
    classes = [{**by_name[name], "index": i, "support": int(support[name])}
               for i, name in enumerate(survivors)]
    upstream = [dict(q, stage="corpus") for q in corpus_map.get("quarantined_classes", [])]
    here = [{"name": q["name"], "reason": q["reason"], "support": q["support"], "stage": "split"}
            for q in plan.quarantined_classes]
    return {"fingerprint": sha256_json(classes), "classes": classes, "quarantined_classes": upstream + here}


def per_class_table(rows: pd.DataFrame, class_names: list[str]) -> pd.DataFrame:
    """Rows per class per split with each class's shares, in label order."""
    table = pd.crosstab(rows["class_name"], rows["split"]).reindex(index=class_names, columns=list(SPLITS),
                                                                   fill_value=0)
    table["total"] = table.sum(axis=1)
    for name in SPLITS:
        table[f"{name}_frac"] = (table[name] / table["total"]).round(4)
    table.insert(0, "label", range(len(class_names)))
    return table.rename_axis("class_name").reset_index()


def inherited_verdict(audit_json: dict[str, Any]) -> dict[str, Any]:
    """Whether the audit rejected the corpus's own train/test partition (the split is remade either way).

    The audit records ``{"decision": "accept"|"reject"|"none", "rejected": bool|None, "reason"}`` under
    ``figures.inherited_partition`` of ``audit/audit.json``.
    """
    for where, record in (("figures.", audit_json.get("figures") or {}), ("", audit_json)):
        entry = record.get("inherited_partition") if isinstance(record, dict) else None
        if isinstance(entry, dict) and "rejected" in entry:
            rejected = None if entry["rejected"] is None else bool(entry["rejected"])
            return {"rejected": rejected, "decision": entry.get("decision"), "reason": entry.get("reason"),
                    "source": f"audit/audit.json: {where}inherited_partition"}
    return {"rejected": None, "decision": None, "reason": "audit/audit.json records no verdict",
            "source": "audit/audit.json"}


def planted_check(rows: pd.DataFrame, truth: dict[str, Any]) -> dict[str, Any]:
    """Synthetic corpus only: do the planted relations (copies, near duplicates, re-shots) stay together?

    This judges the audit's grouping and the split together: a planted relation the audit missed can
    cross splits without any audit group crossing.
    """
    from .synthetic import PAIR_KINDS, planted_groups, planted_pairs

    split_of = dict(zip(rows["rel_path"], rows["split"], strict=True))
    groups = [[m for m in g if m in split_of] for g in planted_groups(truth)]
    groups = [g for g in groups if len(g) > 1]
    across = [sorted(g) for g in groups if len({split_of[m] for m in g}) > 1]
    by_kind = {}
    for kind in PAIR_KINDS:
        pairs = [tuple(p) for p in planted_pairs(truth, [kind]) if all(m in split_of for m in p)]
        by_kind[kind] = {"pairs": len(pairs),
                         "across_splits": sum(split_of[a] != split_of[b] for a, b in pairs)}
    return {"planted_groups": len(groups), "planted_groups_across_splits": len(across),
            "examples_across": across[:5], "pairs_by_kind": by_kind}


def plot_split_support(table: pd.DataFrame, fractions: dict[str, float] | None = None) -> Any:
    """Per class: total support (log scale) and how it divides into train / val / test (stacked shares)."""
    import matplotlib.pyplot as plt

    table = table.sort_values("total", kind="stable")
    y = np.arange(len(table))
    height = max(2.5, 0.28 * len(table) + 1.2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, height), sharey=True,
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    colours = {"train": "#4c72b0", "val": "#dd8452", "test": "#55a868"}
    start = np.ones(len(table))  # the log axis starts at one image
    for name in SPLITS:  # stacked counts: each segment from the previous cumulative total
        stop = start + table[name].to_numpy()
        left.barh(y, stop - start, left=start, color=colours[name], label=name)
        start = stop
    left.set_xscale("log")
    left.set_xlabel("images per class (log scale)")
    left.set_yticks(y, table["class_name"], fontsize=7)
    share = np.zeros(len(table))
    for name in SPLITS:
        part = (table[name] / table["total"]).to_numpy()
        right.barh(y, part, left=share, color=colours[name], label=name)
        share += part
    for cut in np.cumsum([fractions[s] for s in SPLITS[:-1]]) if fractions else []:
        right.axvline(cut, color="black", linestyle="--", linewidth=0.8)
    right.set_xlim(0, 1)
    right.set_xlabel("share of the class in each split (dashed: target)")
    right.legend(loc="lower right", fontsize=7, ncols=3)
    fig.suptitle("How each class's support divides across the frozen split")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- frozen split
@dataclass
class FrozenSplit:
    rows: pd.DataFrame
    class_map: dict[str, Any]
    class_names: list[str]
    split_json: dict[str, Any]
    crossings: CrossingReport

    def rows_for(self, split_name: str) -> pd.DataFrame:
        """The rows of one split.  "test" rows are for counting; models read them via locked_test."""
        if split_name not in SPLITS:
            raise KeyError(f"unknown split {split_name!r}; expected one of {SPLITS}")
        return self.rows[self.rows["split"] == split_name].reset_index(drop=True)


def _verify_fingerprint(ch: Chapter, rel_path: str, recorded: str) -> None:
    target = ch.path(rel_path)
    try:
        ch.verify(rel_path, recorded)
    except FingerprintMismatch as error:
        found = f"found {sha256_file(target)[:16]}…" if target.exists() else "the file is missing"
        stage = rel_path.split("/")[0]
        cause = ("the frozen split was altered after chapter 'split' wrote it" if stage == "split" else
                 f"it changed after the split was frozen (chapter {_WRITER.get(stage, stage)} rerun, or "
                 "the file edited)")
        raise FingerprintMismatch(
            f"{rel_path} does not match split/split.json: recorded SHA-256 {recorded[:16]}…, {found}; "
            f"{cause}. Chapter '{ch.name}' refuses to run on it: rerun chapter 'split' (03_split) and every "
            "chapter after it." + (f" Upstream: rerun {_WRITER[stage]} first if it should be remade."
                                   if stage in ("corpus", "audit") else "")) from error


def load_frozen(ch: Chapter) -> FrozenSplit:
    """Verify the frozen split for chapter ``ch`` and return it.

    Every fingerprint in ``split/split.json`` is re-hashed against the file on disk (a mismatch raises
    :class:`FingerprintMismatch` naming the file) and recorded in ``ch.inputs``; zero crossings and row
    accounting are re-checked from the files, not trusted from the record.
    """
    if not ch.path("split/split.json").exists():
        raise FingerprintMismatch(f"{ch.run_dir}/split/split.json is missing: run chapter 'split' "
                                  f"(03_split) before chapter '{ch.name}'.")
    split_json = ch.read_json("split/split.json")
    fingerprints = split_json.get("fingerprints", {})
    absent = [name for name in FROZEN_FILES if name not in fingerprints]
    if absent:
        raise FingerprintMismatch(f"split/split.json records no fingerprint for {absent}; rerun chapter "
                                  "'split' (03_split).")
    for rel_path in FROZEN_FILES:
        _verify_fingerprint(ch, rel_path, fingerprints[rel_path])
    rows = pd.read_parquet(ch.path("split/split.parquet"))
    class_map = ch.read_json("split/class_map.json", fingerprints["split/class_map.json"])
    crossings = check_zero_crossings(
        rows, pd.read_parquet(ch.path("audit/groups.parquet")),
        quarantined=pd.read_parquet(ch.path("split/quarantine.parquet")),
        relationships=pd.read_parquet(ch.path("audit/relationships.parquet")), raise_on_failure=False)
    crossings.raise_if_failed("split/split.parquet")
    class_names = [c["name"] for c in sorted(class_map["classes"], key=lambda c: c["index"])]
    expected = rows["class_name"].map({name: i for i, name in enumerate(class_names)})
    if expected.isna().any() or (expected != rows["label"]).any():
        raise SplitIntegrityError("split/split.parquet labels disagree with split/class_map.json; rerun "
                                  "chapter 'split' (03_split).")
    return FrozenSplit(rows=rows, class_map=class_map, class_names=class_names, split_json=split_json,
                       crossings=crossings)


# --------------------------------------------------------------------------- chapter
def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Make, freeze and check the split; options override the profile's ``split`` section."""
    params = {**ctx.section("split"), **options}
    fractions = parse_fractions(params.get("fractions", {"train": 0.70, "val": 0.15, "test": 0.15}))
    seed = int(params.get("seed", ctx.params.get("seed", 0)))
    min_per_split = int(params.get("min_per_split", 1))

    ch = Chapter(ctx.run_dir, "split")
    manifest = ch.read_parquet("corpus/manifest.parquet")
    corpus_map = ch.read_json("corpus/class_map.json")
    relationships = ch.read_parquet("audit/relationships.parquet")
    groups = ch.read_parquet("audit/groups.parquet")
    audit_json = ch.read_json("audit/audit.json")

    plan = plan_split(admitted_rows(manifest, groups, corpus_map), fractions, seed, min_per_split)
    class_map = frozen_class_map(corpus_map, plan)
    class_names = [c["name"] for c in class_map["classes"]]
    label_of = {name: i for i, name in enumerate(class_names)}
    split_rows = (plan.assignment.assign(label=lambda d: d["class_name"].map(label_of).astype("int64"))
                  [SPLIT_COLUMNS].sort_values("rel_path", kind="stable").reset_index(drop=True))
    held = plan.quarantined_rows[QUARANTINE_COLUMNS].sort_values("rel_path", kind="stable")

    ch.write_json("split/class_map.json", class_map)
    ch.write_parquet("split/split.parquet", split_rows)
    ch.write_parquet("split/quarantine.parquet", held.reset_index(drop=True))

    # The verdict comes from the files as written, re-read from disk, not from the frames in memory.
    for rel_path in ("split/split.parquet", "split/quarantine.parquet", "audit/groups.parquet"):
        verify_artifact(ctx.run_dir, rel_path)
    crossings = check_zero_crossings(pd.read_parquet(ch.path("split/split.parquet")),
                                     pd.read_parquet(ch.path("audit/groups.parquet")),
                                     quarantined=pd.read_parquet(ch.path("split/quarantine.parquet")),
                                     relationships=relationships)

    table = per_class_table(split_rows, class_names)
    fig = plot_split_support(table, fractions)
    ch.save_figure(fig, "split/support.png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)

    totals = {name: int((split_rows["split"] == name).sum()) for name in SPLITS}
    train = table.set_index("class_name")["train"]
    group_sizes = groups["group_id"].value_counts()
    conflict = plan.assignment.groupby("group_id")["class_name"].nunique()
    fingerprints = {rel: (ch.outputs.get(rel) or ch.inputs[rel]) for rel in FROZEN_FILES}
    planted = None
    if ctx.is_synthetic and ctx.planted_truth_path.exists():
        from .synthetic import load_truth

        ch.inputs["synthetic/planted.json"] = sha256_file(ctx.planted_truth_path)
        planted = planted_check(split_rows, load_truth(ctx.planted_truth_path))
    return ch.finish(
        figures={"support": "split/support.png"},
        method={"splitter": "sklearn.model_selection.StratifiedGroupKFold", "shuffle": True, "seed": seed,
                "stratify_by": "majority class of each leakage group", "n_folds": plan.n_folds,
                "folds_per_split": plan.folds_per_split, "selected_folds": plan.selected_folds,
                "min_per_split": min_per_split},
        target_fractions=fractions,
        totals=totals,
        fractions={k: round(v / max(1, len(split_rows)), 6) for k, v in totals.items()},
        rows_split=len(split_rows),
        rows_quarantined=len(held),
        per_class=table.to_dict("records"),
        train_support_ratio={"largest": int(train.max()), "smallest": int(train.min()),
                             "largest_class": str(train.idxmax()), "smallest_class": str(train.idxmin()),
                             "ratio": round(float(train.max() / train.min()), 3)},
        quarantined_classes=plan.quarantined_classes,
        corpus_quarantined_classes=corpus_map.get("quarantined_classes", []),
        repairs=plan.repairs,
        groups={"total": int(len(group_sizes)), "multi_row": int((group_sizes > 1).sum()),
                "largest": int(group_sizes.max()) if len(group_sizes) else 0,
                "label_conflict": int((conflict > 1).sum())},
        crossings={**crossings.to_dict(), "checked_from": ["split/split.parquet", "split/quarantine.parquet",
                                                           "audit/groups.parquet",
                                                           "audit/relationships.parquet"]},
        inherited_partition=inherited_verdict(audit_json),
        class_map_fingerprint=class_map["fingerprint"],
        fingerprints=fingerprints,
        planted_check=planted,
    )


def _split_order(name: str) -> int:
    return SPLITS.index(name) if name in SPLITS else len(SPLITS)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
