"""Chapter 2 — Audit: which images are the same picture, or the same specimen, and does that leak?

Relationships between admitted images, strongest first:

* ``exact_bytes`` — identical files (the manifest's SHA-256).
* ``exact_pixels`` — different files, identical decoded pixels (same image re-saved with other metadata):
  SHA-256 of the RGB array (after EXIF orientation) and its size.
* ``near`` — candidate-then-verify.  64-bit pHash (and dHash as a second opinion, both ``imagehash``)
  propose pairs: every pair within ``audit.table_radius`` (the exact all-pairs search of
  :mod:`cropcop_utils.hamming`), capped at ``audit.max_neighbours`` nearest partners per image (by
  pHash, then dHash) so uniform backdrops cannot flood the verifier.  :mod:`cropcop_utils.verifier`
  then scores each candidate with a registered, subject-weighted SSIM; only pairs within
  ``audit.phash_radius`` whose score reaches ``audit.verify_threshold`` are *trusted*.  Both scores are
  recorded either way.

A pair is recorded once, with its strongest kind.  Near candidates are searched between distinct pixel
contents only (a byte copy adds no information) and expanded back to every file holding them.

Trusted relationships form leakage groups (connected components, ``scipy.sparse.csgraph``).  The
inherited partition (the corpus's own train/val/test folders) is rejected when any trusted relationship
crosses it.  On the synthetic corpus every figure is checked against the planted truth.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from . import hamming, imaging, verifier
from .audit_figures import (
    gallery_sample,
    plot_group_sizes,
    plot_pair_gallery,
    plot_threshold_evidence,
    plot_verifier_calibration,
)
from .config import progress_wanted
from .evidence import Chapter, sha256_bytes

KINDS = ("exact_bytes", "exact_pixels", "near")
HASH_COLUMNS = ["row_id", "phash", "dhash", "pixel_sha256"]
RELATIONSHIP_COLUMNS = ["row_id_a", "row_id_b", "rel_path_a", "rel_path_b", "kind", "phash_distance",
                        "dhash_distance", "verify_score", "trusted", "class_a", "class_b", "label_conflict",
                        "split_a", "split_b", "crosses_split"]
NO_SPLIT = "none"
DEFAULTS: dict[str, Any] = {
    "hash_size": 8,           # 8x8 = 64-bit pHash / dHash
    "workers": None,          # hashing processes (None: all cores)
    "phash_radius": 12,       # near candidates trusted up to this pHash distance (evidence in the chapter)
    "table_radius": 16,       # the threshold table covers pHash radius 0..table_radius
    "max_neighbours": 4,      # candidates kept per image (nearest by pHash, then dHash)
    "verify_threshold": 0.87,  # verifier score that confirms a candidate (calibrated on synthetic truth)
    "verify_batch": 512,
    "gallery_pairs": 12,
}
INLINE_BELOW = 256  # smaller corpora are hashed in-process: a pool costs more than it saves
HASH_SIDE_LIMIT = 64  # images are box-reduced to about this short side before hashing


class AuditInputError(ValueError):
    """The corpus manifest or an image does not match what the audit needs (names the file / fix)."""


# --------------------------------------------------------------------------- settings
def settings(ctx_or_section: Any) -> dict[str, Any]:
    """The ``audit`` profile section over :data:`DEFAULTS`, validated."""
    section = ctx_or_section.section("audit") if hasattr(ctx_or_section, "section") else ctx_or_section
    merged = {**DEFAULTS, **(section or {})}
    unknown = set(merged) - set(DEFAULTS)
    if unknown:
        raise AuditInputError(f"unknown audit setting(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    if merged["hash_size"] != 8:
        raise AuditInputError("audit.hash_size must be 8: the pair search works on 64-bit hashes")
    if not 0 <= merged["phash_radius"] <= merged["table_radius"] < 64:
        raise AuditInputError("audit radii must satisfy 0 <= phash_radius <= table_radius < 64, got "
                              f"{merged['phash_radius']} and {merged['table_radius']}")
    if int(merged["max_neighbours"]) < 1:
        raise AuditInputError("audit.max_neighbours must be at least 1")
    return merged


# --------------------------------------------------------------------------- hashing
@dataclass
class ImageHashes:
    """Per-image audit fingerprints, in manifest order."""

    phash: np.ndarray        # uint64
    dhash: np.ndarray        # uint64
    pixel_sha256: list[str]
    grey: np.ndarray         # (N, THUMB, THUMB) uint8 thumbnails for the verifier
    weight: np.ndarray       # (N, THUMB, THUMB) uint8 subject weights
    seconds: float = 0.0
    workers: int = 1


def _hash64(image_hash: Any) -> int:
    """The 64 hash bits as an integer, row-major, most significant bit first: ``int(str(h), 16)``,
    without imagehash's slow per-bit string formatting."""
    return int.from_bytes(np.packbits(np.asarray(image_hash.hash, dtype=bool).ravel()).tobytes(), "big")


def pixel_digest(rgb: Any) -> str:
    """SHA-256 of decoded RGB pixels and their size: equal iff two files decode to the same picture."""
    header = f"RGB {rgb.width}x{rgb.height}\n".encode()
    return hashlib.sha256(header + rgb.tobytes()).hexdigest()


def fingerprint_image(
    path: str | os.PathLike,
    expected_sha256: str | None = None,
    max_image_pixels: int | None = None,
) -> tuple[int, int, str, np.ndarray, np.ndarray]:
    """(pHash, dHash, pixel SHA-256, grey thumbnail, subject weight) of one file.

    Decoded by the loading contract (:func:`imaging.open_decoded` + :func:`imaging.to_rgb`, EXIF
    orientation applied) from the same bytes that are checked against ``expected_sha256``, so a file
    changed since the corpus scan is refused instead of silently audited.
    """
    import imagehash

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditInputError(f"{path}: cannot read admitted image ({error}); rerun chapter 'corpus'") \
            from None
    if expected_sha256 is not None and sha256_bytes(data) != expected_sha256:
        raise AuditInputError(f"{path} changed since chapter 'corpus' scanned it (SHA-256 differs from "
                              "corpus/manifest.parquet); rerun chapter 'corpus' and then 'audit'.")
    try:
        rgb = imaging.to_rgb(imaging.open_decoded(data, max_image_pixels, path=path))
    except imaging.ImageLoadError as error:
        raise AuditInputError(f"{path}: admitted by chapter 'corpus' but cannot be decoded now "
                              f"({error.reason}: {error.detail}); rerun chapter 'corpus'.") from None
    digest = pixel_digest(rgb)
    # Hashes and thumbnails need a small image only (pHash resamples to 32x32): an integer box reduction
    # first (as JPEG draft decoding would) makes them ~4x cheaper without changing what they see.
    factor = min(rgb.size) // HASH_SIDE_LIMIT
    small = rgb.reduce(factor) if factor >= 2 else rgb
    grey = small.convert("L")
    phash = _hash64(imagehash.phash(grey, hash_size=8))
    dhash = _hash64(imagehash.dhash(grey, hash_size=8))
    thumb, weight = verifier.thumbnail(small)
    return phash, dhash, digest, thumb, weight


def _hash_chunk(root: str, rel_paths: list[str], shas: list[str | None],
                max_image_pixels: int | None) -> tuple[Any, ...]:
    out = [fingerprint_image(Path(root) / rel, sha, max_image_pixels) for rel, sha in zip(rel_paths, shas,
                                                                                           strict=True)]
    return (np.array([o[0] for o in out], dtype=np.uint64), np.array([o[1] for o in out], dtype=np.uint64),
            [o[2] for o in out], np.stack([o[3] for o in out]), np.stack([o[4] for o in out]))


def hash_images(
    root: str | os.PathLike,
    rel_paths: Sequence[str],
    sha256s: Sequence[str | None] | None = None,
    workers: int | None = None,
    progress: bool = True,
    max_image_pixels: int | None = None,
) -> ImageHashes:
    """Fingerprint every image on a process pool (chunks of files), results in input order."""
    rel_paths = list(rel_paths)
    shas = list(sha256s) if sha256s is not None else [None] * len(rel_paths)
    workers = max(1, int(workers or os.cpu_count() or 1))
    side = verifier.THUMB
    start = time.perf_counter()
    if not rel_paths:
        empty = np.zeros((0, side, side), dtype=np.uint8)
        return ImageHashes(np.zeros(0, np.uint64), np.zeros(0, np.uint64), [], empty, empty.copy(), 0.0, 1)
    size = max(16, min(256, math.ceil(len(rel_paths) / (workers * 8))))
    chunks = [(i, min(len(rel_paths), i + size)) for i in range(0, len(rel_paths), size)]
    results: list[Any] = [None] * len(chunks)
    bar = tqdm(total=len(rel_paths), desc="hashing images", unit="img", disable=not progress_wanted(progress),
               mininterval=1.0)
    with bar:
        if workers == 1 or len(rel_paths) < INLINE_BELOW:
            workers = 1
            for k, (a, b) in enumerate(chunks):
                results[k] = _hash_chunk(str(root), rel_paths[a:b], shas[a:b], max_image_pixels)
                bar.update(b - a)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_hash_chunk, str(root), rel_paths[a:b], shas[a:b], max_image_pixels): k
                           for k, (a, b) in enumerate(chunks)}
                for future in as_completed(futures):
                    k = futures[future]
                    results[k] = future.result()
                    bar.update(chunks[k][1] - chunks[k][0])
    return ImageHashes(
        phash=np.concatenate([r[0] for r in results]), dhash=np.concatenate([r[1] for r in results]),
        pixel_sha256=[d for r in results for d in r[2]], grey=np.concatenate([r[3] for r in results]),
        weight=np.concatenate([r[4] for r in results]), seconds=time.perf_counter() - start, workers=workers)


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


# --------------------------------------------------------------------------- near candidates
def cap_neighbours(pairs: np.ndarray, primary: np.ndarray, secondary: np.ndarray, k: int) -> np.ndarray:
    """Keep a pair when it is among the ``k`` nearest partners of either of its two ends.

    Nearness: ``primary`` distance, then ``secondary``, then the partner's position (deterministic).
    Returns a boolean mask over ``pairs`` (rows i, j).  Why: on uniform backdrops hundreds of unrelated
    images fall inside a loose radius of each other; a per-image cap bounds the verifier's work at
    ``k`` × N pairs while a true partner, being nearest, survives.
    """
    m = len(pairs)
    if m == 0:
        return np.zeros(0, dtype=bool)
    node = np.concatenate([pairs[:, 0], pairs[:, 1]])
    other = np.concatenate([pairs[:, 1], pairs[:, 0]])
    first = np.concatenate([primary, primary])
    second = np.concatenate([secondary, secondary])
    order = np.lexsort((other, second, first, node))
    sorted_node = node[order]
    starts = np.flatnonzero(np.r_[True, sorted_node[1:] != sorted_node[:-1]])
    rank = np.arange(2 * m) - np.repeat(starts, np.diff(np.r_[starts, 2 * m]))
    kept = np.zeros(2 * m, dtype=bool)
    kept[order[rank < k]] = True
    return kept[:m] | kept[m:]


@dataclass
class NearCandidates:
    """Candidate pairs between distinct pixel contents (positions of representatives)."""

    pairs: np.ndarray             # (M, 2) representative positions, i < j
    phash_distance: np.ndarray
    dhash_distance: np.ndarray
    capped: np.ndarray            # bool: survives the per-image cap
    scores: verifier.PairScores | None
    search_seconds: float
    verify_seconds: float


def near_candidates(
    hashes: ImageHashes,
    representatives: np.ndarray,
    radius: int,
    max_neighbours: int,
    batch: int = verifier.DEFAULT_BATCH,
    progress: bool = False,
    workers: int = 1,
) -> NearCandidates:
    """Pairs of representatives within ``radius`` pHash bits, capped, and verified."""
    start = time.perf_counter()
    # The search itself runs in-process: at corpus sizes it takes well under a second.
    found = hamming.radius_pairs(hashes.phash[representatives], radius, workers=1)
    pairs = representatives[found[:, :2]] if len(found) else np.zeros((0, 2), dtype=np.int64)
    phash_d = found[:, 2]
    dhash_d = hamming.hamming_distance(hashes.dhash[pairs[:, 0]], hashes.dhash[pairs[:, 1]])
    capped = cap_neighbours(found[:, :2], phash_d, dhash_d, max_neighbours)
    search_seconds = time.perf_counter() - start
    start = time.perf_counter()
    scores = verifier.verify_pairs(hashes.grey, hashes.weight, pairs[capped], batch=batch, progress=progress,
                                   workers=workers)
    return NearCandidates(pairs, phash_d, dhash_d, capped, scores, search_seconds,
                          time.perf_counter() - start)


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
def relationship_table(
    rows: pd.DataFrame,
    hashes: ImageHashes,
    exact: pd.DataFrame,
    near_pairs: np.ndarray,
    near_scores: np.ndarray,
    threshold: float,
) -> pd.DataFrame:
    """The contract's ``relationships.parquet``: exact pairs, then near candidates (trusted or not).

    ``rows`` are the admitted manifest rows in hashing order; ``near_pairs`` are file positions.
    Side a is the lexicographically smaller ``rel_path``.  ``label_conflict`` marks *trusted* pairs
    whose classes differ (an untrusted candidate with another label is just a similar image).
    """
    pos_i = np.concatenate([exact["i"].to_numpy(np.int64), near_pairs[:, 0].astype(np.int64)])
    pos_j = np.concatenate([exact["j"].to_numpy(np.int64), near_pairs[:, 1].astype(np.int64)])
    kind = np.concatenate([exact["kind"].to_numpy(object), np.full(len(near_pairs), "near", dtype=object)])
    score = np.concatenate([np.ones(len(exact)), np.asarray(near_scores, dtype=np.float64)])
    trusted = np.concatenate([np.ones(len(exact), dtype=bool), np.asarray(near_scores) >= threshold])
    rel = rows["rel_path"].to_numpy(object)
    swap = rel[pos_i] > rel[pos_j]
    a = np.where(swap, pos_j, pos_i)
    b = np.where(swap, pos_i, pos_j)
    classes = rows["class_name"].to_numpy(object)
    splits = rows["inherited_split"].to_numpy(object)
    table = pd.DataFrame({
        "row_id_a": rows["row_id"].to_numpy(object)[a], "row_id_b": rows["row_id"].to_numpy(object)[b],
        "rel_path_a": rel[a], "rel_path_b": rel[b], "kind": kind,
        "phash_distance": hamming.hamming_distance(hashes.phash[a], hashes.phash[b]),
        "dhash_distance": hamming.hamming_distance(hashes.dhash[a], hashes.dhash[b]),
        "verify_score": np.round(score, 4), "trusted": trusted,
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


# --------------------------------------------------------------------------- synthetic truth
TRUTH_KINDS = ("byte_copy", "reencode", "resize", "crop", "brightness", "reshot")
NEAR_TRANSFORMS = ("reencode", "resize", "crop", "brightness")


@dataclass
class Truth:
    """Planted relations as position pairs over the audited rows (only pairs with both ends admitted)."""

    by_kind: dict[str, set[tuple[int, int]]]
    group_of: dict[int, int]  # position -> planted group (connected planted relations)

    @classmethod
    def from_planted(cls, truth: dict[str, Any], rel_paths: Sequence[str]) -> Truth:
        from . import synthetic

        position = {rel: k for k, rel in enumerate(rel_paths)}

        def as_positions(pairs: set[frozenset[str]]) -> set[tuple[int, int]]:
            out = set()
            for pair in pairs:
                a, b = tuple(pair)
                if a in position and b in position:
                    i, j = position[a], position[b]
                    out.add((min(i, j), max(i, j)))
            return out

        by_kind = {kind: as_positions(synthetic.planted_pairs(truth, [kind])) for kind in TRUTH_KINDS}
        group_of = {}
        for g, members in enumerate(synthetic.planted_groups(truth)):
            for rel in members:
                if rel in position:
                    group_of[position[rel]] = g
        return cls(by_kind, group_of)

    def related(self, i: int, j: int) -> bool:
        g = self.group_of.get(i)
        return g is not None and g == self.group_of.get(j)

    def evaluate(self, trusted: set[tuple[int, int]], trusted_near: set[tuple[int, int]]) -> dict[str, Any]:
        """Recall per planted kind, and precision of trusted (near) pairs against planted groups."""
        recall = {kind: (len(pairs & trusted) / len(pairs) if pairs else None)
                  for kind, pairs in self.by_kind.items()}
        near = set().union(*(self.by_kind[k] for k in NEAR_TRANSFORMS))
        true_near = sum(self.related(i, j) for i, j in trusted_near)
        true_all = sum(self.related(i, j) for i, j in trusted)
        return {
            "recall": recall,
            "near_duplicate_recall": len(near & trusted) / len(near) if near else None,
            "near_duplicate_found": len(near & trusted), "near_duplicate_planted": len(near),
            "reshot_recall": recall["reshot"],
            "byte_copy_recall": recall["byte_copy"],
            "near_precision": true_near / len(trusted_near) if trusted_near else None,
            "precision": true_all / len(trusted) if trusted else None,
            "trusted_near_pairs": len(trusted_near), "false_near_pairs": len(trusted_near) - true_near,
        }


def _pair_set(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in pairs}


# --------------------------------------------------------------------------- threshold evidence
def threshold_table(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    threshold: float,
    table_radius: int,
    truth: Truth | None = None,
) -> pd.DataFrame:
    """One row per pHash radius 0..table_radius: candidate pairs (file pairs, excluding exact ones),
    pairs left by the per-image cap, pairs the verifier confirms; with truth, recall/precision."""
    weight = groups.size(candidates.pairs[:, 0]) * groups.size(candidates.pairs[:, 1]) \
        if len(candidates.pairs) else np.zeros(0, dtype=np.int64)
    capped = candidates.capped
    score = np.full(len(candidates.pairs), -np.inf)
    if candidates.scores is not None:
        score[capped] = candidates.scores.score
    confirmed = capped & (score >= threshold)
    exact_set = _pair_set(exact[["i", "j"]].to_numpy()) if truth is not None else set()
    expanded, source = groups.expand(candidates.pairs[confirmed]) if truth is not None else (None, None)
    source_distance = candidates.phash_distance[confirmed][source] if truth is not None else None
    rows = []
    for radius in range(table_radius + 1):
        inside = candidates.phash_distance <= radius
        row: dict[str, Any] = {
            "radius": radius,
            "candidate_pairs": int(weight[inside].sum()),
            "capped_pairs": int(weight[inside & capped].sum()),
            "confirmed_pairs": int(weight[inside & confirmed].sum()),
            "exact_pairs": int(len(exact)),
        }
        capped_n = row["capped_pairs"]
        row["confirmed_share"] = row["confirmed_pairs"] / capped_n if capped_n else None
        if truth is not None:
            near = _pair_set(expanded[source_distance <= radius])
            result = truth.evaluate(exact_set | near, near)
            row.update({f"recall_{k}": v for k, v in result["recall"].items()})
            row["recall_near_duplicate"] = result["near_duplicate_recall"]
            row["precision_near"] = result["near_precision"]
            row["precision"] = result["precision"]
        rows.append(row)
    return pd.DataFrame(rows)


def verifier_calibration(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    radius: int,
    truth: Truth | None = None,
    thresholds: Sequence[float] | None = None,
) -> pd.DataFrame:
    """Confirmed pairs (and with truth precision / recall) per verifier threshold at ``radius``."""
    thresholds = np.round(np.arange(0.50, 1.0001, 0.01), 2) if thresholds is None else np.asarray(thresholds)
    inside = candidates.capped & (candidates.phash_distance <= radius)
    score = np.full(len(candidates.pairs), -np.inf)
    if candidates.scores is not None:
        score[candidates.capped] = candidates.scores.score
    expanded, source = groups.expand(candidates.pairs[inside])
    expanded_score = score[inside][source]
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    rows = []
    for t in thresholds:
        kept = expanded[expanded_score >= t]
        row: dict[str, Any] = {"threshold": float(t), "confirmed_pairs": int(len(kept))}
        if truth is not None:
            near = _pair_set(kept)
            result = truth.evaluate(exact_set | near, near)
            row.update({"recall_near_duplicate": result["near_duplicate_recall"],
                        "recall_reshot": result["reshot_recall"], "recall_crop": result["recall"]["crop"],
                        "precision_near": result["near_precision"], "precision": result["precision"]})
        rows.append(row)
    return pd.DataFrame(rows)


def calibrated_threshold(calibration: pd.DataFrame, min_precision: float = 0.98) -> float | None:
    """The lowest threshold whose near-pair precision reaches ``min_precision`` (most recall)."""
    if "precision_near" not in calibration:
        return None
    ok = calibration[calibration["precision_near"].fillna(0) >= min_precision]
    return float(ok["threshold"].min()) if len(ok) else None


def radius_reason(table: pd.DataFrame, radius: int, threshold: float) -> str:
    """Why the profile's pHash radius is a sensible place to stop, in numbers from this run."""
    at = table.set_index("radius")
    here, top = at.loc[radius], at.iloc[-1]
    extra_candidates = int(top["capped_pairs"] - here["capped_pairs"])
    extra_confirmed = int(top["confirmed_pairs"] - here["confirmed_pairs"])
    text = (f"pHash radius {radius} (profile audit.phash_radius) with verifier threshold {threshold:.2f}: "
            f"{int(here['confirmed_pairs']):,} of {int(here['capped_pairs']):,} capped candidates are "
            f"confirmed inside it; widening to radius {int(top.name)} adds {extra_candidates:,} candidates "
            f"but only {extra_confirmed:,} confirmed pairs")
    if "recall_near_duplicate" in at:
        text += (f"; on the planted truth near-duplicate recall is {here['recall_near_duplicate']:.3f} here "
                 f"(vs {top['recall_near_duplicate']:.3f} at radius {int(top.name)}) with near-pair "
                 f"precision {here['precision_near']:.3f}")
    return text + "."


# --------------------------------------------------------------------------- the chapter
MANIFEST_NEEDS = ("row_id", "rel_path", "class_name", "inherited_split", "sha256", "admitted")


def admitted_rows(manifest: pd.DataFrame) -> pd.DataFrame:
    """The manifest's admitted rows, in manifest order, with the columns the audit needs."""
    missing = [c for c in MANIFEST_NEEDS if c not in manifest.columns]
    if missing:
        raise AuditInputError(f"corpus/manifest.parquet lacks column(s) {missing}; rerun chapter 'corpus'")
    rows = manifest[manifest["admitted"].astype(bool)].reset_index(drop=True)
    if rows.empty:
        raise AuditInputError("corpus/manifest.parquet admits no image: nothing to audit; check the corpus")
    return rows[list(MANIFEST_NEEDS)]


def family_recall(truth: dict[str, Any], rel_paths: Sequence[str], groups: pd.DataFrame) -> dict[str, Any]:
    """Planted re-shot families whose admitted members all ended up in one leakage group."""
    group_of = dict(zip(rel_paths, groups["group_id"], strict=True))
    families: dict[int, list[str]] = {}
    for f in truth["files"]:
        if f.get("family") is not None and f["rel_path"] in group_of:
            families.setdefault(int(f["family"]), []).append(f["rel_path"])
    families = {k: v for k, v in families.items() if len(v) > 1}
    whole = sum(len({group_of[r] for r in members}) == 1 for members in families.values())
    return {"families": len(families), "kept_whole": int(whole),
            "recall": whole / len(families) if families else None}


@dataclass
class AuditResult:
    """Everything the audit computes for one corpus (``run_chapter`` writes it to the run folder)."""

    rows: pd.DataFrame
    hashes: ImageHashes
    exact: pd.DataFrame
    pixel_groups: PixelGroups
    candidates: NearCandidates
    relationships: pd.DataFrame
    groups: pd.DataFrame
    stats: dict[str, Any]
    crossings: dict[str, int]
    decision: dict[str, Any]
    table: pd.DataFrame
    calibration: pd.DataFrame
    truth: Truth | None
    settings: dict[str, Any]

    def hash_table(self) -> pd.DataFrame:
        return pd.DataFrame({"row_id": self.rows["row_id"], "phash": self.hashes.phash,
                             "dhash": self.hashes.dhash,
                             "pixel_sha256": self.hashes.pixel_sha256})[HASH_COLUMNS]

    def truth_check(self, truth_json: dict[str, Any]) -> dict[str, Any]:
        """Trusted relationships against the planted truth (recall per kind, precision, families)."""
        from . import synthetic

        assert self.truth is not None
        index = {r: k for k, r in enumerate(self.rows["rel_path"])}
        trusted = self.relationships[self.relationships["trusted"]]
        pairs = {(min(index[a], index[b]), max(index[a], index[b])): kind
                 for a, b, kind in zip(trusted["rel_path_a"], trusted["rel_path_b"], trusted["kind"],
                                       strict=True)}
        near = {pair for pair, kind in pairs.items() if kind == "near"}
        planted_conflicts = synthetic.label_conflicts(truth_json)
        conflicts = trusted[trusted["label_conflict"]]
        found = {frozenset(pair)
                 for pair in zip(conflicts["rel_path_a"], conflicts["rel_path_b"], strict=True)}
        return {**self.truth.evaluate(set(pairs), near),
                "reshot_families": family_recall(truth_json, self.rows["rel_path"].tolist(), self.groups),
                "label_conflicts_planted": len(planted_conflicts),
                "label_conflicts_found": len(planted_conflicts & found),
                "calibrated_threshold": calibrated_threshold(self.calibration)}


def audit_corpus(
    rows: pd.DataFrame,
    corpus_root: str | os.PathLike,
    cfg: dict[str, Any] | None = None,
    workers: int | None = None,
    progress: bool = False,
    truth_json: dict[str, Any] | None = None,
    max_image_pixels: int | None = None,
) -> AuditResult:
    """The whole audit of admitted ``rows`` (row_id, rel_path, class_name, inherited_split, sha256)."""
    cfg = settings(cfg or {})
    workers = int(workers or cfg["workers"] or os.cpu_count() or 1)
    radius, threshold = int(cfg["phash_radius"]), float(cfg["verify_threshold"])
    rows = rows.reset_index(drop=True)
    hashes = hash_images(corpus_root, rows["rel_path"], rows["sha256"], workers, progress, max_image_pixels)
    exact = exact_pairs(rows["sha256"], hashes.pixel_sha256)
    pixel_groups = PixelGroups.from_digests(hashes.pixel_sha256)
    candidates = near_candidates(hashes, pixel_groups.representatives, int(cfg["table_radius"]),
                                 int(cfg["max_neighbours"]), int(cfg["verify_batch"]), progress, workers)
    score = np.full(len(candidates.pairs), -np.inf)
    score[candidates.capped] = candidates.scores.score
    chosen = candidates.capped & (candidates.phash_distance <= radius)
    near_pairs, source = pixel_groups.expand(candidates.pairs[chosen])
    relationships = relationship_table(rows, hashes, exact, near_pairs, score[chosen][source], threshold)
    groups = leakage_groups(rows["row_id"], relationships)
    stats = group_stats(groups, rows)
    crossings = crossing_counts(relationships)
    truth = Truth.from_planted(truth_json, rows["rel_path"].tolist()) if truth_json is not None else None
    table = threshold_table(candidates, pixel_groups, exact, threshold, int(cfg["table_radius"]), truth)
    calibration = verifier_calibration(candidates, pixel_groups, exact, radius, truth)
    return AuditResult(rows, hashes, exact, pixel_groups, candidates, relationships, groups, stats, crossings,
                       inherited_decision(rows, crossings, stats), table, calibration, truth, cfg)


def run_chapter(ctx: Any, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Audit the admitted corpus: write ``audit/{hashes,relationships,groups,threshold_table,
    verifier_calibration}.parquet``, the gallery and plots, and ``audit/audit.json``."""
    import matplotlib.pyplot as plt

    started = time.perf_counter()
    ch = Chapter(ctx.run_dir, "audit")
    cfg = settings(ctx)
    rows = admitted_rows(ch.read_parquet("corpus/manifest.parquet"))
    truth_json = None
    if ctx.is_synthetic:
        from . import synthetic
        from .evidence import sha256_file

        truth_json = synthetic.load_truth(ctx.planted_truth_path)
        ch.inputs["synthetic/planted.json"] = sha256_file(ctx.planted_truth_path)
    result = audit_corpus(rows, ctx.corpus_root, cfg, workers, progress, truth_json,
                          ctx.section("corpus").get("max_image_pixels"))
    radius, threshold = int(cfg["phash_radius"]), float(cfg["verify_threshold"])
    ch.write_parquet("audit/hashes.parquet", result.hash_table())
    ch.write_parquet("audit/relationships.parquet", result.relationships)
    ch.write_parquet("audit/groups.parquet", result.groups)
    ch.write_parquet("audit/threshold_table.parquet", result.table)
    ch.write_parquet("audit/verifier_calibration.parquet", result.calibration)

    sample = gallery_sample(result.relationships, int(cfg["gallery_pairs"]))
    plots = {"gallery": ("audit/gallery.png", plot_pair_gallery(sample, ctx.corpus_root, threshold)),
             "group_sizes": ("audit/group_sizes.png", plot_group_sizes(result.groups)),
             "threshold_evidence": ("audit/threshold_evidence.png",
                                    plot_threshold_evidence(result.table, radius))}
    if result.truth is not None:
        plots["verifier_calibration"] = ("audit/verifier_calibration.png",
                                         plot_verifier_calibration(result.calibration, threshold))
    for rel_path, figure in plots.values():
        ch.save_figure(figure, rel_path, dpi=100)
        plt.close(figure)

    relationships, candidates, hashes = result.relationships, result.candidates, result.hashes
    trusted = relationships[relationships["trusted"]]
    conflicts = trusted[trusted["label_conflict"]]
    near = relationships["kind"] == "near"
    seconds = time.perf_counter() - started
    figures = {
        "rows_audited": int(len(rows)),
        "distinct_pixel_contents": int(len(result.pixel_groups.representatives)),
        "relationships": {
            "exact_bytes": int((relationships["kind"] == "exact_bytes").sum()),
            "exact_pixels": int((relationships["kind"] == "exact_pixels").sum()),
            "near_trusted": int((near & relationships["trusted"]).sum()),
            "near_rejected": int((near & ~relationships["trusted"]).sum()),
            "trusted": int(len(trusted)),
        },
        "label_conflicts": {
            "count": int(len(conflicts)),
            "pairs": conflicts[["rel_path_a", "class_a", "rel_path_b", "class_b", "kind"]].head(200)
            .to_dict("records"),
        },
        "groups": result.stats,
        "crossings": result.crossings,
        "inherited_partition": result.decision,
        "chosen_radius": {"phash_radius": radius, "reason": radius_reason(result.table, radius, threshold),
                          "evidence": "audit/threshold_table.parquet"},
        "verifier": {"threshold": threshold, "max_neighbours": int(cfg["max_neighbours"]),
                     "candidate_radius": int(cfg["table_radius"]), "thumbnail": verifier.THUMB,
                     "angles": list(verifier.ANGLES), "scales": list(verifier.SCALES),
                     "candidates_found": int(len(candidates.pairs)),
                     "candidates_verified": int(candidates.capped.sum())},
        "synthetic": result.truth_check(truth_json) if truth_json is not None else None,
        "gallery": sample[["rel_path_a", "rel_path_b", "phash_distance", "dhash_distance", "verify_score",
                           "trusted"]].to_dict("records"),
        "plots": {name: rel for name, (rel, _) in plots.items()},
        "timings": {
            "hashing_seconds": round(hashes.seconds, 2), "hashing_workers": hashes.workers,
            "images_per_second": round(len(rows) / hashes.seconds, 1) if hashes.seconds else None,
            "pair_search_seconds": round(candidates.search_seconds, 2),
            "verify_seconds": round(candidates.verify_seconds, 2), "total_seconds": round(seconds, 2),
        },
        "settings": cfg,
    }
    return ch.finish(figures=figures)
