"""Checkpoint files: every RNG restored, atomic weights_only round trip, named refusals on resume."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cropcop_utils.core import checkpoint as ckpt


def _draws() -> tuple:
    return random.random(), np.random.rand(), float(torch.rand(())), torch.randn(3).tolist()


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached Gaussian in numpy's legacy state
    path = tmp_path / "state.pt"
    ckpt.save(path, {"model": {}, "rng": ckpt.capture_rng()})
    expected = _draws()
    _draws()  # move every stream on
    ckpt.restore_rng(ckpt.load(path)["rng"])
    assert _draws() == expected


def test_save_is_atomic_and_returns_the_file_hash(tmp_path):
    from cropcop_utils.core.evidence import sha256_file

    path = tmp_path / "last.pt"
    model = torch.nn.Linear(3, 2)
    sha = ckpt.save(path, {"model": model.state_dict(), "progress": {"epoch": 1, "best": None}})
    assert sha == sha256_file(path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left behind
    loaded = ckpt.load(path)
    assert torch.equal(loaded["model"]["weight"], model.weight) and loaded["progress"]["epoch"] == 1


def test_unreadable_or_foreign_files_are_named(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match="bad.pt"):
        ckpt.load(bad)
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "missing.pt")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(ckpt.CheckpointError, match="not a CropCop"):
        ckpt.load(other)
    # a pickled object is not loadable with weights_only=True: no code runs when a checkpoint opens
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "obj": ckpt.ResumeMismatch("x")}, evil)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(evil)


def _state(**changes) -> dict:
    state = {"format": ckpt.FORMAT, "model": {},
             "data_fingerprints": {"split/split.parquet": "a" * 64, "split/class_map.json": "b" * 64},
             "config": {"lr": 0.001, "ema": {"decay": 0.99}}, "config_fingerprint": "c1"}
    state.update(changes)
    return state


def test_resume_check_names_what_differs():
    state = _state()
    ckpt.check_resume(state, "last.pt", dict(state["data_fingerprints"]), dict(state["config"]), "c1")
    fingerprints = {**state["data_fingerprints"], "split/split.parquet": "d" * 64}
    with pytest.raises(ckpt.ResumeMismatch, match="split/split.parquet") as caught:
        ckpt.check_resume(state, "last.pt", fingerprints, state["config"], "c1")
    assert "class_map" not in str(caught.value)
    with pytest.raises(ckpt.ResumeMismatch, match=r"ema\.decay: checkpoint 0\.99, now 0\.999"):
        ckpt.check_resume(state, "last.pt", state["data_fingerprints"],
                          {"lr": 0.001, "ema": {"decay": 0.999}}, "c2")
    with pytest.raises(ckpt.ResumeMismatch, match="format"):
        ckpt.check_resume(_state(format="other"), "last.pt", state["data_fingerprints"], state["config"],
                          "c1")
