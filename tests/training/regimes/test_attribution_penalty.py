"""The off-leaf attribution penalty's cost, measured, and the decision it drives."""

from __future__ import annotations

import torch

from cropcop_utils.nets.models import create_model
from cropcop_utils.training.regimes import attribution_penalty as penalty


def _batch(n: int = 4, side: int = 32):
    torch.manual_seed(0)
    images = torch.randn(n, 3, side, side)
    masks = torch.zeros(n, side, side, dtype=torch.uint8)
    masks[:, 8:24, 8:24] = 1
    return images, torch.arange(n) % 3, masks


def test_off_leaf_share_is_a_differentiable_share():
    # Seeded: with some random initialisations (whatever torch's global generator holds after other tests
    # in one pytest-xdist worker) the Grad-CAM map is all zero and so is its gradient.
    torch.manual_seed(0)
    model = create_model("test_resnet", 3)
    images, labels, masks = _batch()
    _, share = penalty.off_leaf_share(model, images, labels, masks)
    assert share.shape == (4,) and ((share >= 0) & (share <= 1 + 1e-6)).all()
    share.mean().backward()  # the penalty reaches the weights through the gradient of the map
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_measure_cost_times_both_steps_and_leaves_the_weights_alone():
    model = create_model("test_resnet", 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cost = penalty.measure_cost(model, *_batch(), weight=1.0, steps=1)
    assert cost["plain_step_s"] > 0 and cost["penalised_step_s"] > 0 and cost["cost_ratio"] > 0
    assert 0 <= cost["off_leaf_share_of_batch"] <= 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_decision_follows_the_measured_cost():
    over = penalty.decide({"max_cost_ratio": 1.5}, {"cost_ratio": 2.4, "batch": 32}, 100.0)
    assert not over["ran"] and not over["fits_budget"] and "2.40x" in over["reason"]
    assert over["projected_extra_seconds"] == 140.0
    within = penalty.decide({"max_cost_ratio": 3.0}, {"cost_ratio": 2.4, "batch": 32}, 100.0)
    assert within["fits_budget"] and not within["ran"] and "does not train with it" in within["reason"]
    assert "no background-robust regime" in penalty.decide({}, None, None)["reason"]
