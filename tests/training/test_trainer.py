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


def test_validation_runs_the_frozen_trunk_once_and_scores_what_a_whole_pass_scores(tmp_path, monkeypatch):
    """Every validation pass after the first reads the frozen trunk's kept outputs (the EMA's trunk is the
    raw model's: neither moves), and the history is the one whole passes give, bit for bit."""
    import pandas as pd
    from train_fixtures import TINY_TRAINING

    from cropcop_utils.training import trainer, val_trunk

    torch.set_num_threads(1)
    reference = {**TINY_TRAINING["reference"], "arch": "test_efficientnet", "drop_path_rate": 0.0}
    training = {**TINY_TRAINING, "raw_eval": "every", "reference": reference}
    resolve = train.resolve_config  # a from-scratch model: the settings would refuse to freeze it

    def frozen(section, kind, regime=None):
        return {**resolve(section, kind, regime), "frozen_groups": 2}

    monkeypatch.setattr(train, "resolve_config", frozen)
    caches: list[val_trunk.TrunkCache] = []
    monkeypatch.setattr(trainer, "TrunkCache", lambda: caches.append(val_trunk.TrunkCache()) or caches[-1])

    def history(name: str) -> pd.DataFrame:
        ctx = build_run(tmp_path, name, training=training)
        train.train_model(ctx, "reference", progress=False)
        frame = pd.read_parquet(ctx.run_dir / "training/reference/history.parquet")
        return frame.drop(columns=["epoch_seconds", "images_per_s"])

    kept = history("kept")
    assert [(c.computed, c.reused) for c in caches] == [(1, 3)]  # 2 epochs x (raw, EMA) passes
    monkeypatch.setattr(trainer, "frozen_trunk", lambda model, groups: None)
    pd.testing.assert_frame_equal(kept, history("whole"), check_exact=True)
    assert [(c.computed, c.reused) for c in caches] == [(1, 3), (0, 0)]


def test_a_trunk_whose_tensors_moved_is_run_again():
    from cropcop_utils.training.val_trunk import TrunkCache

    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1))
    batches = [(torch.randn(2, 3, 4, 4), torch.tensor([0, 1]))]
    cache = TrunkCache()
    with torch.inference_mode():
        first = cache.outputs(trunk, batches, lambda x: x)
        assert cache.outputs(trunk, batches, lambda x: x) is first
        assert (cache.computed, cache.reused) == (1, 1)
        trunk[0].bias.add_(1.0)
        again = cache.outputs(trunk, batches, lambda x: x)
    assert (cache.computed, cache.reused) == (2, 1)
    torch.testing.assert_close(again[0][1], first[0][1] + 1.0)
