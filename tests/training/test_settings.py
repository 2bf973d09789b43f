"""Chapter 5's configuration: every profile resolves, and bad ``training`` sections are refused by name."""

from __future__ import annotations

import pytest

from cropcop_utils.core import config
from cropcop_utils.training import settings as train


def test_profiles_resolve_and_bad_training_sections_are_refused():
    for name in config.available_profiles():
        section = config.load_profile(name)["training"]
        assert {train.resolve_config(section, kind)["arch"] for kind in train.MODELS}
    paper = config.load_profile("paper")
    assert train.resolve_config(paper["training"], "reference")["arch"] == "convnext_tiny"
    assert train.resolve_config(paper["training"], "compact")["arch"] == "mobilenetv4_conv_medium"
    assert paper["image"]["size"] == 256
    default = config.load_profile("default")
    pair = {kind: train.resolve_config(default["training"], kind) for kind in train.MODELS}
    assert {k: (c["arch"], c["weights"]) for k, c in pair.items()} == {
        "reference": ("tf_efficientnet_lite1", "package"), "compact": ("tf_efficientnet_lite0", "package")}
    assert default["image"]["size"] >= 128
    smoke = config.load_profile("smoke")["training"]
    assert all(train.resolve_config(smoke, kind)["weights"] is None for kind in train.MODELS)
    with pytest.raises(train.TrainingConfigError, match="no packaged ImageNet weights"):
        train.resolve_config({"reference_weights": "package", "reference": {"arch": "resnet10t"}},
                             "reference")
    with pytest.raises(train.TrainingConfigError, match="learning_rate"):
        train.resolve_config({"reference": {"arch": "resnet10t", "learning_rate": 1}}, "reference")
    with pytest.raises(train.TrainingConfigError, match="no teacher"):
        train.resolve_config({"reference": {"arch": "resnet10t", "distill": {"enabled": True}}}, "reference")
    with pytest.raises(train.TrainingConfigError, match="imbalance"):
        train.resolve_config({"imbalance": "oversample", "compact": {"arch": "resnet10t"}}, "compact")


def test_raw_eval_must_be_final_or_every():
    with pytest.raises(train.TrainingConfigError, match="raw_eval"):
        train.resolve_config({"raw_eval": "sometimes", "reference": {"arch": "test_resnet"}}, "reference")


def test_the_field_adapted_regime_overrides_only_its_own_models():
    section = {"epochs": 2, "lr": 1e-3, "reference": {"arch": "test_resnet", "epochs": 3},
               "compact": {"arch": "test_resnet"},
               "field_adapted": {"lr": 5e-4, "reference": {"epochs": 6}, "compact": {"imbalance": "sampler"}}}
    plain = {kind: train.resolve_config(section, kind) for kind in train.MODELS}
    adapted = {kind: train.resolve_config(section, kind, "field_adapted") for kind in train.MODELS}
    assert (plain["reference"]["epochs"], plain["reference"]["lr"]) == (3, 1e-3)
    assert (adapted["reference"]["epochs"], adapted["reference"]["lr"]) == (6, 5e-4)
    assert (adapted["compact"]["epochs"], adapted["compact"]["imbalance"]) == (2, "sampler")
    assert plain["compact"]["imbalance"] == "none"
    # another regime's name never picks up the field-adapted section
    assert train.resolve_config(section, "reference", "baseline") == plain["reference"]
    with pytest.raises(train.TrainingConfigError, match=r"training\.field_adapted\.compact.*learning_rate"):
        train.resolve_config({**section, "field_adapted": {"compact": {"learning_rate": 1}}}, "compact",
                             "field_adapted")


def test_only_pretrained_layers_may_stay_frozen():
    with pytest.raises(train.TrainingConfigError, match="random initialisation"):
        train.resolve_config({"reference": {"arch": "test_resnet", "frozen_groups": 2}}, "reference")
    with pytest.raises(train.TrainingConfigError, match="frozen_groups must be >= 0"):
        train.resolve_config({"reference": {"arch": "test_resnet", "frozen_groups": -1}}, "reference")
    for name in config.available_profiles():  # a from-scratch profile must not inherit default's freezing
        section = config.load_profile(name)["training"]
        for kind in train.MODELS:
            resolved = train.resolve_config(section, kind)
            assert resolved["weights"] is not None or resolved["frozen_groups"] == 0


def test_low_res_must_leave_the_last_epoch_at_the_image_size():
    section = {"epochs": 3, "reference": {"arch": "test_resnet"}}
    assert train.resolve_config(section, "reference")["low_res"] is None
    assert train.resolve_config({**section, "low_res": {"px": 96, "epochs": 2}}, "reference")["low_res"] == {
        "px": 96, "epochs": 2}
    for bad in ({"px": 96, "epochs": 3}, {"px": 96, "epochs": 0}, {"px": 8, "epochs": 1}, {"px": 96}):
        with pytest.raises(train.TrainingConfigError, match="low_res"):
            train.resolve_config({**section, "low_res": bad}, "reference")
