"""The frozen split as every later chapter sees it: the zero-crossings check (:class:`CrossingReport`,
:func:`check_zero_crossings`), the integrity errors it raises, and :func:`load_frozen` /
:func:`read_frozen`, which verify the frozen files before handing out a :class:`FrozenSplit`.

The split's files are read back from disk and checked: zero groups (and zero trusted audit pairs) across
splits, no row twice, every admitted row either split or quarantined.  ``load_frozen`` repeats the
fingerprint and crossing checks for every later chapter, and, with ``--field-train``, those of the
field-train split too (:func:`check_field_train`; the split itself is made in :mod:`.field_train`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.evidence import Chapter, FingerprintMismatch, sha256_file
from ..core.sources import FIELD_TRAIN, LAB

SPLITS = ("train", "val", "test")
FIELD_SPLITS = ("train", "val")  # field-train photos: the scored field cohorts are the field test
CORPUS_FIELD_TRAIN = "corpus/field_train.parquet"
CROSS_GROUPS = "audit/cross_groups.parquet"
FIELD_TRAIN_SPLIT = "split/field_train.parquet"
FIELD_TRAIN_EXCLUDED = "split/field_train_excluded.parquet"
FIELD_TRAIN_FILES = (CORPUS_FIELD_TRAIN, CROSS_GROUPS, FIELD_TRAIN_SPLIT, FIELD_TRAIN_EXCLUDED)
FROZEN_FILES = ("corpus/manifest.parquet", "corpus/class_map.json", "audit/relationships.parquet",
                "audit/groups.parquet", "split/class_map.json", "split/split.parquet",
                "split/quarantine.parquet")
_WRITER = {"corpus": "corpus (01_corpus)", "audit": "audit (02_audit)", "split": "split (03_split)"}


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


def check_field_train(field_split: pd.DataFrame, excluded: pd.DataFrame, field_rows: pd.DataFrame,
                      cross_groups: pd.DataFrame, lab_rows: pd.DataFrame,
                      raise_on_failure: bool = True) -> dict[str, Any]:
    """Read-back check of a field-train split: only train/val; every admitted field-train row split or
    excluded once; no group across train/val; no group beside a lab relative of another split (or of
    test).  Groups come from ``cross_groups``, never from the split's own column.  Raises
    :class:`LeakageError` / :class:`SplitIntegrityError` unless ``raise_on_failure`` is False."""
    group_of = cross_groups.drop_duplicates("row_id").set_index("row_id")["group_id"]
    bad_split = sorted(field_split.loc[~field_split["split"].isin(FIELD_SPLITS), "row_id"])
    ids = pd.concat([field_split["row_id"], excluded["row_id"]])
    double = sorted(set(field_split["row_id"]) & set(excluded["row_id"]))
    duplicated = sorted(set(ids[ids.duplicated()]) - set(double))
    unaccounted = sorted(set(field_rows["row_id"]) - set(ids))
    rows = field_split[["row_id", "split"]].assign(group_id=field_split["row_id"].map(group_of))
    no_group = sorted(rows.loc[rows["group_id"].isna(), "row_id"])
    lab = lab_rows[["row_id", "split"]].assign(group_id=lab_rows["row_id"].map(group_of)).dropna()
    both = pd.concat([rows.dropna(), lab[lab["group_id"].isin(set(rows["group_id"].dropna()))]])
    per_group = both.groupby("group_id")["split"].agg(lambda s: sorted(set(s)))
    crossing = [{"group_id": _plain(g), "splits": s} for g, s in per_group.items()
                if len(s) > 1 or "test" in s]
    report = {"ok": not (crossing or bad_split or double or duplicated or unaccounted or no_group),
              "rows_checked": len(field_split), "groups_checked": int(len(per_group)),
              "groups_across_splits": len(crossing),
              "rows_in_test": int((field_split["split"] == "test").sum()),
              "rows_outside_train_val": len(bad_split), "double_booked_rows": len(double),
              "duplicate_rows": len(duplicated), "unaccounted_rows": len(unaccounted),
              "rows_without_group": len(no_group)}
    report["verdict"] = "zero crossings" if report["ok"] else "FAILED"
    if raise_on_failure and crossing:
        shown = "; ".join(f"group {g['group_id']} in {'+'.join(g['splits'])}" for g in crossing[:10])
        raise LeakageError(f"{FIELD_TRAIN_SPLIT} leaks: {len(crossing)} cross-set group(s) span more than "
                           f"one split or reach lab test: {shown}. Rerun chapter 'split' (03_split).")
    if raise_on_failure and not report["ok"]:
        raise SplitIntegrityError(
            f"{FIELD_TRAIN_SPLIT} is inconsistent: {len(bad_split)} row(s) outside train/val, "
            f"{len(double)} both split and excluded, {len(duplicated)} listed twice, {len(unaccounted)} "
            f"admitted field-train row(s) neither split nor excluded, {len(no_group)} without a group. "
            "Rerun chapter 'split' (03_split) from the current corpus and audit.")
    return report



# --------------------------------------------------------------------------- frozen split
@dataclass
class FrozenSplit:
    rows: pd.DataFrame
    class_map: dict[str, Any]
    class_names: list[str]
    split_json: dict[str, Any]
    crossings: CrossingReport
    field_train: pd.DataFrame | None = None  # split/field_train.parquet; None when the run has none

    def rows_for(self, split_name: str, field_train: bool = False) -> pd.DataFrame:
        """The lab rows of one split.  "test" rows are for counting; models read them via locked_test.

        With ``field_train``: those lab rows and the field-train rows of the same split (there are no
        field-train test rows), every row with a ``source`` column (``"lab"`` / ``"field_train"``) for
        :func:`cropcop_utils.core.squares.row_paths`.  Lab groups (``audit/groups.parquet``) and cross-set
        groups (``audit/cross_groups.parquet``) are numbered apart, so ``group_id`` is then a string
        naming its numbering: ``lab:<id>`` or ``cross:<id>``."""
        if split_name not in SPLITS:
            raise KeyError(f"unknown split {split_name!r}; expected one of {SPLITS}")
        lab = self.rows[self.rows["split"] == split_name].reset_index(drop=True)
        if not field_train:
            return lab
        if self.field_train is None:
            raise ValueError("this run's split has no field-train rows: open the run with --field-train "
                             "and rerun chapters 'corpus' to 'split' (01-03)")
        field = self.field_train[self.field_train["split"] == split_name]
        return pd.concat([lab.assign(source=LAB, group_id="lab:" + lab["group_id"].astype(str)),
                          field.assign(source=FIELD_TRAIN, group_id="cross:" + field["group_id"].astype(str))
                          [[*lab.columns, "source"]]], ignore_index=True)


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
    _verify_recorded(ch, fingerprints, FROZEN_FILES)
    rows = pd.read_parquet(ch.path("split/split.parquet"))
    class_map = ch.read_json("split/class_map.json", fingerprints["split/class_map.json"])
    crossings = check_zero_crossings(
        rows, pd.read_parquet(ch.path("audit/groups.parquet")),
        quarantined=pd.read_parquet(ch.path("split/quarantine.parquet")),
        relationships=pd.read_parquet(ch.path("audit/relationships.parquet")), raise_on_failure=False)
    crossings.raise_if_failed("split/split.parquet")
    class_names = [c["name"] for c in sorted(class_map["classes"], key=lambda c: c["index"])]
    _check_labels(rows, class_names, "split/split.parquet")
    field_train = _load_field_train(ch, split_json, fingerprints, rows, class_names)
    return FrozenSplit(rows=rows, class_map=class_map, class_names=class_names, split_json=split_json,
                       crossings=crossings, field_train=field_train)


def _verify_recorded(ch: Chapter, fingerprints: dict[str, str], names: tuple[str, ...]) -> None:
    """Every file of ``names`` has a fingerprint in split.json and still matches it."""
    absent = [name for name in names if name not in fingerprints]
    if absent:
        raise FingerprintMismatch(f"split/split.json records no fingerprint for {absent}; rerun chapter "
                                  "'split' (03_split).")
    for rel_path in names:
        _verify_fingerprint(ch, rel_path, fingerprints[rel_path])


def _check_labels(rows: pd.DataFrame, class_names: list[str], rel_path: str) -> None:
    expected = rows["class_name"].map({name: i for i, name in enumerate(class_names)})
    if expected.isna().any() or (expected != rows["label"]).any():
        raise SplitIntegrityError(f"{rel_path} labels disagree with split/class_map.json; rerun "
                                  "chapter 'split' (03_split).")


def _load_field_train(ch: Chapter, split_json: dict[str, Any], fingerprints: dict[str, str],
                      lab_rows: pd.DataFrame, class_names: list[str]) -> pd.DataFrame | None:
    """The field-train split, its files verified and its crossings re-checked; None when the run has none."""
    if not split_json.get("field_train"):
        return None
    _verify_recorded(ch, fingerprints, FIELD_TRAIN_FILES)
    rows = pd.read_parquet(ch.path(FIELD_TRAIN_SPLIT))
    check_field_train(rows, pd.read_parquet(ch.path(FIELD_TRAIN_EXCLUDED)),
                      pd.read_parquet(ch.path(CORPUS_FIELD_TRAIN)), pd.read_parquet(ch.path(CROSS_GROUPS)),
                      lab_rows)
    _check_labels(rows, class_names, FIELD_TRAIN_SPLIT)
    return rows


def read_frozen(run_dir: str | os.PathLike) -> tuple[FrozenSplit, dict[str, str]]:
    """The frozen split of ``run_dir``, read back exactly as a later chapter would: fingerprints re-hashed,
    crossings re-checked (:func:`load_frozen` for the chapter ``split``), with the SHA-256 of every file
    that read verified (artifact → hash).  For the chapter notebook."""
    reader = Chapter(Path(run_dir), "split")
    return load_frozen(reader), dict(reader.inputs)


def _split_order(name: str) -> int:
    return SPLITS.index(name) if name in SPLITS else len(SPLITS)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
