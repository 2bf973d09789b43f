"""Chapter 5's notebook text: what the report helpers say about a training record."""

from __future__ import annotations

from cropcop_utils.training import report as train


def test_the_text_names_pretrained_weights_only_where_they_were_used():
    def model(pretrained: bool) -> dict:
        start = ({"pretrained": True, "sha256": "ab" * 32, "description": "EfficientNet-Lite, ImageNet-1k "
                  "supervised weights of tf_efficientnet_lite1"} if pretrained else
                 {"pretrained": False, "sha256": None, "description": "random initialisation"})
        return {"pretrained": start, "arch": "a", "num_classes": 3, "params": 10, "image_size": 128,
                "teacher": None}

    record = {"models": {"reference": model(True), "compact": model(False)}}
    text = train.describe_starts(record)
    assert "Fine-tuned from pretrained weights:** reference" in text and "scratch:** compact" in text
    assert "ab" * 32 in train.describe_models(record)


def test_the_text_says_which_layers_kept_their_pretrained_weights():
    start = {"pretrained": True, "sha256": None, "description": "ImageNet weights"}
    frozen = {"pretrained": start, "arch": "a", "num_classes": 3, "params": 1000, "image_size": 128,
              "teacher": None, "hyperparameters": {"frozen_groups": 4}, "trainable_params": 960}
    whole = dict(frozen, hyperparameters={"frozen_groups": 0}, trainable_params=1000)
    text = train.describe_models({"models": {"reference": frozen, "compact": whole}})
    assert "first 4 layer groups (the stem and the first 3 stages, 40 parameters)" in text
    assert "960 parameters were trained" in text and text.count("kept their pretrained") == 1
