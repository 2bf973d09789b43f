"""Exact relationships, pixel groups, the relationship table, leakage groups and the partition decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from . import pairs
from .errors import AuditInputError
from .hashing import ImageHashes

KINDS = ("exact_bytes", "exact_pixels", "near")
RELATIONSHIP_COLUMNS = ["row_id_a", "row_id_b", "rel_path_a", "rel_path_b", "kind", "proposed_by",
                        "verified_by", "phash_distance", "dhash_distance", "dihedral_distance",
                        "dihedral_transform", "cosine", "verify_score", "geometry_matches",
                        "geometry_inliers", "geometry_ratio", "geometry_mirrored", "geometry_ssim",
                        "leaf_ssim", "reshot_matches", "reshot_inliers", "reshot_scale", "reshot_angle",
                        "reshot_mirrored", "trusted", "class_a", "class_b", "label_conflict", "split_a",
                        "split_b", "crosses_split"]
NO_SPLIT = "none"

# --------------------------------------------------------------------------- exact relationships
def _pairs_within_groups(keys: Sequence[Any]) -> np.ndarray:
    """Every pair (i < j) of positions sharing a key, as an (M, 2) int64 array."""
    codes = pd.factorize(pd.Series(list(keys)), sort=False)[0]
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    parts = []
    for members in np.split(order, bounds):
        if len(members) > 1:
            members = np.sort(members)
            i, j = np.triu_indices(len(members), k=1)
            parts.append(np.stack([members[i], members[j]], axis=1))
    return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


def exact_pairs(sha256: Sequence[str], pixel_sha256: Sequence[str]) -> pd.DataFrame:
    """Byte-identical and pixel-identical pairs, each pair once with its strongest kind.

    Columns i, j (positions, i < j) and kind (``exact_bytes`` or ``exact_pixels``).
    """
    same_bytes = _pairs_within_groups(sha256)
    same_pixels = _pairs_within_groups(pixel_sha256)
    frames = [pd.DataFrame({"i": same_bytes[:, 0], "j": same_bytes[:, 1], "kind": "exact_bytes"}),
              pd.DataFrame({"i": same_pixels[:, 0], "j": same_pixels[:, 1], "kind": "exact_pixels"})]
    both = pd.concat(frames, ignore_index=True)
    # "exact_bytes" sorts first: keep it when a pair is both (identical bytes decode identically).
    both["rank"] = both["kind"].map({k: r for r, k in enumerate(KINDS)})
    both = both.sort_values(["i", "j", "rank"]).drop_duplicates(["i", "j"]).drop(columns="rank")
    return both.reset_index(drop=True).astype({"i": np.int64, "j": np.int64})


# --------------------------------------------------------------------------- pixel groups
@dataclass
class PixelGroups:
    """Files grouped by decoded pixels: near search runs on one representative per group."""

    code: np.ndarray            # group of each position
    representatives: np.ndarray  # first position of each group
    members: np.ndarray         # positions sorted by group
    starts: np.ndarray          # members[starts[g]:starts[g+1]] are group g's positions

    @classmethod
    def from_digests(cls, pixel_sha256: Sequence[str]) -> PixelGroups:
        code = pd.factorize(pd.Series(list(pixel_sha256)), sort=False)[0].astype(np.int64)
        members = np.argsort(code, kind="stable")
        counts = np.bincount(code, minlength=code.max() + 1 if len(code) else 0)
        starts = np.r_[0, np.cumsum(counts)]
        return cls(code, members[starts[:-1]], members, starts)

    def size(self, positions: np.ndarray) -> np.ndarray:
        g = self.code[positions]
        return self.starts[g + 1] - self.starts[g]

    def expand(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (member of a's group, member of b's group) for each pair; returns (pairs, source row)."""
        if len(pairs) == 0:
            return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64)
        ga, gb = self.code[pairs[:, 0]], self.code[pairs[:, 1]]
        na, nb = self.starts[ga + 1] - self.starts[ga], self.starts[gb + 1] - self.starts[gb]
        total = na * nb
        source = np.repeat(np.arange(len(pairs)), total)
        offset = np.arange(total.sum()) - np.repeat(np.cumsum(total) - total, total)
        a = self.members[self.starts[ga][source] + offset // nb[source]]
        b = self.members[self.starts[gb][source] + offset % nb[source]]
        return np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1), source


# --------------------------------------------------------------------------- relationships
NEAR_COLUMNS = ["proposed_by", "verified_by", "dihedral_distance", "dihedral_transform", "cosine",
                "verify_score", "geometry_matches", "geometry_inliers", "geometry_ratio", "geometry_mirrored",
                "geometry_ssim", "leaf_ssim", "reshot_matches", "reshot_inliers", "reshot_scale",
                "reshot_angle", "reshot_mirrored", "trusted"]


def relationship_table(
    rows: pd.DataFrame,
    hashes: ImageHashes,
    exact: pd.DataFrame,
    near: pd.DataFrame,
) -> pd.DataFrame:
    """The contract's ``relationships.parquet``: exact pairs, then near candidates (trusted or not).

    ``rows`` are the admitted manifest rows in hashing order; ``near`` has file positions ``i``, ``j``
    and :data:`NEAR_COLUMNS` (``verify_score`` is the SSIM; ``dihedral_transform`` applies to ``j``).
    Side a is the lexicographically smaller ``rel_path``.  ``label_conflict`` marks *trusted* pairs
    whose classes differ (an untrusted candidate with another label is just a similar image).
    Exact pairs say ``proposed_by`` / ``verified_by`` = ``exact`` and carry no near scores (null).
    """
    from .hashing import dihedral_inverse

    pos_i = np.concatenate([exact["i"].to_numpy(np.int64), near["i"].to_numpy(np.int64)])
    pos_j = np.concatenate([exact["j"].to_numpy(np.int64), near["j"].to_numpy(np.int64)])
    kind = np.concatenate([exact["kind"].to_numpy(object), np.full(len(near), "near", dtype=object)])
    rel = rows["rel_path"].to_numpy(object)
    swap = rel[pos_i] > rel[pos_j]
    a = np.where(swap, pos_j, pos_i)
    b = np.where(swap, pos_i, pos_j)
    classes = rows["class_name"].to_numpy(object)
    splits = rows["inherited_split"].to_numpy(object)
    filler = pd.DataFrame({"proposed_by": "exact", "verified_by": "exact", "verify_score": 1.0,
                           "trusted": True}, index=range(len(exact)))
    extra = pd.concat([filler, near[NEAR_COLUMNS].reset_index(drop=True)], ignore_index=True)
    transform = extra["dihedral_transform"].astype("Int64")
    swapped_near = swap & (kind == "near")
    transform[swapped_near] = [dihedral_inverse(int(g)) for g in transform[swapped_near]]
    # the re-shot verifier's similarity carries a onto b: with the ends swapped it is inverted
    reshot_scale = extra["reshot_scale"].astype("Float64")
    reshot_angle = extra["reshot_angle"].astype("Float64")
    reshot_scale[swapped_near] = 1.0 / reshot_scale[swapped_near]
    # a mirrored fit is its own inverse up to the turn's sign, which the mirror also flips: it keeps its angle
    reshot_angle[swapped_near] = reshot_angle[swapped_near].where(
        extra["reshot_mirrored"].astype("boolean")[swapped_near].fillna(False), -reshot_angle[swapped_near])
    table = pd.DataFrame({
        "row_id_a": rows["row_id"].to_numpy(object)[a], "row_id_b": rows["row_id"].to_numpy(object)[b],
        "rel_path_a": rel[a], "rel_path_b": rel[b], "kind": kind,
        "proposed_by": extra["proposed_by"].to_numpy(object),
        "verified_by": extra["verified_by"].to_numpy(object),
        "phash_distance": pairs.hamming_distance(hashes.phash[a], hashes.phash[b]),
        "dhash_distance": pairs.hamming_distance(hashes.dhash[a], hashes.dhash[b]),
        "dihedral_distance": extra["dihedral_distance"].astype("Int64").to_numpy(),
        "dihedral_transform": transform.to_numpy(),
        "cosine": extra["cosine"].astype("Float64").round(4).to_numpy(),
        "verify_score": extra["verify_score"].astype("Float64").round(4).to_numpy(),
        "geometry_matches": extra["geometry_matches"].astype("Int64").to_numpy(),
        "geometry_inliers": extra["geometry_inliers"].astype("Int64").to_numpy(),
        "geometry_ratio": extra["geometry_ratio"].astype("Float64").round(4).to_numpy(),
        "geometry_mirrored": extra["geometry_mirrored"].astype("boolean").to_numpy(),
        "geometry_ssim": extra["geometry_ssim"].astype("Float64").round(4).to_numpy(),
        "leaf_ssim": extra["leaf_ssim"].astype("Float64").round(4).to_numpy(),
        "reshot_matches": extra["reshot_matches"].astype("Int64").to_numpy(),
        "reshot_inliers": extra["reshot_inliers"].astype("Int64").to_numpy(),
        "reshot_scale": reshot_scale.round(4).to_numpy(),
        "reshot_angle": reshot_angle.round(2).to_numpy(),
        "reshot_mirrored": extra["reshot_mirrored"].astype("boolean").to_numpy(),
        "trusted": extra["trusted"].astype(bool).to_numpy(),
        "class_a": classes[a], "class_b": classes[b], "split_a": splits[a], "split_b": splits[b],
    })
    table["label_conflict"] = table["trusted"] & (table["class_a"] != table["class_b"])
    table["crosses_split"] = ((table["split_a"] != table["split_b"]) & (table["split_a"] != NO_SPLIT)
                              & (table["split_b"] != NO_SPLIT))
    table["kind"] = pd.Categorical(table["kind"], categories=list(KINDS))
    table = table.sort_values(["kind", "rel_path_a", "rel_path_b"], kind="stable").reset_index(drop=True)
    table["kind"] = table["kind"].astype(str)
    return table[RELATIONSHIP_COLUMNS]


def leakage_groups(row_ids: Sequence[str], relationships: pd.DataFrame) -> pd.DataFrame:
    """Connected components over trusted relationships: every row with its group (singletons too).

    ``group_id`` numbers groups by their first row in ``row_ids`` order, so it is stable for a corpus.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    row_ids = list(row_ids)
    index = pd.Index(row_ids)
    if index.has_duplicates:
        raise AuditInputError("the admitted manifest rows have duplicate row_id values; "
                              "rerun chapter 'corpus'")
    trusted = relationships[relationships["trusted"]]
    a = index.get_indexer(trusted["row_id_a"])
    b = index.get_indexer(trusted["row_id_b"])
    if (a < 0).any() or (b < 0).any():
        raise AuditInputError("a trusted relationship names a row that is not an admitted manifest row")
    n = len(row_ids)
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    # Renumber by first appearance so ids do not depend on scipy's traversal order.
    _, first = np.unique(labels, return_index=True)
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[np.argsort(first)] = np.arange(len(first))
    group = renumber[labels] if n else np.zeros(0, dtype=np.int64)
    size = np.bincount(group)[group] if n else np.zeros(0, dtype=np.int64)
    return pd.DataFrame({"row_id": row_ids, "group_id": group.astype(np.int64),
                         "group_size": size.astype(np.int64)})


def group_stats(groups: pd.DataFrame, rows: pd.DataFrame | None = None) -> dict[str, Any]:
    """Counts of groups, multi-row groups, rows in them, the largest, and the size distribution."""
    sizes = groups.drop_duplicates("group_id")["group_size"]
    stats: dict[str, Any] = {
        "rows": int(len(groups)), "groups": int(len(sizes)), "multi_row_groups": int((sizes > 1).sum()),
        "rows_in_multi_row_groups": int(sizes[sizes > 1].sum()),
        "largest_group": int(sizes.max()) if len(sizes) else 0,
        "size_distribution": {str(k): int(v) for k, v in sizes.value_counts().sort_index().items()},
    }
    if rows is not None:
        split_of = rows.set_index("row_id")["inherited_split"]
        spans = groups.assign(split=groups["row_id"].map(split_of))
        spans = spans[spans["split"] != NO_SPLIT].groupby("group_id")["split"].nunique()
        stats["groups_across_inherited_splits"] = int((spans > 1).sum())
    return stats


def crossing_counts(relationships: pd.DataFrame) -> dict[str, int]:
    """Trusted relationships whose two rows sit in different inherited splits, by kind and in total."""
    crossing = relationships[relationships["trusted"] & relationships["crosses_split"]]
    counts = {kind: int((crossing["kind"] == kind).sum()) for kind in KINDS}
    counts["exact"] = counts["exact_bytes"] + counts["exact_pixels"]
    counts["total"] = int(len(crossing))
    return counts


def inherited_decision(rows: pd.DataFrame, crossings: dict[str, int],
                       stats: dict[str, Any]) -> dict[str, Any]:
    """Accept or reject the corpus's own partition ("none" when there is no partition to judge)."""
    present = sorted(s for s in rows["inherited_split"].unique() if s != NO_SPLIT)
    base = {"splits": present, "crossing_relationships": crossings,
            "crossing_groups": stats.get("groups_across_inherited_splits", 0)}
    if len(present) < 2:
        reason = ("the corpus has no inherited train/val/test folders (flat layout)" if not present else
                  f"the corpus has only one inherited split ({present[0]}): there is no partition to audit")
        return {"decision": "none", "rejected": None, "reason": reason, **base}
    total = crossings["total"]
    if total:
        reason = (f"{total:,} trusted relationship(s) cross the inherited {'/'.join(present)} partition "
                  f"({crossings['exact']:,} exact: {crossings['exact_bytes']:,} identical files and "
                  f"{crossings['exact_pixels']:,} identical pixels; {crossings['near']:,} verified near "
                  f"duplicates), joining {base['crossing_groups']:,} leakage group(s) across splits; "
                  "the same picture or specimen would be scored as unseen")
        return {"decision": "reject", "rejected": True, "reason": reason, **base}
    return {"decision": "accept", "rejected": False,
            "reason": f"no trusted relationship crosses the inherited {'/'.join(present)} partition", **base}


