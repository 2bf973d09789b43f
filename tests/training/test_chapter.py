"""Chapter 5 end to end on a tiny run folder: kill-and-resume, refusals, DDP, the chapter record."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from train_fixtures import build_run, run_cli, write_split

from cropcop_utils import training as train
from cropcop_utils.core import checkpoint as ckpt
from cropcop_utils.core import config
from cropcop_utils.core.config import deep_merge
from cropcop_utils.core.evidence import FingerprintMismatch, sha256_file
from cropcop_utils.nets.predict import score
from cropcop_utils.split import locked_test
from cropcop_utils.training.trainer import KILL_ENV

KILL_AFTER = 5  # tiny run: 3 steps per epoch, checkpoints every 2 steps -> killed in epoch 2, after step 4's


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run ``a`` trained in one go; run ``b`` SIGKILLed mid-epoch, then resumed.  Each run is a fresh CLI
    process, as a user's would be: weights are compared bit for bit, and torch settings left in the test
    process by other tests (one pytest-xdist worker runs many files) must not enter one run only."""
    base = tmp_path_factory.mktemp("training")
    a, b = build_run(base, "a"), build_run(base, "b")
    trained = run_cli(a.run_dir, "reference")
    assert trained.returncode == 0, trained.stderr[-2000:]
    killed = run_cli(b.run_dir, "reference", {KILL_ENV: str(KILL_AFTER)})
    at_kill = ckpt.load(b.run_dir / "training/reference/last.pt")["progress"]
    resumed = run_cli(b.run_dir, "reference")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = ckpt.load(b.run_dir / "training/reference/last.pt")["progress"]
    return SimpleNamespace(base=base, a=a, b=b, killed=killed, at_kill=at_kill, summary=summary)


def _copy(runs, name: str) -> config.RunContext:
    target = runs.base / name
    shutil.copytree(runs.a.run_dir, target)
    return config.reopen_run(target)


def test_a_run_killed_mid_epoch_resumes_to_bit_identical_weights(runs):
    assert runs.killed.returncode == -signal.SIGKILL, runs.killed.stderr[-2000:]
    assert runs.at_kill["epoch"] == 1 and runs.at_kill["batch"] == 1 and not runs.at_kill["finished"]
    assert runs.at_kill["global_step"] == 4  # the checkpoint before the kill; step 5 is redone
    assert runs.summary["resumes"] == 1 and runs.summary["finished"]
    a = ckpt.load(runs.a.run_dir / "training/reference/last.pt")
    b = ckpt.load(runs.b.run_dir / "training/reference/last.pt")
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{part}.{key} differs after resume"
    assert a["progress"]["global_step"] == b["progress"]["global_step"] == 6
    timing = {"epoch_seconds", "images_per_s"}
    # NaN-aware: with raw_eval final the raw weights' val scores are NaN before the last epoch
    pd.testing.assert_frame_equal(pd.DataFrame(a["history"]).drop(columns=sorted(timing)),
                                  pd.DataFrame(b["history"]).drop(columns=sorted(timing)))
    best_a = ckpt.load(runs.a.run_dir / "training/reference/best.pt")
    best_b = ckpt.load(runs.b.run_dir / "training/reference/best.pt")
    assert all(torch.equal(best_a["model"][k], best_b["model"][k]) for k in best_a["model"])


def test_resume_refuses_a_changed_split(runs):
    ctx = _copy(runs, "split_changed")
    frame = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    frame.loc[frame.index[frame["split"] == "val"][0], "split"] = "train"  # as if the split were remade
    class_map = json.loads((ctx.run_dir / "split/class_map.json").read_text())
    write_split(ctx.run_dir, frame, class_map)
    with pytest.raises(ckpt.ResumeMismatch, match="split/split.parquet") as caught:
        train.train_model(ctx, "reference", progress=False)
    assert "class_map" not in str(caught.value)


def test_resume_refuses_a_changed_class_map(runs):
    ctx = _copy(runs, "map_changed")
    frame = pd.read_parquet(ctx.run_dir / "split/split.parquet")
    class_map = json.loads((ctx.run_dir / "split/class_map.json").read_text())
    class_map["classes"][0]["crop"] = "pear"
    write_split(ctx.run_dir, frame, class_map)
    with pytest.raises(ckpt.ResumeMismatch, match="split/class_map.json"):
        train.train_model(ctx, "reference", progress=False)


def test_an_edited_split_file_or_other_configuration_is_refused(runs):
    ctx = _copy(runs, "edited")
    params = deep_merge(ctx.params, {"training": {"reference": {"lr": 0.01}}})
    with pytest.raises(ckpt.ResumeMismatch, match=r"lr: checkpoint 0\.003, now 0\.01"):
        train.train_model(dataclasses.replace(ctx, params=params), "reference", progress=False)
    path = ctx.run_dir / "split/split.parquet"
    frame = pd.read_parquet(path)
    frame.loc[0, "label"] = (frame.loc[0, "label"] + 1) % 3
    frame.to_parquet(path, index=False)
    with pytest.raises(FingerprintMismatch, match="split/split.parquet"):
        train.train_model(ctx, "reference", progress=False)


@pytest.fixture(scope="module")
def chapter_run(runs):
    """Chapter 5 run once, in one process, on a copy of run ``a``: its record and the run it wrote (the
    two-process test compares its record with this one)."""
    ctx = _copy(runs, "chapter")
    return ctx, train.run_chapter(ctx, progress=False)


def test_chapter_trains_the_compact_model_from_the_reference_and_records_everything(runs, chapter_run):
    ctx, record = chapter_run
    ref, comp = record["models"]["reference"], record["models"]["compact"]
    assert ref["checkpoint_sha256"] == sha256_file(runs.a.run_dir / "training/reference/best.pt")
    assert comp["teacher"]["checkpoint_sha256"] == ref["checkpoint_sha256"]
    assert comp["teacher"]["temperature"] == 2.0 and comp["teacher"]["alpha"] == 0.5
    assert comp["hyperparameters"]["arch"] == "mobilenetv4_conv_small_050" and ref["teacher"] is None
    assert not ref["pretrained"]["pretrained"] and "from scratch" in ref["pretrained"]["description"]
    for kind in ("reference", "compact"):
        for part in ("val", "test"):
            frame = pd.read_parquet(ctx.run_dir / f"training/{kind}/predictions_{part}.parquet")
            assert (frame["model_state"] == record["models"][kind]["checkpoint_sha256"]).all()
            assert len(frame) == 12 and frame["top5_idx"].map(len).eq(3).all()
    val = pd.read_parquet(ctx.run_dir / "training/compact/predictions_val.parquet")
    assert record["models"]["compact"]["val_macro_f1"] == pytest.approx(score(val)["macro_f1"], abs=1e-12)
    accesses = locked_test.read_accesses(ctx.run_dir)
    # the smoke profile trains both regimes: the shipped one on the plain paths, the baseline one deeper
    assert sorted(accesses["reader"]) == ["training/baseline/compact", "training/baseline/reference",
                                          "training/compact", "training/reference"]
    assert (ctx.run_dir / "training/history.png").exists() and len(record["test_access"]) == 4
    assert record["shipped_regime"] == "background_robust" and set(record["regimes"]) == {
        "baseline", "background_robust"}
    assert record["regimes"]["background_robust"]["models"] == record["models"]
    assert "regime" not in record["regimes"]["baseline"]["models"]["compact"]["hyperparameters"]
    assert "background_robust" in train.describe_regimes(record) and len(train.regime_table(record)) == 4
    assert "not run" in train.describe_penalty(record)
    # a second run resumes nothing, re-reads nothing from the locked test, and records the same states
    again = train.run_chapter(ctx, progress=False)
    assert len(locked_test.read_accesses(ctx.run_dir)) == 4
    assert {k: m["checkpoint_sha256"] for k, m in again["models"].items()} == \
        {k: m["checkpoint_sha256"] for k, m in record["models"].items()}
    table = train.hyperparameter_table(record)
    assert {"lr", "distill.temperature", "ema.decay", "weights"} <= set(table["hyper-parameter"])
    assert "distillation" in train.describe_models(record)
    assert "both models were trained from scratch" in train.describe_starts(record)
    assert "pretrained" not in train.describe_models(record)


def _shape(value):
    """A record's structure without its numbers: keys all the way down, list lengths."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k not in ("hyperparameters", "test_access")}
    if isinstance(value, list):
        return [len(value)]
    return type(value).__name__ if value is not None else None


def test_the_chapter_launches_torchrun_when_the_profile_asks_for_two_processes(chapter_run, tmp_path):
    from train_fixtures import TINY_TRAINING

    one_process, single = chapter_run
    ctx = build_run(tmp_path, "two", training={**TINY_TRAINING, "processes": 2})
    record = train.run_chapter(ctx, progress=False)
    for regime in record["regimes"].values():
        for kind, model in regime["models"].items():
            assert model["world_size"] == 2 and model["hyperparameters"]["processes"] == 2
            folder = ctx.run_dir / regime["folder"] / kind
            last = ckpt.load(folder / "last.pt")
            assert len(last["rng"]) == 2 and len(set(last["rank_parameters_sha256"])) == 1
            assert "--nproc_per_node=2" in (folder / "torchrun.log").read_text()
            assert f"{regime['folder']}/{kind}/torchrun.log" in record["outputs"]
            rows = pd.read_parquet(folder / "predictions_test.parquet")
            assert len(rows) == len(pd.read_parquet(one_process.run_dir / regime["folder"] / kind
                                                    / "predictions_test.parquet"))
    assert _shape(record["figures"]) == _shape(single["figures"])
    assert _shape(record["regimes"]) == _shape(single["regimes"])
    assert {m["world_size"] for r in single["regimes"].values() for m in r["models"].values()} == {1}
