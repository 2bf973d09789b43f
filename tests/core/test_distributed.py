"""One process or several: the single-process no-ops, and a real two-process gloo run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from train_fixtures import build_run, run_cli

from cropcop_utils.core import checkpoint as ckpt
from cropcop_utils.core.distributed import DistEnv, barrier, gather, init_distributed
from cropcop_utils.nets.models import create_model
from cropcop_utils.nets.predict import PredictConfig, predict, score
from cropcop_utils.training.trainer import parameters_sha256


def test_without_torchrun_everything_is_one_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    env = init_distributed("cpu")
    assert env == DistEnv() and env.is_main and not env.enabled
    payload = {"rows": [1, 2]}
    assert gather(payload, env) == [payload]
    assert barrier(env) is None


def test_parameters_digest_sees_one_changed_weight_and_ignores_buffers():
    torch.manual_seed(0)
    model = create_model("test_resnet", 3)
    before = parameters_sha256(model)
    for buffer in model.buffers():  # batch-norm statistics are each rank's own after a forward
        buffer.add_(1)
    assert parameters_sha256(model) == before
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    assert parameters_sha256(model) != before


def test_a_rank_other_than_zero_is_not_main():
    env = DistEnv(rank=1, world_size=2, local_rank=1)
    assert env.enabled and not env.is_main


def test_two_process_ddp_on_gloo_completes_with_consistent_metrics(tmp_path):
    ctx = build_run(tmp_path, "ddp")
    result = run_cli(ctx.run_dir, "reference", ranks=2)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    last = ckpt.load(ctx.run_dir / "training/reference/last.pt")
    assert summary["world_size"] == last["config"]["world_size"] == 2
    assert len(last["rng"]) == 2  # each rank's RNG streams are kept
    # DDP kept the ranks in lockstep: both ended with bit-identical parameters, the ones rank 0 saved.
    digests = last["rank_parameters_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1], digests
    saved = create_model(last["arch"], last["num_classes"])
    saved.load_state_dict(last["model"])
    assert digests[0] == parameters_sha256(saved)
    steps = 30 // (8 * 2)  # 30 training rows, 8 per rank, 2 ranks
    assert last["progress"]["finished"] and last["progress"]["global_step"] == 2 * steps
    assert last["progress"]["images_seen"] == 2 * steps * 16
    best = ckpt.load(ctx.run_dir / "training/reference/best.pt")
    model = create_model(best["arch"], best["num_classes"])
    model.load_state_dict(best["model"])
    rows = pd.read_parquet(ctx.run_dir / "split/split.parquet").query("split == 'val'")
    rescored = score(predict(model, rows, PredictConfig.from_ctx(ctx), "0" * 64))
    assert rescored["macro_f1"] == pytest.approx(best["val_macro_f1"], abs=1e-12)
    assert rescored["accuracy"] == pytest.approx(best["val_acc"], abs=1e-12)
