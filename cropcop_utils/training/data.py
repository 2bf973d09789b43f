"""Datasets and the resumable, shardable batch order of the training loop.

Reproducibility rests on two pure functions of the run seed:

* the epoch's order of training rows: a permutation (or, with the class-balanced sampler, a weighted
  draw with replacement) from a generator seeded by ``epoch_seed(seed, epoch)``;
* each sample's augmentation: a generator seeded by ``sample_seed(seed, epoch, position)``.

So the batches of step ``k`` of epoch ``e`` never depend on what ran before, a resumed run skips exactly
the batches already consumed, and DataLoader workers or DDP ranks change nothing.  Under DDP each step's
global batch is cut rank-strided (as ``DistributedSampler`` does) into per-rank batches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset, Sampler

from ..core import imaging
from ..core.imaging import ImageSpec
from ..core.squares import SquareCache, row_paths
from .augment import AugmentParams, augment, to_hwc


def _mix(*values: int) -> int:
    # SeedSequence hashes the tuple into well-spread bits: nearby (seed, epoch) pairs get unrelated streams.
    return int(np.random.SeedSequence([int(v) for v in values]).generate_state(1, dtype=np.uint64)[0] >> 1)


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of epoch ``epoch``'s row order (stored in checkpoints beside the position)."""
    return _mix(seed, 1, epoch)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """Seed of the augmentation of the sample at ``position`` of epoch ``epoch``'s order."""
    return _mix(seed, 2, epoch, position)


class TrainImages(Dataset):
    """Augmented training samples; an index is ``(row_index, sample_seed)`` from :class:`EpochBatches`.

    ``paste`` (the background-robust regime, :class:`.backgrounds.BackgroundPaste`) changes the square
    before the augmentation, drawing from the same per-sample generator.
    """

    def __init__(self, rows: pd.DataFrame, corpus_root: str | os.PathLike, spec: ImageSpec,
                 params: AugmentParams, cache: bool = True, paste: Callable | None = None) -> None:
        self.labels = rows["label"].to_numpy(dtype=np.int64)
        self.spec = spec
        self.params = params
        self.paste = paste
        self.squares = SquareCache(row_paths(rows, corpus_root), spec.size, enabled=cache)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: tuple[int, int]) -> tuple[torch.Tensor, int]:
        row, seed = index
        generator = torch.Generator().manual_seed(int(seed))
        square = self.squares.get(row)
        if self.paste is not None:
            square = self.paste(square, row, generator)
        image = augment(square, self.params, generator)
        return imaging.to_tensor(to_hwc(image), self.spec.mean, self.spec.std), int(self.labels[row])


def balanced_weights(labels: np.ndarray) -> torch.Tensor:
    """Per-row sampling weights that give every class the same expected share of an epoch."""
    counts = np.bincount(labels)
    return torch.as_tensor(1.0 / counts[labels], dtype=torch.float64)


class EpochBatches(Sampler[list[tuple[int, int]]]):
    """The batches one rank consumes in one epoch, from ``start_batch`` on.

    Each global step takes ``batch_size × world_size`` consecutive positions of the epoch's order; rank
    ``r`` gets positions ``r, r + world, …`` of them.  Steps per epoch = ⌊n / (batch × world)⌋ (the
    partial tail is dropped, as with ``drop_last``), at least one: an order shorter than one global batch
    is repeated to fill it.
    """

    def __init__(self, n_rows: int, batch_size: int, seed: int, epoch: int, rank: int = 0,
                 world_size: int = 1, start_batch: int = 0, weights: torch.Tensor | None = None) -> None:
        if n_rows < 1:
            raise ValueError("the training split has no rows")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.n_rows, self.batch_size, self.seed, self.epoch = n_rows, batch_size, seed, epoch
        self.rank, self.world_size, self.weights = rank, world_size, weights
        self.global_batch = batch_size * world_size
        self.steps = max(1, n_rows // self.global_batch)
        if not 0 <= start_batch <= self.steps:
            raise ValueError(f"start batch {start_batch} outside 0..{self.steps}")
        self.start_batch = start_batch

    @property
    def order_seed(self) -> int:
        return epoch_seed(self.seed, self.epoch)

    def order(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.order_seed)
        if self.weights is not None:
            return torch.multinomial(self.weights, self.n_rows, replacement=True, generator=generator)
        return torch.randperm(self.n_rows, generator=generator)

    def __len__(self) -> int:
        return self.steps - self.start_batch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = self.order()
        needed = self.steps * self.global_batch
        if len(order) < needed:
            order = order.repeat(needed // len(order) + 1)
        for step in range(self.start_batch, self.steps):
            positions = range(step * self.global_batch + self.rank, (step + 1) * self.global_batch,
                              self.world_size)
            yield [(int(order[p]), sample_seed(self.seed, self.epoch, p)) for p in positions]
