"""Near candidates: who proposes a pair, capped per image, and what the verifiers say."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import pairs as pair_search
from . import verifier
from .hashing import ImageHashes


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
    found = pair_search.radius_pairs(hashes.phash[representatives], radius, workers=1)
    pairs = representatives[found[:, :2]] if len(found) else np.zeros((0, 2), dtype=np.int64)
    phash_d = found[:, 2]
    dhash_d = pair_search.hamming_distance(hashes.dhash[pairs[:, 0]], hashes.dhash[pairs[:, 1]])
    capped = cap_neighbours(found[:, :2], phash_d, dhash_d, max_neighbours)
    search_seconds = time.perf_counter() - start
    start = time.perf_counter()
    scores = verifier.verify_pairs(hashes.grey, hashes.weight, pairs[capped], batch=batch, progress=progress,
                                   workers=workers)
    return NearCandidates(pairs, phash_d, dhash_d, capped, scores, search_seconds,
                          time.perf_counter() - start)


