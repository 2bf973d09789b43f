"""Validation passes that run the frozen trunk once.

With ``frozen_groups`` set, the stem and the first stages keep their pretrained weights and batch-norm
statistics all through training (:func:`..nets.models.freeze_leading_groups`).  On the validation rows,
which never change, their output is then the same at every epoch, and the same for the EMA as for the raw
weights, and it is most of an eval pass: on 2 cores the trunk of EfficientNet-Lite took 64 % of a batch's
forward pass (Lite1 at 128 px and Lite0 at 192, batch 128), its high-resolution stages being
memory-bound.  So the first pass keeps each batch's trunk output and later passes run only the rest of the
network on it (:func:`..nets.models.frozen_trunk`: the same operations on the same tensors, so the
logits are bit for bit those of a whole pass).  A pass whose model's trunk tensors differ from those the
outputs were computed with, compared bit for bit each time, recomputes them.

Written here because nothing in timm or torch caches a sub-network's activations across calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


class TrunkCache:
    """The trunk outputs of one sequence of validation batches, with the trunk state they came from."""

    def __init__(self) -> None:
        self.state: list[torch.Tensor] | None = None
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []   # (row positions, trunk output)
        self.computed = 0    # passes that ran the trunk
        self.reused = 0      # passes that read it from here

    def _matches(self, trunk: nn.Module) -> bool:
        current = list(trunk.state_dict().values())
        return self.state is not None and len(current) == len(self.state) and all(
            map(torch.equal, current, self.state))

    def outputs(self, trunk: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                prepare: Callable[[torch.Tensor], torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(row positions, trunk output) per batch: the kept ones when ``trunk`` holds the tensors they were
        computed with, else computed from ``batches`` of (images, row positions) and kept (only once every
        batch is done: a pass cut short keeps what it had)."""
        if self._matches(trunk):
            self.reused += 1
            return self.batches
        state = [t.detach().clone() for t in trunk.state_dict().values()]
        self.batches = [(index, trunk(prepare(images))) for images, index in batches]
        self.state = state
        self.computed += 1
        return self.batches
