"""The training loop's resolution of device and mixed precision (the loop itself: tests/test_train.py)."""

from __future__ import annotations

import shutil

import pytest
import torch
from train_fixtures import build_run

from cropcop_utils import checkpoint as ckpt
from cropcop_utils import train
from cropcop_utils.distributed import DistEnv
from cropcop_utils.trainer import resolve_amp, resolve_device


def test_auto_device_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device({"device": "auto"}, DistEnv()) == torch.device("cpu")
    assert resolve_device({}, DistEnv()) == torch.device("cpu")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        resolve_device({"device": "cuda"}, DistEnv())


@pytest.mark.parametrize(("wanted", "device", "expected"), [
    ("auto", "cpu", "off"), ("auto", "cuda", "bf16"), ("bf16", "cpu", "bf16"), ("off", "cuda", "off"),
    ("fp16", "cuda", "fp16"),
])
def test_amp_resolution(wanted, device, expected):
    assert resolve_amp({"amp": wanted}, torch.device(device)) == expected


def test_bad_amp_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="fp16' needs CUDA"):
        resolve_amp({"amp": "fp16"}, torch.device("cpu"))
    with pytest.raises(ValueError, match="training.amp must be"):
        resolve_amp({"amp": "fp8"}, torch.device("cpu"))


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
                        lambda section, kind: {**resolve(section, kind), "workers": 1})
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


def test_raw_eval_must_be_final_or_every():
    with pytest.raises(train.TrainingConfigError, match="raw_eval"):
        train.resolve_config({"raw_eval": "sometimes", "reference": {"arch": "test_resnet"}}, "reference")
