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
  XOR-popcount.  The passes are compiled with numba (one fused loop per mask: no temporary arrays);
  :meth:`MihPlan.cost` picks the chunking, which for a million codes at radius 12 is four 16-bit
  chunks, whose bucket tables stay in cache.

Why not a library: faiss's ``IndexBinaryMultiHash`` does the same search but probes a hash map once
per query and flip mask (on this project's 2-core machine ~1.3 ms per query against 200,000 random
codes at radius 10, i.e. over 20 minutes for a million queries); ``IndexBinaryFlat.range_search`` is
brute force (~1e9 comparisons/s per core, so ~4 minutes of two cores for a million codes).
scikit-learn's ``BallTree`` does not accept a bit-packed Hamming metric.

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

import numba
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
        """Modelled CPU seconds, calibrated on the compiled passes on this project's 2-core machine: an
        asking code (half of them, per mask) costs ~2 ns while its chunk's bucket table stays in cache
        (up to 2**17 keys) and ~30 ns beyond (a cache miss per lookup); a candidate pair ~3.5 ns."""
        ask = sum(v * (n / 2) * (2e-9 if w <= 17 else 3e-8)
                  for v, w in zip(self.masks_per_chunk, self.widths, strict=True))
        return ask + 3.5e-9 * self.expected_candidates(n)


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


_ONE = np.uint64(1)
_M1, _M2 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333)
_M4, _H01 = np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(0x0101010101010101)
_S1, _S2, _S4, _S56 = np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(56)


@numba.njit(cache=True, inline="always")
def _popcount(x):
    """Set bits of a uint64 (SWAR; numba has no popcount intrinsic for uint64)."""
    x = x - ((x >> _S1) & _M1)
    x = (x & _M2) + ((x >> _S2) & _M2)
    x = (x + (x >> _S4)) & _M4
    return (x * _H01) >> _S56


@numba.njit(cache=True, nogil=True)
def _mask_passes(keys, codes, order, occupied, starts, dense, masks, tops, earlier, budgets, radius):
    """Every pair whose chunk keys differ by one of ``masks``, within ``radius``, not found by an earlier
    chunk.  ``keys`` / ``codes`` / ``order`` are sorted by key; ``earlier`` holds the earlier chunks'
    values in original order.  Masks outside, codes inside: for a fixed mask, ``key ^ mask`` over sorted
    keys walks the bucket table almost in order, so the lookups stay in cache."""
    n = keys.shape[0]
    cap = 1 << 16
    out_a = np.empty(cap, np.int64)
    out_b = np.empty(cap, np.int64)
    out_d = np.empty(cap, np.int64)
    count = 0
    for mi in range(masks.shape[0]):
        m = masks[mi]
        top = tops[mi]
        for p in range(n):
            kp = keys[p]
            if m == 0:
                lo = p + 1
                hi = starts[kp + _ONE] if dense else np.searchsorted(keys, kp, side="right")
            else:
                if (kp >> top) & _ONE:
                    continue  # the other side of the pair asks for this mask
                k2 = kp ^ m
                if dense:
                    if not occupied[k2]:
                        continue
                    lo = starts[k2]
                    hi = starts[k2 + _ONE]
                else:
                    lo = np.searchsorted(keys, k2, side="left")
                    hi = np.searchsorted(keys, k2, side="right")
            cp = codes[p]
            for q in range(lo, hi):
                d = _popcount(cp ^ codes[q])
                if d > radius:
                    continue
                a = order[p]
                b = order[q]
                seen = False
                for j in range(earlier.shape[0]):
                    if _popcount(earlier[j, a] ^ earlier[j, b]) <= budgets[j]:
                        seen = True  # found through an earlier chunk: report each pair once
                        break
                if seen:
                    continue
                if count == cap:
                    cap *= 2
                    out_a = np.concatenate((out_a, np.empty(cap - count, np.int64)))
                    out_b = np.concatenate((out_b, np.empty(cap - count, np.int64)))
                    out_d = np.concatenate((out_d, np.empty(cap - count, np.int64)))
                out_a[count] = min(a, b)
                out_b[count] = max(a, b)
                out_d[count] = d
                count += 1
    return out_a[:count], out_b[:count], out_d[:count]


def _chunk_values(codes: np.ndarray, offset: int, width: int) -> np.ndarray:
    return (codes >> np.uint64(offset)) & np.uint64((1 << width) - 1)


def _search_chunk(codes: np.ndarray, plan: MihPlan, chunk: int, masks: np.ndarray, radius: int) -> np.ndarray:
    """Pairs found through one chunk for some of its flip masks (a sort of the codes by chunk value, a
    bucket table when the chunk is narrow enough, then the compiled mask passes)."""
    width = plan.widths[chunk]
    keys = _chunk_values(codes, plan.offsets[chunk], width)
    order = np.argsort(keys, kind="stable").astype(np.int64)
    keys = keys[order]
    dense = width <= DENSE_TABLE_MAX_BITS
    if dense:
        counts = np.bincount(keys.astype(np.int64), minlength=1 << width)
        occupied = counts > 0
        starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
    else:
        occupied, starts = np.zeros(1, bool), np.zeros(2, np.int64)
    earlier = np.stack([_chunk_values(codes, plan.offsets[j], plan.widths[j]) for j in range(chunk)]) \
        if chunk else np.zeros((0, len(codes)), np.uint64)
    budgets = np.array(plan.budgets[:chunk], dtype=np.int64)
    masks = np.asarray(masks, dtype=np.uint64)
    tops = np.array([max(int(m).bit_length() - 1, 0) for m in masks], dtype=np.uint64)
    a, b, d = _mask_passes(keys, codes[order], order, occupied, starts, dense, masks, tops, earlier, budgets,
                           int(radius))
    return np.stack([a, b, d], axis=1) if len(a) else _empty()


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
