"""The pair search: multi-index hashing must return exactly the brute-force pair set."""

from __future__ import annotations

import numpy as np
import pytest

from cropcop_utils.audit import pairs


def _codes_with_structure(n: int, seed: int) -> np.ndarray:
    """Random codes plus the structures real hashes have: exact duplicates and near copies."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    codes[10:40] = codes[10]  # a block of identical hashes (byte copies)
    for start in range(100, n - 1, 7):  # near copies at 1..14 flipped bits
        flips = rng.choice(64, size=1 + start % 14, replace=False).astype(np.uint64)
        codes[start + 1] = codes[start] ^ np.bitwise_or.reduce(np.uint64(1) << flips)
    return codes


def _pair_set(pairs: np.ndarray) -> set[tuple[int, int, int]]:
    return {tuple(map(int, row)) for row in pairs}


@pytest.mark.parametrize("radius", [0, 1, 3, 6, 10, 12, 16])
def test_mih_matches_brute_force_exactly(radius: int) -> None:
    codes = _codes_with_structure(3000, seed=radius)
    reference = pairs.brute_force_pairs(codes, radius)
    found = pairs.mih_pairs(codes, radius)
    assert np.array_equal(found, reference)
    assert (found[:, 0] < found[:, 1]).all()
    assert len(reference) > 0


@pytest.mark.parametrize("chunks", [2, 3, 4, 5, 8])
def test_every_plan_gives_the_same_pairs(chunks: int) -> None:
    radius = 7
    codes = _codes_with_structure(1500, seed=chunks)
    plan = pairs.make_plan(radius, chunks)
    assert sum(t + 1 for t in plan.budgets) > radius  # the pigeonhole guarantee
    assert _pair_set(pairs.mih_pairs(codes, radius, plan)) == _pair_set(
        pairs.brute_force_pairs(codes, radius))


def test_brute_force_agrees_with_a_plain_definition() -> None:
    codes = _codes_with_structure(300, seed=5)
    radius = 9
    expected = {(i, j, bin(int(codes[i]) ^ int(codes[j])).count("1"))
                for i in range(len(codes)) for j in range(i + 1, len(codes))
                if bin(int(codes[i]) ^ int(codes[j])).count("1") <= radius}
    assert _pair_set(pairs.brute_force_pairs(codes, radius)) == expected


def test_worker_pool_gives_the_same_pairs() -> None:
    codes = _codes_with_structure(4000, seed=11)
    single = pairs.mih_pairs(codes, 10, workers=1)
    pooled = pairs.mih_pairs(codes, 10, workers=2)
    assert np.array_equal(single, pooled)


def test_auto_picks_a_method_and_agrees() -> None:
    codes = _codes_with_structure(2500, seed=3)
    for method in ("auto", "brute", "mih"):
        assert np.array_equal(pairs.radius_pairs(codes, 8, method=method, workers=1),
                              pairs.brute_force_pairs(codes, 8))


def test_plan_prefers_wide_chunks_for_many_codes() -> None:
    small = pairs.best_plan(1_000, 10)
    large = pairs.best_plan(1_000_000, 10)
    assert max(large.widths) > max(small.widths)
    assert large.cost(1_000_000) < 6e-9 * 1_000_000**2 / 2  # far cheaper than brute force


def test_histogram_and_edge_cases() -> None:
    assert pairs.radius_pairs(np.array([], dtype=np.uint64), 5).shape == (0, 3)
    assert pairs.radius_pairs(np.array([7], dtype=np.uint64), 5).shape == (0, 3)
    found = pairs.brute_force_pairs(np.array([0, 1, 3, 7], dtype=np.uint64), 3)
    assert pairs.distance_histogram(found, 3).tolist() == [0, 3, 2, 1]


def test_bad_input_is_refused_with_a_clear_message() -> None:
    with pytest.raises(pairs.HashInputError, match="radius"):
        pairs.radius_pairs(np.zeros(3, dtype=np.uint64), 64)
    with pytest.raises(pairs.HashInputError, match="unsigned"):
        pairs.radius_pairs(np.array([-1, 2]), 3)
    with pytest.raises(pairs.HashInputError, match="1-D"):
        pairs.radius_pairs(np.zeros((2, 2), dtype=np.uint64), 3)
    with pytest.raises(pairs.HashInputError, match="method"):
        pairs.radius_pairs(np.zeros(3, dtype=np.uint64), 3, method="faiss")
