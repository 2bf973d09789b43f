"""Off-leaf attribution mass on constructed maps and models with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cropcop_utils.field import attribution as attr


def test_off_leaf_mass_of_a_constructed_map():
    attribution = np.zeros((10, 10))
    leaf = np.zeros((10, 10), dtype=bool)
    leaf[:, :5] = True
    attribution[2, 2] = 3.0  # on the leaf
    attribution[7, 8] = 1.0  # off the leaf
    attribution[8, 8] = -5.0  # evidence against the class: not attention, counts as zero
    assert attr.off_leaf_mass(attribution, leaf) == pytest.approx(0.25)
    assert attr.off_leaf_mass(np.ones((10, 10)), leaf) == pytest.approx(0.5)
    assert attr.off_leaf_mass(np.zeros((10, 10)), leaf) is None  # no mass: undefined, not 0
    with pytest.raises(attr.AttributionError, match="differ in shape"):
        attr.off_leaf_mass(np.ones((4, 4)), leaf)
    masses = attr.off_leaf_masses(np.stack([attribution, np.zeros((10, 10))]), [leaf, leaf])
    assert masses[0] == pytest.approx(0.25) and np.isnan(masses[1])


def test_mask_follows_the_loading_contracts_padding():
    # 30 high × 20 wide: pad_to_square adds 5 columns left and 5 right, all background
    grid = attr.mask_on_model_grid(np.ones((30, 20), dtype=bool), 30)
    assert grid.shape == (30, 30)
    assert not grid[:, :5].any() and not grid[:, 25:].any() and grid[:, 5:25].all()
    small = attr.mask_on_model_grid(np.ones((30, 20), dtype=bool), 6)
    assert small[:, 1:5].all() and not small[:, 0].any() and not small[:, 5].any()


class Brightness(nn.Module):
    """A known model: one full-resolution stage (channel sum, ReLU), global mean, class 0 = brightness."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = nn.Conv2d(3, 1, 1, bias=False)
        nn.init.ones_(self.stage.weight)
        self.head = nn.Linear(1, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0], [-1.0]]))
            self.head.bias.zero_()
        self.feature_info = [{"module": "stage", "num_chs": 1, "reduction": 1}]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stage(x)).mean((2, 3)))


def _patch_image(size: int = 16) -> tuple[torch.Tensor, np.ndarray]:
    leaf = np.zeros((size, size), dtype=bool)
    leaf[3:9, 4:10] = True
    image = torch.zeros(1, 3, size, size)
    image[0, :, 3:9, 4:10] = 1.0
    return image, leaf


def test_gradcam_puts_all_mass_where_the_evidence_is():
    image, leaf = _patch_image()
    cam = attr.gradcam(Brightness(), image, [0])
    assert cam.shape == (1, 16, 16) and cam.max() == pytest.approx(1.0)
    assert attr.off_leaf_mass(cam[0], leaf) == pytest.approx(0.0, abs=1e-6)
    assert attr.off_leaf_mass(cam[0], ~leaf) == pytest.approx(1.0, abs=1e-6)
    assert attr.gradcam_grid(Brightness(), 16) == 16


def test_feature_stage_out_of_range_is_a_clear_error():
    with pytest.raises(attr.AttributionError, match="out of range"):
        attr.feature_stage(Brightness(), stage=-3)
    with pytest.raises(attr.AttributionError, match="feature_info"):
        attr.feature_stage(nn.Linear(2, 2))


def test_occlusion_on_a_black_box_stays_near_the_evidence():
    image, leaf = _patch_image()
    model = Brightness().eval()
    calls: list[int] = []

    def black_box(batch: torch.Tensor) -> torch.Tensor:  # no module, no gradients: a callable only
        calls.append(len(batch))
        with torch.no_grad():
            return model(batch)

    window, stride = 4, 2
    maps = attr.occlusion(black_box, image, [0], window=window, stride=stride, max_batch=8)
    assert max(calls) <= 8
    assert sum(calls) == attr.occlusion_windows(16, window, stride) + 1  # + the unoccluded pass
    near = np.zeros_like(leaf)
    near[3 - window + 1 : 9 + window - 1, 4 - window + 1 : 10 + window - 1] = True
    assert attr.off_leaf_mass(maps[0], near) == pytest.approx(0.0, abs=1e-6)
    assert attr.off_leaf_mass(maps[0], leaf) > 0.0  # a window's blur spills past the leaf
    with pytest.raises(attr.AttributionError, match="stride"):
        attr.occlusion(black_box, image, [0], window=20, stride=2)
