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


def test_the_penalty_reaches_the_weights_through_the_attribution():
    # Grad-CAM's channel weights are the gradient of the class score: the classifier's weights enter the
    # off-leaf share only through them.  With that gradient kept in the graph (create_graph=True) the share
    # has a gradient on the classifier; computed without its graph (or detached) the share would only see
    # the feature map, and the classifier's gradient would be None.
    torch.manual_seed(0)
    model = create_model("test_resnet", 3)
    images, labels, masks = _batch()
    _, share = penalty.off_leaf_share(model, images, labels, masks)
    weight = model.get_classifier().weight  # the bias does not enter the gradient of the score
    (grad,) = torch.autograd.grad(share.mean(), [weight], allow_unused=True)
    assert grad is not None, "the share does not depend on the classifier's weights"
    assert grad.abs().sum() > 0  # measured: 2.8e-4 summed over the 3 x 96 weights
