"""The cross-set audit: the lab corpus, the field-train photos and every real field cohort audited as one
corpus, so that the relationships *between* sets are found by the same machinery as those within the lab.

Every set's admitted rows are stacked with their set's name in place of the inherited split
(:func:`union_rows`) and audited by :func:`~.corpus_audit.audit_corpus` under the lab audit's settings:
the same candidate sources, verifiers and thresholds, and the lab's fingerprints reused (an image's
fingerprints depend on that image alone).  A relationship that "crosses the split" of that union crosses
sets.  Inside the union every path is absolute (the sets live in different folders); the tables written
hold each path relative to its own set's folder beside the set's name.

* :func:`cross_table` — ``audit/cross_sets.parquet``: every relationship with at least one non-lab
  member (lab-lab relationships are the lab audit's), side a in set order (lab, field-train, then the
  cohorts as given), with kind, trust, label conflict, who proposed and confirmed it and every score.
* :func:`cross_groups` — ``audit/cross_groups.parquet``: every row of every set with its leakage group
  over the union's trusted relationships and the sets that group touches (``group_sets``), so a cohort
  photo with a relative in field-train is one whose ``group_sets`` names ``field_train``.
* :func:`cross_block` — the ``cross_sets`` block of ``audit/audit.json``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.sources import LAB
from .config import settings
from .corpus_audit import AuditResult, audit_corpus
from .errors import AuditInputError
from .figures import review_pairs
from .hashing import ImageHashes, concat_hashes, dihedral_inverse, hash_images
from .relations import KINDS

COHORT_PREFIX = "cohort:"  # a scored cohort's set name: "cohort:<folder name>"
SET_NEEDS = ("row_id", "rel_path", "class_name", "sha256")
PAIR_SIDES = ("row_id", "rel_path", "class_name", "source_label")
SCORE_COLUMNS = ["proposed_by", "verified_by", "phash_distance", "dhash_distance", "dihedral_distance",
                 "dihedral_transform", "cosine", "verify_score", "geometry_matches", "geometry_inliers",
                 "geometry_ratio", "geometry_mirrored", "geometry_ssim", "leaf_ssim"]
CROSS_COLUMNS = ["set_a", "set_b", "row_id_a", "row_id_b", "rel_path_a", "rel_path_b", "class_name_a",
                 "class_name_b", "source_label_a", "source_label_b", "kind", "trusted", "label_conflict",
                 "crosses_sets", *SCORE_COLUMNS]
GROUP_COLUMNS = ["row_id", "set", "rel_path", "class_name", "group_id", "group_size", "group_sets"]
LISTED = 200  # pairs listed in audit.json per list; the parquet holds them all


def cohort_set_name(folder: str | Path) -> str:
    return f"{COHORT_PREFIX}{Path(folder).name}"


@dataclass(frozen=True)
class AuditSet:
    """One set of admitted images: its name, its folder, its rows (paths relative to ``root``)."""

    name: str
    root: Path
    rows: pd.DataFrame  # row_id, rel_path, class_name, sha256; optional source_label
    accounting: dict[str, Any] | None = None  # the scan's counts (files seen, quarantined, ...) if any


@dataclass
class CrossAudit:
    """The union audit and the tables taken from it."""

    sets: list[AuditSet]
    result: AuditResult
    table: pd.DataFrame
    groups: pd.DataFrame
    seconds: float
    hashing_seconds: float

    def paths(self) -> dict[tuple[str, str], str]:
        """(set, rel_path) → absolute path of the file."""
        return {(s.name, rel): str(Path(s.root) / rel) for s in self.sets for rel in s.rows["rel_path"]}


# --------------------------------------------------------------------------- the union
def union_rows(sets: Sequence[AuditSet]) -> pd.DataFrame:
    """Every set's rows stacked (set order kept): absolute ``rel_path``, ``inherited_split`` = set name,
    plus the ``set``, ``set_rel_path`` and ``source_label`` (the class name where a set has none)."""
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise AuditInputError(f"two audited sets share a name ({names}); give each --field cohort a folder "
                              "of its own name")
    frames = []
    for s in sets:
        missing = [c for c in SET_NEEDS if c not in s.rows.columns]
        if missing:
            raise AuditInputError(f"the rows of set {s.name!r} ({s.root}) lack column(s) {missing}")
        rows = s.rows.reset_index(drop=True)
        source = rows["source_label"] if "source_label" in rows.columns else rows["class_name"]
        frames.append(pd.DataFrame({
            "row_id": rows["row_id"].astype(str),
            "rel_path": [str(Path(s.root) / r) for r in rows["rel_path"]],
            "class_name": rows["class_name"].astype(str), "inherited_split": s.name,
            "sha256": rows["sha256"].astype(str), "set": s.name, "set_rel_path": rows["rel_path"].astype(str),
            "source_label": source.astype(str)}))
    union = pd.concat(frames, ignore_index=True)
    repeated = union["row_id"][union["row_id"].duplicated()]
    if len(repeated):
        first = union[union["row_id"] == repeated.iloc[0]]
        raise AuditInputError(f"{len(repeated)} row id(s) occur in two audited sets, e.g. "
                              f"{first[['set', 'set_rel_path']].to_dict('records')}")
    return union


def audit_sets(sets: Sequence[AuditSet], cfg: dict[str, Any] | None = None, workers: int | None = None,
               progress: bool = False, max_image_pixels: int | None = None,
               lab_hashes: ImageHashes | None = None) -> CrossAudit:
    """Audit the union of ``sets`` (the first the lab when ``lab_hashes``, its fingerprints, are given)."""
    started = time.perf_counter()
    cfg = settings(cfg or {})
    sets = list(sets)
    union = union_rows(sets)
    embed_side = int(cfg["embedding_px"]) if int(cfg["embedding_k"]) > 0 else 0
    known = 0
    parts: list[ImageHashes] = []
    if lab_hashes is not None:
        if sets[0].name != LAB or len(lab_hashes.pixel_sha256) != len(sets[0].rows):
            raise AuditInputError("the lab's fingerprints must come with the lab set, first and whole")
        known, parts = len(sets[0].rows), [lab_hashes]
    rest = union.iloc[known:]
    # every path is absolute, so the root is only a prefix that Path joins away
    parts.append(hash_images("/", rest["rel_path"], rest["sha256"], workers, progress, max_image_pixels,
                             embed_side))
    hashing_seconds = parts[-1].seconds
    result = audit_corpus(union, "/", cfg, workers, progress, None, max_image_pixels,
                          hashes=concat_hashes(parts))
    table = cross_table(result.relationships, union, [s.name for s in sets])
    groups = cross_groups(result.groups, union)
    return CrossAudit(sets, result, table, groups, time.perf_counter() - started, hashing_seconds)


# --------------------------------------------------------------------------- tables
def cross_table(relationships: pd.DataFrame, union: pd.DataFrame, order: Sequence[str]) -> pd.DataFrame:
    """The union's relationships with a non-lab member, side a in set ``order`` (then by path)."""
    rel = relationships[(relationships["split_a"] != LAB) | (relationships["split_b"] != LAB)]
    rel = rel.reset_index(drop=True)
    rank = {name: k for k, name in enumerate(order)}
    swap = (rel["split_a"].map(rank) > rel["split_b"].map(rank)).to_numpy(bool)
    by_id = union.set_index("row_id")
    table = pd.DataFrame(index=rel.index)
    for side, other in (("a", "b"), ("b", "a")):
        ids = rel[f"row_id_{side}"].where(~swap, rel[f"row_id_{other}"])
        table[f"set_{side}"] = ids.map(by_id["set"]).to_numpy(object)
        table[f"row_id_{side}"] = ids.to_numpy(object)
        table[f"rel_path_{side}"] = ids.map(by_id["set_rel_path"]).to_numpy(object)
        table[f"class_name_{side}"] = ids.map(by_id["class_name"]).to_numpy(object)
        table[f"source_label_{side}"] = ids.map(by_id["source_label"]).to_numpy(object)
    table["kind"] = rel["kind"]
    table["trusted"] = rel["trusted"].astype(bool)
    table["label_conflict"] = rel["label_conflict"].astype(bool)
    table["crosses_sets"] = table["set_a"] != table["set_b"]
    for column in SCORE_COLUMNS:
        table[column] = rel[column]
    # the symmetry that maps b onto a is undone when the sides swap (exact pairs carry none)
    turned = swap & rel["dihedral_transform"].notna().to_numpy(bool)
    transform = rel["dihedral_transform"].astype("Int64").copy()
    transform[turned] = [dihedral_inverse(int(g)) for g in transform[turned]]
    table["dihedral_transform"] = transform
    table["_a"], table["_b"] = table["set_a"].map(rank), table["set_b"].map(rank)
    table["_kind"] = table["kind"].map({k: r for r, k in enumerate(KINDS)})
    table = table.sort_values(["_a", "_b", "_kind", "rel_path_a", "rel_path_b"], kind="stable")
    return table[CROSS_COLUMNS].reset_index(drop=True)


def cross_groups(groups: pd.DataFrame, union: pd.DataFrame) -> pd.DataFrame:
    """Every union row with its group, the group's size and the sets it touches (``+``-joined, in set
    order)."""
    frame = groups.merge(union[["row_id", "set", "set_rel_path", "class_name"]], on="row_id", how="left",
                         validate="one_to_one")
    order = {name: k for k, name in enumerate(dict.fromkeys(union["set"]))}
    touched = frame.groupby("group_id")["set"].agg(
        lambda names: "+".join(sorted(set(names), key=order.__getitem__)))
    frame["group_sets"] = frame["group_id"].map(touched)
    return frame.rename(columns={"set_rel_path": "rel_path"})[GROUP_COLUMNS]


# --------------------------------------------------------------------------- the block
def pair_counts(table: pd.DataFrame, order: Sequence[str]) -> list[dict[str, Any]]:
    """Trusted relationships by kind (and rejected near candidates) for every pair of sets but lab-lab."""
    out = []
    for i, a in enumerate(order):
        for b in order[i:]:
            if a == LAB and b == LAB:
                continue
            part = table[(table["set_a"] == a) & (table["set_b"] == b)]
            trusted = part[part["trusted"]]
            out.append({"set_a": a, "set_b": b,
                        **{kind: int((trusted["kind"] == kind).sum()) for kind in KINDS},
                        "trusted": int(len(trusted)), "label_conflicts": int(trusted["label_conflict"].sum()),
                        "near_rejected": int(((part["kind"] == "near") & ~part["trusted"]).sum())})
    return out


def relatives(table: pd.DataFrame, groups: pd.DataFrame, order: Sequence[str]) -> dict[str, Any]:
    """For each non-lab set and each other set: how many of its rows have a relative there, directly (one
    trusted relationship) or through their leakage group (a chain of them)."""
    trusted = table[table["trusted"] & table["crosses_sets"]]
    ends = pd.concat([trusted[["set_a", "row_id_a", "set_b"]].set_axis(["set", "row_id", "other"], axis=1),
                      trusted[["set_b", "row_id_b", "set_a"]].set_axis(["set", "row_id", "other"], axis=1)])
    sets_of = groups["group_sets"].str.split("+")
    out: dict[str, Any] = {}
    for name in order:
        if name == LAB:
            continue
        mine = groups["set"] == name
        direct = ends[ends["set"] == name]
        out[name] = {"rows": int(mine.sum()), "with_relative_in": {
            other: {"directly": int(direct.loc[direct["other"] == other, "row_id"].nunique()),
                    "in_group": int((mine & sets_of.map(lambda s, o=other: o in s)).sum())}
            for other in order if other != name}}
    return out


def conflict_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = ["set_a", "rel_path_a", "class_name_a", "source_label_a", "set_b", "rel_path_b", "class_name_b",
               "source_label_b", "kind", "verified_by"]
    return json_records(table.loc[table["label_conflict"], columns].head(LISTED))


def largest_cross_group(groups: pd.DataFrame) -> dict[str, Any] | None:
    """The largest leakage group touching more than one set: its size, rows per set and members."""
    spanning = groups[groups["group_sets"].str.contains("+", regex=False)]
    if spanning.empty:
        return None
    sizes = spanning.groupby("group_id").size()
    gid = int(sizes.sort_values(ascending=False, kind="stable").index[0])
    members = spanning[spanning["group_id"] == gid]
    return {"group_id": gid, "size": int(len(members)),
            "by_set": {k: int(v) for k, v in members["set"].value_counts(sort=False).items()},
            "classes": {k: int(v) for k, v in members["class_name"].value_counts().sort_index().items()},
            "members": members[["set", "rel_path", "class_name"]].head(LISTED).to_dict("records")}


def cross_review(table: pd.DataFrame, cfg: dict[str, Any]) -> pd.DataFrame:
    """The lab audit's review list (rejected but close) restricted to pairs across sets, closest first."""
    review = review_pairs(table[table["crosses_sets"]], float(cfg["leaf_review_ssim"]),
                          int(cfg["geometry_review_inliers"]), float(cfg["geometry_min_ratio"]))
    return review.sort_values(["leaf_ssim", "geometry_inliers"], ascending=False, na_position="last",
                              kind="stable").reset_index(drop=True)


def gallery_pairs(table: pd.DataFrame, n: int) -> pd.DataFrame:
    """Up to ``n`` trusted pairs across sets: exact copies first (a quarter at most), then near pairs spread
    evenly from the weakest confirmed score up, so the gallery shows where trust begins."""
    trusted = table[table["trusted"] & table["crosses_sets"]]
    exact = trusted[trusted["kind"] != "near"].head(max(1, n // 4))
    near = trusted[trusted["kind"] == "near"].sort_values(["verify_score", "rel_path_a"], kind="stable",
                                                          na_position="first")
    take = min(len(near), n - len(exact))
    picked = near.iloc[np.unique(np.linspace(0, len(near) - 1, take).round().astype(int))] if take > 0 \
        else near.head(0)
    return pd.concat([exact, picked]).reset_index(drop=True)


def cross_block(audit: CrossAudit, cfg: dict[str, Any], plots: dict[str, str]) -> dict[str, Any]:
    """The ``cross_sets`` block of ``audit/audit.json``."""
    cfg = settings(cfg)
    table, groups = audit.table, audit.groups
    order = [s.name for s in audit.sets]
    trusted = table[table["trusted"]]
    across = trusted[trusted["crosses_sets"]]
    conflicts = trusted[trusted["label_conflict"]]
    within = conflicts[~conflicts["crosses_sets"]]
    review = cross_review(table, cfg)
    spanning = groups[groups["group_sets"].str.contains("+", regex=False)]
    flags = {r: review[f"review_{r}"].to_numpy(bool) for r in ("leaf", "geometry")}
    review_columns = ["set_a", "rel_path_a", "class_name_a", "set_b", "rel_path_b", "class_name_b",
                      "proposed_by", "leaf_ssim", "geometry_inliers", "geometry_ratio", "verify_score",
                      "review_reason"]
    hashes = audit.result.hashes
    return {
        "sets": [{"name": s.name, "folder": str(s.root), "rows": int(len(s.rows)),
                  **({"scan": s.accounting} if s.accounting is not None else {})} for s in audit.sets],
        "rows_audited": int(len(groups)),
        "by_set_pair": pair_counts(table, order),
        "across_sets": {"trusted": int(len(across)),
                        **{kind: int((across["kind"] == kind).sum()) for kind in KINDS},
                        "exact_copies": int((across["kind"] != "near").sum())},
        "relatives": relatives(table, groups, order),
        "label_conflicts": {"across_sets": int(conflicts["crosses_sets"].sum()),
                            "within_sets": {s: int((within["set_a"] == s).sum()) for s in order if s != LAB},
                            "pairs": conflict_records(conflicts)},
        "groups": {"groups_across_sets": int(spanning["group_id"].nunique()),
                   "rows_in_groups_across_sets": int(len(spanning)),
                   "largest_across_sets": largest_cross_group(groups)},
        "review": {"pairs": int(len(review)), "by_reason": {r: int(f.sum()) for r, f in flags.items()},
                   "min_leaf_ssim": float(cfg["leaf_review_ssim"]),
                   "min_inliers": int(cfg["geometry_review_inliers"]),
                   "min_ratio": float(cfg["geometry_min_ratio"]),
                   "listed": json_records(review[review_columns].head(LISTED))},
        "plots": plots,
        "seconds": {"total": round(audit.seconds, 2), "hashing_new_rows": round(audit.hashing_seconds, 2),
                    "hashing_workers": hashes.workers,
                    **{k: round(v, 2) for k, v in audit.result.candidates.timings.items()}},
        "evidence": {"pairs": "audit/cross_sets.parquet", "groups": "audit/cross_groups.parquet"},
    }


def json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (numpy scalars as numbers, missing values as null)."""
    import json

    return json.loads(frame.to_json(orient="records"))
