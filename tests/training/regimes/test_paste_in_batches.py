"""The background-robust regime's pasted leaves reach the batches the training loop steps on.

``train_model`` with the regime hands its paste step to the job, the trainer's dataset applies it, and
the loader feeds the result to the training step.  The test marks the pasted backgrounds with one colour
that no photo of the tiny corpus holds (magenta) and records the batches the trainer's step receives.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from train_fixtures import build_run

from cropcop_utils.core.evidence import Chapter
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.split import load_frozen
from cropcop_utils.training import chapter as train
from cropcop_utils.training import trainer as trainer_module
from cropcop_utils.training.regimes import BACKGROUND_ROBUST, BASELINE, Regime
from cropcop_utils.training.regimes import backgrounds as bg
from cropcop_utils.training.regimes.robust_inputs import RobustInputs

SIDE = 32
MAGENTA = (255, 0, 255)


class _Stop(Exception):
    """Raised by the recording step after the first batch: nothing is trained or saved."""


def _marked_inputs(n_rows: int) -> RobustInputs:
    """A paste step on a one-colour pool: every sample pasted, no field look (the colour stays marked)."""
    params = dataclasses.replace(bg.RobustParams(), paste_p=1.0, photometric_p=0.0)
    pool = np.zeros((1, SIDE, SIDE, 3), np.uint8)
    pool[:] = MAGENTA
    mask = np.zeros((SIDE, SIDE), bool)
    mask[8:24, 8:24] = True  # the "leaf": the middle quarter of each photo
    paste = bg.BackgroundPaste(params, pool, [mask] * n_rows)
    record = {"params": params.to_dict(), "pool": {"sha256": "magenta"}, "masks": {"sha256": "middle"}}
    return RobustInputs(paste, record)


def _first_batch(ctx, regime: Regime, robust: RobustInputs | None, monkeypatch) -> torch.Tensor:
    seen: list[torch.Tensor] = []

    def record(self, images, labels, model):
        seen.append(images.clone())
        raise _Stop

    monkeypatch.setattr(trainer_module.Trainer, "_step", record)
    with pytest.raises(_Stop):
        train.train_model(ctx, "reference", progress=False, regime=regime, robust=robust)
    return seen[0]


def _marked_share(images: torch.Tensor, spec) -> np.ndarray:
    """Per image, the share of pixels of the marker colour (after the ordinary augmentation)."""
    mean = torch.tensor(spec.mean)[None, :, None, None]
    std = torch.tensor(spec.std)[None, :, None, None]
    pixels = ((images * std + mean) * 255).numpy()
    magenta = (pixels[:, 0] > 180) & (pixels[:, 1] < 90) & (pixels[:, 2] > 180)
    return magenta.mean((1, 2))


def test_the_training_batches_hold_the_pasted_composites(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    ctx = build_run(tmp_path)
    spec = ImageSpec.from_section(ctx.section("image"))
    n_rows = len(load_frozen(Chapter(ctx.run_dir, "training")).rows_for("train"))
    robust = _marked_inputs(n_rows)
    pasted = _first_batch(ctx, Regime(BACKGROUND_ROBUST, shipped=True), robust, monkeypatch)
    plain = _first_batch(ctx, Regime(BASELINE, shipped=False), None, monkeypatch)
    assert pasted.shape == plain.shape
    # Without the regime no pixel is magenta; with it every image of the batch is a composite whose
    # background (at least 3/4 of the square: the leaf is the middle quarter, scaled by 0.55-1) is the
    # marked pool.  measured: marked shares 0.71-0.90 per image of the first batch of 8
    assert (_marked_share(plain, spec) == 0).all()
    assert (_marked_share(pasted, spec) > 0.6).all()

