"""What an off-leaf attribution penalty would cost while fine-tuning, measured before deciding to run it.

The penalty (OffLeaf's second intervention) adds λ × the share of Grad-CAM mass outside the leaf mask
to the loss.  Grad-CAM's map is built from the gradient of the class score with respect to a feature
map, so penalising the map needs that gradient *with its own graph* (``create_graph=True``) and a
second backward pass through it: double backpropagation.  This module times a plain training step and
a penalised one on the same batch of real training images and masks, so chapter 5 can say from
measurement whether the penalty fits the CPU budget (``training.attribution_penalty``).

Why not the grad-cam package here: it detaches its maps (it is built to explain, not to train through),
so the differentiable map is written out below in the package's own formula (channel weights = the
spatial mean of the gradients, ReLU of the weighted sum).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def off_leaf_share(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, per-image off-leaf share of the differentiable Grad-CAM map at the last feature map)."""
    features = model.forward_features(images)
    logits = model.forward_head(features)
    score = logits.gather(1, labels[:, None]).sum()
    grads = torch.autograd.grad(score, features, create_graph=True)[0]
    cam = F.relu((grads.mean((2, 3), keepdim=True) * features).sum(1))
    leaf = F.adaptive_avg_pool2d(masks[:, None].float(), cam.shape[-2:])[:, 0]
    return logits, (cam * (1 - leaf)).sum((1, 2)) / (cam.sum((1, 2)) + 1e-6)


def _timed(step: Any) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _median_times(plain: Any, penalised: Any, steps: int) -> tuple[float, float]:
    """Median seconds of each step, the two interleaved (a shared CPU's load then hits both alike)."""
    plain()  # warm-up: allocator and kernel selection are not the step's cost
    penalised()
    times = [(_timed(plain), _timed(penalised)) for _ in range(steps)]
    return float(np.median([t[0] for t in times])), float(np.median([t[1] for t in times]))


def measure_cost(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    masks: torch.Tensor,
    weight: float,
    steps: int = 3,
) -> dict[str, Any]:
    """Seconds per plain and per penalised step (SGD on a copy's gradients; the weights are not kept)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()

    shares: list[float] = []

    def penalised() -> None:
        model.zero_grad(set_to_none=True)
        logits, share = off_leaf_share(model, images, labels, masks)
        (F.cross_entropy(logits, labels) + weight * share.mean()).backward()
        shares.append(float(share.detach().mean()))

    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        plain_s, penalised_s = _median_times(plain, penalised, steps)
    finally:
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
    return {
        "plain_step_s": plain_s,
        "penalised_step_s": penalised_s,
        "cost_ratio": penalised_s / plain_s if plain_s > 0 else None,
        "batch": int(len(images)),
        "steps_timed": int(steps),
        "parameters": int(sum(p.numel() for p in params)),
        "off_leaf_share_of_batch": float(np.mean(shares)),
    }


def decide(
    section: dict[str, Any], cost: dict[str, Any] | None, train_seconds: float | None
) -> dict[str, Any]:
    """Whether the penalty runs: only when its measured cost fits ``max_cost_ratio``.  Training with
    it is not implemented in this book, so a penalty that fits is reported as fitting, not as run."""
    budget = float(section.get("max_cost_ratio", 1.5))
    if cost is None or cost.get("cost_ratio") is None:
        return {
            "ran": False,
            "max_cost_ratio": budget,
            "cost": cost,
            "reason": "no background-robust regime in this run: there are no leaf masks to penalise against",
        }
    ratio = float(cost["cost_ratio"])
    fits = ratio <= budget
    extra = None if train_seconds is None else train_seconds * max(0.0, ratio - 1.0)
    if not fits:
        reason = (
            f"a penalised step cost {ratio:.2f}x a plain step on this machine (measured on a batch of "
            f"{cost['batch']} train photos), over the budget of {budget:.2f}x "
            "(training.attribution_penalty.max_cost_ratio)"
        )
    else:
        reason = (
            f"a penalised step cost {ratio:.2f}x a plain step, within the budget of {budget:.2f}x; this "
            "version of the book measures the penalty's cost but does not train with it"
        )
    return {
        "ran": False,
        "max_cost_ratio": budget,
        "fits_budget": fits,
        "cost": cost,
        "projected_extra_seconds": extra,
        "reason": reason,
    }
