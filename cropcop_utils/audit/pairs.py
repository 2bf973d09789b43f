"""All pairs of 64-bit hashes within a Hamming radius, without a Python double loop.

Two exact methods that return the same pair set (a test holds them to it):

* :func:`brute_force_pairs` — XOR a block of rows against the rest of the table and count bits with
  ``np.bitwise_count``: O(N²) work, but vectorised; the reference, and the fastest way up to a few
  tens of thousands of hashes.
* :func:`mih_pairs` — multi-index hashing (Norouzi et al., "Fast search in Hamming space with
  multi-index hashing", CVPR 2012).  The 64 bits are cut into ``m`` chunks with budgets ``t_i`` such
  that ``sum(t_i + 1) > radius``; by the pigeonhole principle two codes within ``radius`` agree on some
  chunk ``i`` up to ``t_i`` flipped bits.  For each chunk the codes are sorted by chunk value, and
  every flip mask of weight ≤ ``t_i`` is applied to *all* codes at once: a dense bucket table turns
  each flipped key into the range of codes holding it, and only those candidates get a full
  XOR-popcount.  Work grows with the number of masks and candidates, not with N².

Why not a library: faiss's ``IndexBinaryMultiHash`` does the same search but probes a hash map once
per query and flip mask (on this project's 2-core machine ~1.3 ms per query against 200,000 random
codes at radius 10, i.e. over 20 minutes for a million queries, against about a minute here);
``IndexBinaryFlat.range_search`` is brute force (~1e9 comparisons/s per core, so ~4 minutes of two
cores for a million codes).  scikit-learn's ``BallTree`` does not accept a bit-packed Hamming metric.

Each unordered pair is produced exactly once: for a mask ``m != 0`` only the code on the side where the
mask's highest bit is clear asks (the other side would find the same bucket pair), for ``m == 0`` only
pairs inside a bucket in sorted order, and a pair found through chunk ``i`` is dropped when an earlier
chunk ``j < i`` would already have found it (``d_j <= t_j``).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

BITS = 64
DENSE_TABLE_MAX_BITS = 24  # a chunk of up to 2**24 keys gets a dense bucket table (64 MiB of int32)
_BLOCK_ELEMENTS = 1 << 22  # brute force: rows x table compared per block (~32 MiB of uint64)
PAIR_COLUMNS = ("i", "j", "distance")


class HashInputError(ValueError):
    """The hash array or radius cannot be searched (wrong dtype, shape or range)."""


def as_codes(codes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Hashes as a contiguous 1-D ``uint64`` array; refuses anything that is not 64-bit unsigned."""
    array = np.asarray(codes)
    if array.ndim != 1:
        raise HashInputError(f"expected a 1-D array of 64-bit hashes, got shape {array.shape}")
    if array.dtype != np.uint64:
        if array.size and (array.dtype.kind not in "iu" or (array.dtype.kind == "i" and array.min() < 0)):
            raise HashInputError(f"hashes must be unsigned 64-bit integers, got dtype {array.dtype}")
        array = array.astype(np.uint64)
    return np.ascontiguousarray(array)


def _check_radius(radius: int) -> int:
    if not 0 <= int(radius) < BITS:
        raise HashInputError(f"Hamming radius must be in 0..{BITS - 1}, got {radius}")
    return int(radius)


def _empty() -> np.ndarray:
    return np.zeros((0, 3), dtype=np.int64)


def _finish(parts: list[np.ndarray]) -> np.ndarray:
    """Stack (i, j, distance) blocks, i < j, sorted by (i, j) so results compare and diff easily."""
    pairs = np.concatenate(parts) if parts else _empty()
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return pairs[order]


def hamming_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise Hamming distance of two ``uint64`` arrays."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)


# --------------------------------------------------------------------------- brute force
def brute_force_pairs(codes: Sequence[int] | np.ndarray, radius: int) -> np.ndarray:
    """Every pair ``i < j`` with ``popcount(codes[i] ^ codes[j]) <= radius`` as an (M, 3) int64 array."""
    codes = as_codes(codes)
    radius = _check_radius(radius)
    n = len(codes)
    parts = []
    rows = max(1, _BLOCK_ELEMENTS // max(n, 1))
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        # Upper triangle only: row i is compared with columns i+1..n-1.
        distance = np.bitwise_count(codes[start:stop, None] ^ codes[None, start:])
        local_i, local_j = np.nonzero(distance <= radius)
        above = local_j > local_i
        local_i, local_j = local_i[above], local_j[above]
        parts.append(np.stack([local_i + start, local_j + start,
                               distance[local_i, local_j].astype(np.int64)], axis=1))
    return _finish(parts)


# --------------------------------------------------------------------------- multi-index hashing
@dataclass(frozen=True)
class MihPlan:
    """How :func:`mih_pairs` cuts the bits: chunk widths, bit offsets and per-chunk flip budgets."""

    widths: tuple[int, ...]
    budgets: tuple[int, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.cumsum((0,) + self.widths[:-1]))

    @property
    def masks_per_chunk(self) -> tuple[int, ...]:
        return tuple(_ball_volume(w, t) for w, t in zip(self.widths, self.budgets, strict=True))

    def expected_candidates(self, n: int) -> float:
        """Candidate pairs for n uniformly random codes (real hashes cluster, so this is a floor)."""
        return sum(v * n * n / 2.0 ** (w + 1) for v, w in zip(self.masks_per_chunk, self.widths, strict=True))

    def cost(self, n: int) -> float:
        """Modelled CPU seconds, calibrated on this code: a mask pass costs ~150 µs of call overhead
        plus ~11 ns per asking code (half of them), a candidate pair ~20 ns."""
        passes = sum(self.masks_per_chunk)
        return passes * (1.5e-4 + 1.1e-8 * n / 2) + 2e-8 * self.expected_candidates(n)


def _ball_volume(bits: int, radius: int) -> int:
    return sum(math.comb(bits, k) for k in range(radius + 1)) if radius >= 0 else 0


def make_plan(radius: int, chunks: int) -> MihPlan:
    """Cut 64 bits into ``chunks`` near-equal chunks whose budgets satisfy ``sum(t_i + 1) > radius``."""
    radius = _check_radius(radius)
    if not 1 <= chunks <= min(BITS, radius + 1):
        raise HashInputError(f"{chunks} chunks cannot cover radius {radius}: use 1..{radius + 1}")
    widths = [BITS // chunks + (1 if i < BITS % chunks else 0) for i in range(chunks)]
    spare = radius + 1 - chunks
    budgets = [spare // chunks + (1 if i < spare % chunks else 0) for i in range(chunks)]
    return MihPlan(tuple(widths), tuple(budgets))


def best_plan(n: int, radius: int, max_chunks: int = 8) -> MihPlan:
    """The plan with the lowest modelled cost for n codes (wider chunks when n is large)."""
    radius = _check_radius(radius)
    plans = [make_plan(radius, m) for m in range(1, min(max_chunks, radius + 1) + 1)]
    # A chunk wider than 32 bits has too many flip masks to enumerate unless its budget is tiny.
    plans = [p for p in plans if max(p.masks_per_chunk) < 5_000_000]
    return min(plans, key=lambda p: p.cost(n))


def _flip_masks(width: int, budget: int) -> np.ndarray:
    """All masks of ``width`` bits with at most ``budget`` bits set, lightest first, 0 first."""
    masks = [0]
    for weight in range(1, budget + 1):
        masks.extend(sum(1 << bit for bit in combo) for combo in itertools.combinations(range(width), weight))
    return np.array(masks, dtype=np.uint64)


class _ChunkIndex:
    """Codes sorted by one chunk's value, with the bucket range of every chunk value.

    Chunks of up to ``DENSE_TABLE_MAX_BITS`` bits get dense tables: ``starts`` (bucket ranges) and a
    one-byte ``occupied`` flag per key.  A mask pass first gathers from the small flag table (it stays
    in cache, the range table does not) and reads bucket ranges only for the few keys that hit.
    """

    def __init__(self, codes: np.ndarray, offset: int, width: int) -> None:
        chunk = (codes >> np.uint64(offset)) & np.uint64((1 << width) - 1)
        self.width = width
        self.order = np.argsort(chunk, kind="stable")
        self.dense = width <= DENSE_TABLE_MAX_BITS
        self.keys = chunk[self.order].astype(np.uint32) if self.dense else chunk[self.order]
        self.codes = codes[self.order]
        if self.dense:
            counts = np.bincount(self.keys, minlength=1 << width)
            self.occupied = counts > 0
            starts = np.r_[0, np.cumsum(counts)[:-1]]
            # One gather per hit: bucket start and size packed into one int64 (size < 2**24).
            self.packed = (starts.astype(np.int64) << 24) | counts if counts.max() < 1 << 24 else None
            self.starts = np.r_[starts, len(codes)].astype(np.int64)
        self._asking: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def asking(self, bit: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions (and keys) whose key has ``bit`` clear: who asks for masks whose top bit is ``bit``."""
        if bit not in self._asking:
            positions = np.flatnonzero(((self.keys >> self.keys.dtype.type(bit)) & 1) == 0)
            self._asking[bit] = (positions, self.keys[positions])
        return self._asking[bit]

    def bucket(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.dense:
            k = keys.astype(np.intp)
            if self.packed is not None:
                packed = self.packed[k]
                start = packed >> 24
                return start, start + (packed & ((1 << 24) - 1))
            return self.starts[k], self.starts[k + 1]
        return np.searchsorted(self.keys, keys, "left"), np.searchsorted(self.keys, keys, "right")

    def pairs_for_mask(self, mask: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted positions (p, q) of every unordered pair whose chunk values differ by exactly ``mask``."""
        if mask == 0:
            # Pairs inside one bucket: each position pairs with the later positions of its bucket.
            _, stop = self.bucket(self.keys)
            later = stop - np.arange(len(self.keys)) - 1
            p = np.repeat(np.arange(len(self.keys)), later)
            return p, p + 1 + _ramp(later)
        positions, keys = self.asking(int(mask).bit_length() - 1)
        keys = keys ^ keys.dtype.type(mask)
        if self.dense:
            hit = np.flatnonzero(self.occupied[keys])
        else:
            hit = np.arange(len(keys))
        start, stop = self.bucket(keys[hit])
        count = stop - start
        single = count == 1
        if single.all():  # the common case for wide chunks: no run expansion needed
            return positions[hit], start
        several = ~single & (count > 0)
        counts = count[several]
        return (np.concatenate([positions[hit[single]], np.repeat(positions[hit[several]], counts)]),
                np.concatenate([start[single], np.repeat(start[several], counts) + _ramp(counts)]))


def _ramp(count: np.ndarray) -> np.ndarray:
    """0, 1, …, c-1 for each c in ``count``, concatenated (offsets inside expanded runs)."""
    total = int(count.sum())
    return np.arange(total) - np.repeat(np.cumsum(count) - count, count)


def _search_chunk(codes: np.ndarray, plan: MihPlan, chunk: int, masks: np.ndarray, radius: int) -> np.ndarray:
    index = _ChunkIndex(codes, plan.offsets[chunk], plan.widths[chunk])
    earlier = [((codes >> np.uint64(plan.offsets[j])) & np.uint64((1 << plan.widths[j]) - 1), plan.budgets[j])
               for j in range(chunk)]
    parts = []
    for mask in masks:
        p, q = index.pairs_for_mask(int(mask))
        if not len(p):
            continue
        distance = np.bitwise_count(index.codes[p] ^ index.codes[q])
        near = np.flatnonzero(distance <= radius)
        a, b, distance = index.order[p[near]], index.order[q[near]], distance[near]
        for chunk_values, budget in earlier:
            # Found already through an earlier chunk: drop, so each pair is reported once.
            fresh = np.bitwise_count(chunk_values[a] ^ chunk_values[b]) > budget
            a, b, distance = a[fresh], b[fresh], distance[fresh]
        parts.append(np.stack([np.minimum(a, b), np.maximum(a, b), distance.astype(np.int64)], axis=1))
    return np.concatenate(parts) if parts else _empty()


def _search_task(args: tuple[np.ndarray, MihPlan, int, np.ndarray, int]) -> np.ndarray:
    return _search_chunk(*args)


def mih_pairs(
    codes: Sequence[int] | np.ndarray,
    radius: int,
    plan: MihPlan | None = None,
    workers: int = 1,
) -> np.ndarray:
    """Every pair ``i < j`` within ``radius`` by multi-index hashing; same result as brute force.

    ``workers > 1`` spreads the flip masks over a process pool (each worker rebuilds the chunk index,
    a sort of N codes, which is cheap next to the mask passes).
    """
    codes = as_codes(codes)
    radius = _check_radius(radius)
    if len(codes) < 2:
        return _empty()
    plan = plan or best_plan(len(codes), radius)
    tasks = []
    for chunk, (width, budget) in enumerate(zip(plan.widths, plan.budgets, strict=True)):
        if budget < 0:
            continue
        masks = _flip_masks(width, budget)
        pieces = max(1, min(len(masks), workers * 2)) if workers > 1 else 1
        for part in np.array_split(masks, pieces):
            tasks.append((codes, plan, chunk, part, radius))
    if workers > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(_search_task, tasks))
    else:
        parts = [_search_task(task) for task in tasks]
    return _finish(parts)


# --------------------------------------------------------------------------- front door
def radius_pairs(
    codes: Sequence[int] | np.ndarray,
    radius: int,
    method: str = "auto",
    workers: int | None = None,
) -> np.ndarray:
    """All pairs within ``radius``: (M, 3) int64 rows (i, j, distance), i < j, sorted.

    ``method``: ``"brute"``, ``"mih"`` or ``"auto"`` (brute force while N²/2 XORs are cheaper than the
    modelled multi-index cost).  ``workers`` only affects the multi-index search.
    """
    codes = as_codes(codes)
    radius = _check_radius(radius)
    if method not in ("auto", "brute", "mih"):
        raise HashInputError(f"unknown pair-search method {method!r}; use 'auto', 'brute' or 'mih'")
    n = len(codes)
    workers = max(1, int(workers or os.cpu_count() or 1))
    if method == "auto":
        brute_cost = 6e-9 * n * n / 2  # np.bitwise_count over XOR-ed blocks, same calibration
        method = "brute" if brute_cost <= best_plan(n, radius).cost(n) else "mih"
    if method == "brute":
        return brute_force_pairs(codes, radius)
    return mih_pairs(codes, radius, workers=workers)


def distance_histogram(pairs: np.ndarray, max_radius: int) -> np.ndarray:
    """Number of pairs at each distance 0..max_radius (pairs as returned above)."""
    return np.bincount(pairs[:, 2], minlength=max_radius + 1)[: max_radius + 1]
