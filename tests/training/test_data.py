"""The resumable, shardable batch order and the datasets behind it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from PIL import Image

from cropcop_utils.core import imaging
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.core.squares import EvalImages
from cropcop_utils.training.augment import AugmentParams
from cropcop_utils.training.data import EpochBatches, TrainImages, balanced_weights, epoch_seed


def _all(sampler: EpochBatches) -> list[list[tuple[int, int]]]:
    return [list(batch) for batch in sampler]


def test_a_resumed_epoch_yields_exactly_the_batches_not_yet_consumed():
    full = _all(EpochBatches(50, 4, seed=3, epoch=2))
    assert len(full) == 12 and all(len(b) == 4 for b in full)
    assert _all(EpochBatches(50, 4, seed=3, epoch=2, start_batch=5)) == full[5:]
    assert len(EpochBatches(50, 4, seed=3, epoch=2, start_batch=5)) == 7
    assert len({row for batch in full for row, _ in batch}) == 48  # a permutation: no row twice


def test_epochs_and_seeds_give_other_orders_and_sample_seeds():
    a = _all(EpochBatches(50, 4, seed=3, epoch=0))
    assert a == _all(EpochBatches(50, 4, seed=3, epoch=0))
    assert a != _all(EpochBatches(50, 4, seed=3, epoch=1))
    assert a != _all(EpochBatches(50, 4, seed=4, epoch=0))
    assert epoch_seed(3, 0) != epoch_seed(3, 1)
    seeds = [s for batch in a for _, s in batch]
    assert len(set(seeds)) == len(seeds)


def test_ranks_split_each_global_batch_without_overlap():
    single = _all(EpochBatches(50, 8, seed=1, epoch=0))  # global batch 8
    ranks = [_all(EpochBatches(50, 4, seed=1, epoch=0, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(single) == 6
    for step, batch in enumerate(single):
        merged = [x for pair in zip(ranks[0][step], ranks[1][step], strict=True) for x in pair]
        assert merged == batch  # rank r takes positions r, r + world, …


def test_a_split_smaller_than_one_batch_still_trains_one_step():
    batches = _all(EpochBatches(3, 8, seed=0, epoch=0))
    assert len(batches) == 1 and len(batches[0]) == 8
    assert {row for row, _ in batches[0]} == {0, 1, 2}


def test_balanced_sampler_evens_out_the_classes():
    labels = np.array([0] * 90 + [1] * 10)
    sampler = EpochBatches(100, 10, seed=0, epoch=0, weights=balanced_weights(labels))
    drawn = Counter(int(labels[row]) for batch in sampler for row, _ in batch)
    assert 0.35 < drawn[1] / sum(drawn.values()) < 0.65


def test_datasets_follow_the_loading_contract(tmp_path):
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for k in range(3):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / f"{k}.png")
        rows.append({"rel_path": f"{k}.png", "label": k})
    frame = pd.DataFrame(rows)
    spec = ImageSpec(24, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    evals = EvalImages(frame, tmp_path, spec, cache=True)
    for k in range(3):
        assert torch.equal(evals[k][0], imaging.load_tensor(tmp_path / f"{k}.png", 24, spec.mean, spec.std))
    plain = TrainImages(frame, tmp_path, spec, AugmentParams(enabled=False))
    assert torch.equal(plain[(1, 99)][0], evals[1][0]) and plain[(1, 99)][1] == 1
    train = TrainImages(frame, tmp_path, spec, AugmentParams())
    assert torch.equal(train[(2, 5)][0], train[(2, 5)][0])
    assert not torch.equal(train[(2, 5)][0], train[(2, 6)][0])
