"""The training job's resolution of device and mixed precision (the loop: test_trainer, test_chapter)."""

from __future__ import annotations

import pytest
import torch

from cropcop_utils.core.distributed import DistEnv
from cropcop_utils.training.job import resolve_amp, resolve_device


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
