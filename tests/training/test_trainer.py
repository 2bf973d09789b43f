"""The training loop on a tiny run: a DataLoader worker changes nothing, the raw weights are scored as set."""

from __future__ import annotations

import shutil

import pytest
import torch
from train_fixtures import build_run

from cropcop_utils.core import checkpoint as ckpt
from cropcop_utils.training import chapter as train


def test_a_dataloader_worker_distils_the_same_compact_model(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    ctx = build_run(tmp_path, "teacher")  # tiny models, workers 0: augmentation in the training process
    train.train_model(ctx, "reference", progress=False)
    compact = ctx.run_dir / "training/compact/last.pt"
    train.train_model(ctx, "compact", progress=False)
    in_process = ckpt.load(compact)
    shutil.rmtree(compact.parent)
    resolve = train.resolve_config
    monkeypatch.setattr(train, "resolve_config",
                        lambda section, kind, regime=None: {**resolve(section, kind, regime), "workers": 1})
    train.train_model(ctx, "compact", progress=False)
    with_worker = ckpt.load(compact)
    for part in ("model", "ema"):
        for key, value in in_process[part].items():
            assert torch.equal(value, with_worker[part][key]), f"{part}.{key} differs (with a worker)"


@pytest.mark.parametrize("raw_eval", ["final", "every"])
def test_with_an_ema_the_raw_weights_are_scored_when_raw_eval_says(tmp_path, raw_eval):
    import pandas as pd
    from train_fixtures import TINY_TRAINING

    torch.set_num_threads(1)
    ctx = build_run(tmp_path, "raw", training={**TINY_TRAINING, "raw_eval": raw_eval})
    train.train_model(ctx, "reference", progress=False)
    history = pd.read_parquet(ctx.run_dir / "training/reference/history.parquet")
    assert history["val_macro_f1_ema"].notna().all()
    scored = history["val_macro_f1"].notna().tolist()
    assert scored == ([False, True] if raw_eval == "final" else [True, True])
    last = history.iloc[-1]
    best = ckpt.load(ctx.run_dir / "training/reference/best.pt")
    assert best["weights"] in ("raw", "ema")
    if last["best"]:
        assert best["weights"] == last["selected"]


def test_frozen_groups_leave_the_leading_layers_as_they_started(tmp_path, monkeypatch):
    from cropcop_utils.nets.models import create_model

    torch.set_num_threads(1)
    ctx = build_run(tmp_path, "frozen")
    resolve = train.resolve_config  # test_resnet starts at random: the settings would refuse to freeze it

    def frozen(section, kind, regime=None):
        return {**resolve(section, kind, regime), "frozen_groups": 2}

    monkeypatch.setattr(train, "resolve_config", frozen)
    summary = train.train_model(ctx, "reference", progress=False)
    assert 0 < summary["trainable_params"] < summary["params"] and summary["frozen_modules"] > 0
    torch.manual_seed(0)  # the trainer's seed before it builds the model
    start = create_model("test_resnet", 3, drop_path_rate=0.1, head_init_std=0.01).state_dict()
    trained = ckpt.load(ctx.run_dir / "training/reference/best.pt")["model"]
    leading = [k for k in start if k.startswith(("conv1", "bn1", "layer1."))]
    assert leading and all(torch.equal(start[k], trained[k]) for k in leading)
    assert not all(torch.equal(start[k], trained[k]) for k in start if k.startswith("layer2."))


def test_low_res_epochs_train_on_resized_batches_and_every_score_is_at_the_image_size(tmp_path):
    from train_fixtures import TINY_TRAINING

    torch.set_num_threads(1)
    reference = {**TINY_TRAINING["reference"], "low_res": {"px": 16, "epochs": 1}}
    ctx = build_run(tmp_path, "low", training={**TINY_TRAINING, "reference": reference})
    seen: list[tuple[bool, int]] = []

    def note(module, args):
        if type(module).__name__ == "ResNet":  # the model and its EMA copy, not their layers
            seen.append((module.training, args[0].shape[-1]))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    try:
        summary = train.train_model(ctx, "reference", progress=False)
    finally:
        handle.remove()
    trained = [px for training, px in seen if training]
    steps = len(trained) // 2  # two epochs of the same number of steps
    assert steps and trained == [16] * steps + [32] * steps
    assert {px for training, px in seen if not training} == {32}  # validation, every epoch
    assert summary["config"]["low_res"] == {"px": 16, "epochs": 1}  # in the weights' fingerprint
