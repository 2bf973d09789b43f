"""Where a model looks: Grad-CAM on the float models, occlusion on every state, and off-leaf mass.

- **Grad-CAM** (the ``grad-cam`` package) needs gradients and the activations of a convolutional stage,
  so it runs on the float models (reference, compact) only.  The stage is one of timm's ``feature_info``
  stages; at the book's small input sizes the last stage is a 2×2 grid, so the profile may pick an earlier
  one (``field_transfer.gradcam_stage``) and the chapter records the grid it used.
- The **INT8 graph and the .pte** give neither gradients nor hookable layers (the .pte is an opaque
  XNNPACK program), so their attribution is measured by **occlusion** (captum's ``Occlusion``): a
  black-box method that only calls the state's forward function.  The float models are occluded on the
  same images, so the four states are compared by one method; Grad-CAM and occlusion are never mixed in
  one comparison.
- :func:`off_leaf_mass`: the share of an attribution map's non-negative mass that falls outside the leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image


class AttributionError(ValueError):
    """An attribution map and a leaf mask that cannot be compared, or a model without feature stages."""


# --------------------------------------------------------------------------- off-leaf mass
def off_leaf_mass(attribution: np.ndarray, leaf_mask: np.ndarray) -> float | None:
    """Share of the attribution's non-negative mass outside the leaf; None when the map has no mass.

    Negative values (evidence against the class, in occlusion maps) are not attention and count as zero.
    """
    attribution = np.asarray(attribution, dtype=np.float64)
    leaf_mask = np.asarray(leaf_mask, dtype=bool)
    if attribution.shape != leaf_mask.shape:
        raise AttributionError(
            f"attribution map {attribution.shape} and leaf mask {leaf_mask.shape} differ "
            "in shape; bring the mask onto the model's grid (mask_on_model_grid)"
        )
    mass = np.clip(np.nan_to_num(attribution, nan=0.0), 0.0, None)
    total = float(mass.sum())
    if total <= 0.0:
        return None
    return float(mass[~leaf_mask].sum() / total)


def off_leaf_masses(attributions: np.ndarray, masks: Sequence[np.ndarray]) -> np.ndarray:
    """Off-leaf mass per image, NaN where a map has no mass (counted and reported, never averaged)."""
    if len(attributions) != len(masks):
        raise AttributionError(f"{len(attributions)} attribution maps but {len(masks)} masks")
    values = [off_leaf_mass(a, m) for a, m in zip(attributions, masks, strict=True)]
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def mask_on_model_grid(mask: np.ndarray, size: int) -> np.ndarray:
    """A native-resolution leaf mask carried through the loading contract's geometry onto size×size.

    ``imaging.pad_to_square`` pads the shorter side symmetrically (odd pixel right / bottom); the padding
    is background, so it is off-leaf.  Nearest-neighbour resize keeps the mask binary.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise AttributionError(f"a leaf mask is two-dimensional, got shape {mask.shape}")
    height, width = mask.shape
    side = max(height, width)
    square = np.zeros((side, side), dtype=np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    square[top : top + height, left : left + width] = mask
    resized = Image.fromarray(square * 255).resize((size, size), Image.Resampling.NEAREST)
    return np.asarray(resized) > 127


# --------------------------------------------------------------------------- Grad-CAM (float models)
def feature_stage(model: torch.nn.Module, stage: int = -1) -> tuple[str, torch.nn.Module]:
    """The (name, module) of a timm feature stage (``feature_info``), indexed like a list."""
    info = getattr(model, "feature_info", None)
    if not info:
        raise AttributionError(
            f"{type(model).__name__} has no timm feature_info: no stage to attach Grad-CAM to"
        )
    try:
        name = info[stage]["module"]
    except IndexError:
        raise AttributionError(
            f"field_transfer.gradcam_stage {stage} is out of range: {type(model).__name__} has "
            f"{len(info)} feature stages"
        ) from None
    return name, model.get_submodule(name)


def gradcam(
    model: torch.nn.Module,
    images: torch.Tensor,
    targets: Sequence[int],
    stage: int = -1,
    batch_size: int = 16,
) -> np.ndarray:
    """Grad-CAM maps (N, S, S) in [0, 1] of ``images`` (N, 3, S, S) for the class ``targets[i]``.

    Each map is min-max scaled by the package, as Grad-CAM is published; off-leaf mass is a share, so
    the scale does not enter it.
    """
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    if len(images) != len(targets):
        raise AttributionError(f"{len(images)} images but {len(targets)} target classes")
    if len(images) == 0:
        return np.empty((0, *images.shape[-2:]), dtype=np.float32)
    model.eval()
    _, layer = feature_stage(model, stage)
    maps = []
    with GradCAM(model=model, target_layers=[layer]) as cam:
        for start in range(0, len(images), batch_size):
            batch = images[start : start + batch_size]
            chosen = [ClassifierOutputTarget(int(t)) for t in targets[start : start + batch_size]]
            maps.append(cam(input_tensor=batch, targets=chosen).astype(np.float32))
    return np.concatenate(maps)


def gradcam_grid(model: torch.nn.Module, size: int, stage: int = -1) -> int:
    """Side of the activation grid Grad-CAM reads at input ``size`` (its spatial resolution)."""
    _, layer = feature_stage(model, stage)
    seen: list[tuple[int, ...]] = []
    handle = layer.register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 3, size, size))
    finally:
        handle.remove()
    return int(seen[-1][-1])


# --------------------------------------------------------------------------- occlusion (any state)
def occlusion(
    forward: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    targets: Sequence[int],
    window: int,
    stride: int,
    max_batch: int | None = None,
) -> np.ndarray:
    """Occlusion maps (N, S, S): how much the target class's probability drops when a window is blanked.

    ``forward`` is any batch → logits callable (a float model, the INT8 graph, the .pte's method).  The
    window is replaced by 0 in normalised space (the dataset's mean colour); captum averages each pixel's
    drop over the windows that cover it.  ``max_batch`` bounds the perturbations per call (the .pte
    plans memory for a fixed largest batch).
    """
    from captum.attr import Occlusion

    if len(images) != len(targets):
        raise AttributionError(f"{len(images)} images but {len(targets)} target classes")
    size = images.shape[-1]
    if not 1 <= stride <= window <= size:
        raise AttributionError(
            f"occlusion needs 1 <= stride ({stride}) <= window ({window}) <= image size ({size})"
        )

    def probability(batch: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.as_tensor(forward(batch.contiguous())).float(), dim=-1)

    method = Occlusion(probability)
    per_eval = max(1, min(max_batch or 32, 32))
    maps = []
    with torch.inference_mode():
        for image, target in zip(images, targets, strict=True):
            attribution = method.attribute(
                image[None],
                sliding_window_shapes=(3, window, window),
                strides=(3, stride, stride),
                baselines=0.0,
                target=int(target),
                perturbations_per_eval=per_eval,
            )
            maps.append(attribution[0].mean(0).numpy().astype(np.float32))
    return np.stack(maps) if maps else np.empty((0, size, size), dtype=np.float32)


def occlusion_windows(size: int, window: int, stride: int) -> int:
    """Forward passes per image (windows per side squared): the cost the profile trades against n."""
    per_side = -(-(size - window) // stride) + 1  # captum's shift count: ceil((size - window) / stride) + 1
    return per_side * per_side
