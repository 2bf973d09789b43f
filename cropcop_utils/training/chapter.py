"""Chapter 5: training the reference and the compact model, with every hyper-parameter on record.

``run_chapter`` trains the reference, then the compact model with the reference's best checkpoint as
teacher (unless the profile switches distillation off), resuming either from its ``last.pt`` when one
exists; then it scores each model's best checkpoint on the validation rows and, once per model state,
on the locked test rows (``locked_test``), and writes ``training/training.json``.

The same training runs from the command line, on one process or under ``torchrun``::

    python -m cropcop_utils.training --run-dir runs/default --model reference
    torchrun --nproc_per_node=2 -m cropcop_utils.training --run-dir runs/default --model compact

and the chapter itself launches ``torchrun`` for each model when the profile's ``training.processes`` is
more than 1 (:func:`launch_processes`).

The configuration lives in :mod:`.settings`; the notebook's tables and sentences in :mod:`.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from ..core import checkpoint as ckpt
from ..core.config import REPO_ROOT, RunContext, reopen_run
from ..core.evidence import Chapter, atomic_write_text, sha256_file
from ..core.imaging import ImageSpec
from ..core.sources import FIELD_TRAIN
from ..split import locked_test
from . import regimes
from .regimes import BACKGROUND_ROBUST, BASELINE, Regime
from .report import load_histories, plot_history
from .settings import FOLDER, MODELS, model_dir, regime_named, resolve_config


class TrainingOrderError(RuntimeError):
    """The compact model needs the finished reference as its teacher."""


def robust_inputs(ctx: RunContext, frozen: Any, config: dict[str, Any],
                  progress: bool = False) -> Any:
    """The background-robust regime's masks, pool and paste step (made once, then reused)."""
    from ..core.squares import SquareCache, row_paths
    from .regimes import robust_inputs as ri

    rows = frozen.rows_for("train")
    squares = SquareCache(row_paths(rows, ctx.corpus_root), ImageSpec.from_section(ctx.section("image")).size)
    squares.fill(progress=progress, desc="decode (masks)")
    ch = Chapter(ctx.run_dir, FOLDER)
    main = int(os.environ.get("RANK", "0")) == 0
    if not main:  # under torchrun rank 0 writes the masks and the pool; the others read them
        ri.wait_for(ctx.run_dir, ri.POOL)
    inputs = ri.prepare(ch, rows, squares, ctx.section("training").get("background_robust") or {})
    inputs.record["examples"] = {"path": ri.EXAMPLES, "sha256": ri.save_examples(
        ch, inputs, squares, int(config["seed"])) if main else None}
    inputs.record["inputs"], inputs.record["outputs"] = dict(ch.inputs), dict(ch.outputs)
    return inputs


def _finished(last: Path) -> bool:
    return last.exists() and bool(ckpt.load(last)["progress"]["finished"])


# --------------------------------------------------------------------------- one model
def train_model(ctx: RunContext, kind: str, frozen: Any = None, progress: bool = True,
                regime: Regime | None = None, robust: Any = None) -> dict[str, Any]:
    """Train (or resume, or confirm finished) one model of a regime (default: the shipped one); returns
    the trainer's summary.  ``robust`` is the background-robust regime's prepared inputs (made here when
    that regime is asked for without them)."""
    from ..core.distributed import DistEnv, init_distributed
    from ..split import FIELD_TRAIN_SPLIT, load_frozen
    from .job import Job
    from .trainer import Trainer

    regime = regime or regime_named(ctx, None)
    config = resolve_config(ctx.section("training"), kind, regime.name)
    if frozen is None:
        frozen = load_frozen(Chapter(ctx.run_dir, FOLDER))
    paste = None
    with_field = regime.uses_field_train
    if with_field:
        # which labelled field photos, split how, determine the weights as much as the lab split does
        config["regime"] = {"name": regime.name,
                            "field_train_split_sha256": frozen.split_json["fingerprints"][FIELD_TRAIN_SPLIT]}
    if regime.name == BACKGROUND_ROBUST:
        robust = robust or robust_inputs(ctx, frozen, config, progress)
        paste = robust.paste
        # the regime is part of what determines the weights: its parameters and the pool's identity
        config["regime"] = {"name": regime.name, "params": robust.record["params"],
                            "pool_sha256": robust.record["pool"]["sha256"],
                            "masks_sha256": robust.record["masks"]["sha256"]}
    device_type = "cuda" if config["device"] in ("auto", "cuda") and _cuda() else "cpu"
    env = init_distributed(device_type) if os.environ.get("WORLD_SIZE") else DistEnv()
    teacher_path = teacher_sha = None
    if kind == "compact" and config["distill"]["enabled"]:
        teacher_path = model_dir(ctx.run_dir, "reference", regime) / "best.pt"
        teacher_last = model_dir(ctx.run_dir, "reference", regime) / "last.pt"
        if not teacher_path.exists() or not _finished(teacher_last):
            raise TrainingOrderError(f"the compact model learns from the finished reference, but "
                                     f"{teacher_path} is missing or the reference has not finished; train "
                                     "the reference first (--model reference)")
        teacher_sha = sha256_file(teacher_path)
    out_dir = model_dir(ctx.run_dir, kind, regime)
    out_dir.mkdir(parents=True, exist_ok=True)
    job = Job(kind=kind, config=config, spec=ImageSpec.from_section(ctx.section("image")),
              corpus_root=ctx.source_roots, train_rows=frozen.rows_for("train", field_train=with_field),
              val_rows=frozen.rows_for("val", field_train=with_field), class_names=list(frozen.class_names),
              data_fingerprints=dict(frozen.split_json["fingerprints"]), out_dir=out_dir,
              teacher_path=teacher_path, teacher_sha256=teacher_sha, progress=progress, env=env, paste=paste)
    return Trainer(job).fit()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --------------------------------------------------------------------------- evaluation records
def score_model(ctx: RunContext, ch: Chapter, frozen: Any, kind: str, config: dict[str, Any],
                progress: bool = False, regime: Regime | None = None) -> dict[str, Any]:
    """Val and (once per checkpoint) test predictions of a model's best checkpoint; returns the scores."""
    from dataclasses import replace

    from ..nets.models import create_model, for_inference
    from ..nets.predict import PredictConfig, predict, same_state, score

    folder = (regime or Regime(BASELINE, True)).path(f"{FOLDER}/{kind}")
    best_path = ch.path(f"{folder}/best.pt")
    state = ckpt.load(best_path)
    sha = sha256_file(best_path)
    device = "cuda" if config["device"] in ("auto", "cuda") and _cuda() else "cpu"
    model = create_model(state["arch"], int(state["num_classes"]))
    model.load_state_dict(state["model"])
    model = for_inference(model).to(device)
    cfg = PredictConfig.from_ctx(ctx, batch_size=int(config["eval_batch_size"]),
                                 workers=int(config["workers"]), device=device, progress=progress)
    # val: the trainer's decoded squares of the same files, when it ran in this process (data.SquareCache)
    val_rows = frozen.rows_for("val", field_train=(regime or Regime(BASELINE, True)).uses_field_train)
    val = predict(model, val_rows, replace(cfg, cache=True), sha, desc=f"{kind}: val")
    ch.write_parquet(f"{folder}/predictions_val.parquet", val)
    test_rel = f"{folder}/predictions_test.parquet"
    if same_state(ch.path(test_rel), sha, frozen.rows_for("test")["row_id"]) and \
            locked_test.accesses_for(ctx.run_dir, sha):
        test = pd.read_parquet(ch.path(test_rel))  # this state already saw the test split once
    else:
        rows = locked_test.read_test_rows(ctx.run_dir, sha, reader=folder)
        test = predict(model, rows, cfg, sha, desc=f"{kind}: test")
    ch.write_parquet(test_rel, test)
    for name in ("best.pt", "last.pt", "history.parquet"):
        ch.record_output(f"{folder}/{name}")
    by_source = None
    if "source" in val_rows:  # lab val and field val, each scored on its own rows as well
        source = val["row_id"].map(val_rows.set_index("row_id")["source"])
        by_source = {name: score(val[(source == name).to_numpy()]) for name in sorted(set(source))}
    return {"state": state, "sha256": sha, "val": score(val), "val_by_source": by_source, "test": score(test)}


def model_record(summary: dict[str, Any], scored: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The figures of one model in ``training.json``."""
    state = scored["state"]
    distill = config["distill"] if summary["kind"] == "compact" and config["distill"]["enabled"] else None
    return {
        "arch": state["arch"], "params": int(state["params"]), "num_classes": int(state["num_classes"]),
        "trainable_params": summary.get("trainable_params"), "frozen_modules": summary.get("frozen_modules"),
        "image_size": int(state["image_size"]), "pretrained": state["pretrained"],
        "teacher": None if distill is None else {"checkpoint_sha256": state["teacher_sha256"],
                                                  "temperature": distill["temperature"],
                                                  "alpha": distill["alpha"]},
        "hyperparameters": config, "config_fingerprint": summary["config_fingerprint"],
        "best_epoch": int(state["epoch"]), "best_weights": state["weights"],
        "val_macro_f1": float(state["val_macro_f1"]), "val_acc": float(state["val_acc"]),
        "val_records": scored["val"], "val_by_source": scored.get("val_by_source"),
        "test_acc": scored["test"]["accuracy"],
        "test_macro_f1": scored["test"]["macro_f1"], "test_rows": scored["test"]["n"],
        "checkpoint_sha256": scored["sha256"], "epochs": summary["epoch"], "steps": summary["global_step"],
        "steps_per_epoch": summary["steps_per_epoch"], "resumes": summary["resumes"],
        "train_seconds": summary["train_seconds"], "wall_seconds": summary.get("wall_seconds"),
        "images_per_s": summary["images_per_s"],
        "device": summary["device"], "amp": summary["amp"], "world_size": summary["world_size"],
    }


# --------------------------------------------------------------------------- chapter
def train_regime(ctx: RunContext, ch: Chapter, frozen: Any, regime: Regime,
                 progress: bool = True) -> dict[str, Any]:
    """Both models of one regime, trained (or resumed) and scored; returns the regime's record."""
    robust = None
    if regime.name == BACKGROUND_ROBUST:
        robust = robust_inputs(ctx, frozen, resolve_config(ctx.section("training"), "reference"), progress)
        ch.inputs.update(robust.record.pop("inputs"))
        ch.outputs.update(robust.record.pop("outputs"))
    models: dict[str, Any] = {}
    for kind in MODELS:
        config = resolve_config(ctx.section("training"), kind, regime.name)
        if int(config["processes"]) > 1 and not os.environ.get("WORLD_SIZE"):
            summary = launch_processes(ctx, ch, kind, regime, int(config["processes"]))
        else:
            summary = train_model(ctx, kind, frozen=frozen, progress=progress, regime=regime, robust=robust)
        if "regime" in summary["config"]:
            config = {**config, "regime": summary["config"]["regime"]}
        scored = score_model(ctx, ch, frozen, kind, config, regime=regime)
        models[kind] = model_record(summary, scored, config)
    if models["compact"]["teacher"]:
        teacher = regime.path(f"{FOLDER}/reference/best.pt")
        ch.inputs[teacher] = models["compact"]["teacher"]["checkpoint_sha256"]
    return {"shipped": regime.shipped, "folder": regime.path(f"{FOLDER}/reference").rsplit("/", 1)[0],
            "models": models, "background": None if robust is None else robust.record}


def launch_processes(ctx: RunContext, ch: Chapter, kind: str, regime: Regime,
                     processes: int) -> dict[str, Any]:
    """Train one model under ``torchrun`` with ``processes`` processes on this machine (the profile's
    ``training.processes``: DDP, gloo on CPU, NCCL with one process per GPU); returns rank 0's summary.

    The processes resume from ``last.pt`` like a single one, so a finished model is only confirmed.  Their
    output is kept in ``<model>/torchrun.log``, registered with the chapter.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "cropcop_utils.training", "--run-dir", str(ctx.run_dir), "--model", kind,
               "--regime", regime.name, "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    log = f"{regime.path(f'{FOLDER}/{kind}')}/torchrun.log"
    atomic_write_text(ch.path(log), "$ " + " ".join(command) + "\n" + done.stdout + done.stderr)
    ch.record_output(log)
    if done.returncode != 0:
        raise RuntimeError(f"training the {kind} model ({regime.name}) under torchrun with {processes} "
                           f"processes failed (exit {done.returncode}); the log is {ch.path(log)}:\n"
                           + done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_chapter(ctx: RunContext, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) both models of every regime, write their records and ``training/training.json``."""
    import matplotlib.pyplot as plt

    from ..split import load_frozen

    ch = Chapter(ctx.run_dir, FOLDER)
    frozen = load_frozen(ch)
    items = regimes.of_run(ctx)
    trained = {r.name: train_regime(ctx, ch, frozen, r, progress) for r in items}
    shipped = regimes.shipped(items)
    models = trained[shipped.name]["models"]
    fig = plot_history(load_histories(ctx.run_dir, items))
    ch.save_figure(fig, f"{FOLDER}/history.png", dpi=110)
    plt.close(fig)
    states = {m["checkpoint_sha256"] for entry in trained.values() for m in entry["models"].values()}
    accesses = locked_test.read_accesses(ctx.run_dir)
    per_regime = {f"{name}_{k}_test_macro_f1": m["test_macro_f1"] for name, entry in trained.items()
                  for k, m in entry["models"].items()} if len(items) > 1 else {}
    return ch.finish(
        figures={"history": f"{FOLDER}/history.png",
                 **{f"{k}_val_macro_f1": m["val_macro_f1"] for k, m in models.items()},
                 **{f"{k}_test_macro_f1": m["test_macro_f1"] for k, m in models.items()}, **per_regime},
        models=models,
        shipped_regime=shipped.name,
        regimes=trained,
        attribution_penalty=penalty_decision(ctx, ch, frozen, trained),
        selection="best epoch on validation macro-F1 (scikit-learn, classes with val rows); "
                  "raw or EMA weights, whichever scores higher",
        test_access=accesses[accesses["model_state"].isin(states)].to_dict("records"),
        splits={name: len(frozen.rows_for(name)) for name in ("train", "val", "test")},
        field_train_splits=field_train_counts(frozen) if any(r.uses_field_train for r in items) else None,
    )


def field_train_counts(frozen: Any) -> dict[str, Any]:
    """The labelled field photos a field-adapted regime trained (``train``) and was selected (``val``) on,
    in all and per class: the k of the card and of the learning curve."""
    out: dict[str, Any] = {}
    for name in ("train", "val"):
        rows = frozen.rows_for(name, field_train=True)
        field = rows[rows["source"] == FIELD_TRAIN]
        out[name] = len(field)
        counts = field["class_name"].value_counts().sort_index()
        out[f"{name}_per_class"] = {c: int(n) for c, n in counts.items()}
    return out


def penalty_decision(ctx: RunContext, ch: Chapter, frozen: Any, trained: dict[str, Any]) -> dict[str, Any]:
    """Whether the off-leaf attribution penalty runs, decided from its cost measured on this machine:
    a plain and a penalised step of the background-robust compact model on one batch of train photos
    with their leaf masks (:mod:`.regimes.attribution_penalty`)."""
    import numpy as np
    import torch

    from ..core import imaging
    from ..nets.models import create_model
    from .regimes import attribution_penalty as penalty
    from .regimes import robust_inputs as ri

    section = ctx.section("training").get("attribution_penalty") or {}
    robust = trained.get(BACKGROUND_ROBUST)
    if robust is None:
        return penalty.decide(section, None, None)
    config = resolve_config(ctx.section("training"), "compact")
    regime = regime_named(ctx, BACKGROUND_ROBUST)
    state = ckpt.load(model_dir(ctx.run_dir, "compact", regime) / "best.pt")
    model = create_model(state["arch"], int(state["num_classes"]))
    model.load_state_dict(state["model"])
    spec = ImageSpec.from_section(ctx.section("image"))
    rows = frozen.rows_for("train")
    with np.load(ch.verify(ri.MASKS)) as cached:
        side, packed = int(cached["side"]), cached["packed"]
    take = np.random.default_rng(int(config["seed"])).permutation(len(rows))[: int(config["batch_size"])]
    root = Path(ctx.corpus_root)
    images = torch.stack([imaging.to_tensor(imaging.load_array(root / rows.iloc[i]["rel_path"], spec.size),
                                            spec.mean, spec.std) for i in take])
    masks = torch.as_tensor(np.stack([np.unpackbits(packed[i])[: side * side].reshape(side, side)
                                      for i in take]))
    labels = torch.tensor(rows.iloc[take]["label"].to_numpy(), dtype=torch.long)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(config.get("threads") or threads)))
    try:
        cost = penalty.measure_cost(model, images, labels, masks, float(section.get("weight", 1.0)))
    finally:
        torch.set_num_threads(threads)
    seconds = sum(float(m["train_seconds"] or 0.0) for m in robust["models"].values())
    return penalty.decide(section, cost, seconds)


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cropcop_utils.training",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, help="run folder made by the earlier chapters")
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--regime", default=None, help="the regime to train (default: the shipped one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    ctx = reopen_run(args.run_dir)
    summary = train_model(ctx, args.model, progress=not args.no_progress,
                          regime=regime_named(ctx, args.regime))
    if int(os.environ.get("RANK", "0")) == 0:  # the last line: the summary the chapter reads back
        print(json.dumps(summary, default=str))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:  # pragma: no cover - torch always ships it
        pass
    return 0
