"""Chapter 5: training the reference and the compact model, with every hyper-parameter on record.

``run_chapter`` trains the reference, then the compact model with the reference's best checkpoint as
teacher (unless the profile switches distillation off), resuming either from its ``last.pt`` when one
exists; then it scores each model's best checkpoint on the validation rows and, once per model state,
on the locked test rows (``locked_test``), and writes ``training/training.json``.

The same training runs from the command line, on one process or under ``torchrun``::

    python -m cropcop_utils.train --run-dir runs/default --model reference
    torchrun --nproc_per_node=2 -m cropcop_utils.train --run-dir runs/default --model compact
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from . import checkpoint as ckpt
from . import locked_test, regimes
from .config import RunContext, deep_merge, reopen_run
from .evidence import Chapter, sha256_file
from .imaging import ImageSpec
from .pretrained import PACKAGE_WEIGHTS, has_package_weights
from .regimes import BACKGROUND_ROBUST, BASELINE, Regime

MODELS = ("reference", "compact")
FOLDER = "training"

# Every key a profile's ``training`` section may set; per-model sections override the shared ones.
DEFAULTS: dict[str, Any] = {
    "arch": None,               # timm architecture
    "pretrained_tag": None,     # timm pretrained config the weights file follows (e.g. dinov3_lvd1689m)
    "epochs": 1,
    "batch_size": 32,
    "lr": 1e-3,                 # peak AdamW learning rate
    "weight_decay": 0.05,
    "layer_decay": None,        # timm layer-wise lr decay (fine-tuning), None = off
    "warmup_epochs": 1.0,       # linear warm-up, then cosine decay to min_lr (timm CosineLRScheduler)
    "min_lr": 1e-6,
    "label_smoothing": 0.0,
    "drop_path_rate": 0.0,
    "drop_rate": 0.0,
    "head_init_std": 0.01,      # re-initialise the K-way head (None = timm's initialisation)
    "grad_clip": None,          # max gradient norm, None = off
    "ema": {"enabled": True, "decay": 0.999, "warmup": True},  # timm ModelEmaV3
    "raw_eval": "final",        # with an EMA: score the raw weights at the last epoch only (or: every)
    "imbalance": "none",        # none | sampler (class-balanced sampling) | loss (class-weighted loss)
    "augment": {},              # augment.AugmentParams overrides
    "distill": {"enabled": False, "temperature": 4.0, "alpha": 0.5},
    "amp": "auto",              # auto (bf16 on CUDA, off on CPU) | bf16 | fp16 | off
    "channels_last": True,
    "checkpoint_every": 50,     # optimiser steps between mid-epoch checkpoints (0 = epoch ends only)
    "seed": 0,
    "device": "auto",
    "threads": 0,               # torch intra-op threads (0 = leave torch's default)
    "workers": 0,               # DataLoader worker processes
    "cache_images": True,       # keep decoded squares in memory
    "eval_batch_size": 128,
}
# Keys of the training section that are not model hyper-parameters: the per-model sections, their
# weights, and the regimes (cropcop_utils.regimes, .backgrounds).
_SECTION_ONLY = {"reference", "compact", "reference_weights", "compact_weights", "regime", "shipped_regime",
                 "background_robust", "attribution_penalty"}


class TrainingConfigError(ValueError):
    """The profile's ``training`` section has an unknown key or an impossible value."""


class TrainingOrderError(RuntimeError):
    """The compact model needs the finished reference as its teacher."""


# --------------------------------------------------------------------------- configuration
def resolve_config(section: dict[str, Any], kind: str) -> dict[str, Any]:
    """The full configuration of one model: defaults < shared keys < the model's own section."""
    if kind not in MODELS:
        raise TrainingConfigError(f"unknown model {kind!r}; choose one of {MODELS}")
    shared = {k: v for k, v in section.items() if k not in _SECTION_ONLY}
    own = dict(section.get(kind) or {})
    for where, part in (("training", shared), (f"training.{kind}", own)):
        unknown = sorted(set(part) - set(DEFAULTS))
        if unknown:
            raise TrainingConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    config = deep_merge(deep_merge(DEFAULTS, shared), own)
    weights = section.get(f"{kind}_weights")
    if weights == PACKAGE_WEIGHTS:
        if not has_package_weights(config["arch"]):
            raise TrainingConfigError(f"training.{kind}_weights: package: no packaged ImageNet weights for "
                                      f"{config['arch']!r}; give a weights file or null")
        config["weights"] = PACKAGE_WEIGHTS
    else:
        config["weights"] = str(Path(weights).expanduser().resolve()) if weights else None
    if not config["arch"]:
        raise TrainingConfigError(f"training.{kind}.arch is not set (a timm architecture name)")
    if kind == "reference" and config["distill"].get("enabled"):
        raise TrainingConfigError("training.reference.distill: the reference has no teacher; disable it")
    if config["raw_eval"] not in ("final", "every"):
        raise TrainingConfigError(f"training.raw_eval must be final or every, got {config['raw_eval']!r}")
    if config["imbalance"] not in ("none", "sampler", "loss"):
        raise TrainingConfigError(f"training.imbalance must be none, sampler or loss, "
                                  f"got {config['imbalance']!r}")
    for key in ("epochs", "batch_size", "eval_batch_size"):
        if int(config[key]) < 1:
            raise TrainingConfigError(f"training.{kind}.{key} must be >= 1, got {config[key]}")
    return config


def model_dir(run_dir: str | os.PathLike, kind: str, regime: Regime | None = None) -> Path:
    """``training/<kind>`` of the shipped regime (the default), ``training/<regime>/<kind>`` of another."""
    return Path(run_dir) / (regime or Regime(BASELINE, True)).path(f"{FOLDER}/{kind}")


def regime_named(ctx: RunContext, name: str | None) -> Regime:
    """A regime of the run by name (None: the shipped one)."""
    items = regimes.of_run(ctx)
    if name is None:
        return regimes.shipped(items)
    found = [r for r in items if r.name == name]
    if not found:
        raise TrainingConfigError(f"regime {name!r} is not trained by this run; training.regime lists "
                                  f"{[r.name for r in items]}")
    return found[0]


def robust_inputs(ctx: RunContext, frozen: Any, config: dict[str, Any],
                  progress: bool = False) -> Any:
    """The background-robust regime's masks, pool and paste step (made once, then reused)."""
    from .data import SquareCache, row_paths
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
    from .distributed import DistEnv, init_distributed
    from .split import load_frozen
    from .trainer import Job, Trainer

    regime = regime or regime_named(ctx, None)
    config = resolve_config(ctx.section("training"), kind)
    if frozen is None:
        frozen = load_frozen(Chapter(ctx.run_dir, FOLDER))
    paste = None
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
              corpus_root=Path(ctx.corpus_root), train_rows=frozen.rows_for("train"),
              val_rows=frozen.rows_for("val"), class_names=list(frozen.class_names),
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

    from .models import create_model
    from .predict import PredictConfig, predict, same_state, score

    folder = (regime or Regime(BASELINE, True)).path(f"{FOLDER}/{kind}")
    best_path = ch.path(f"{folder}/best.pt")
    state = ckpt.load(best_path)
    sha = sha256_file(best_path)
    device = "cuda" if config["device"] in ("auto", "cuda") and _cuda() else "cpu"
    model = create_model(state["arch"], int(state["num_classes"]))
    model.load_state_dict(state["model"])
    model.to(device)
    cfg = PredictConfig.from_ctx(ctx, batch_size=int(config["eval_batch_size"]),
                                 workers=int(config["workers"]), device=device, progress=progress)
    # val: the trainer's decoded squares of the same files, when it ran in this process (data.SquareCache)
    val = predict(model, frozen.rows_for("val"), replace(cfg, cache=True), sha, desc=f"{kind}: val")
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
    return {"state": state, "sha256": sha, "val": score(val), "test": score(test)}


def model_record(summary: dict[str, Any], scored: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The figures of one model in ``training.json``."""
    state = scored["state"]
    distill = config["distill"] if summary["kind"] == "compact" and config["distill"]["enabled"] else None
    return {
        "arch": state["arch"], "params": int(state["params"]), "num_classes": int(state["num_classes"]),
        "image_size": int(state["image_size"]), "pretrained": state["pretrained"],
        "teacher": None if distill is None else {"checkpoint_sha256": state["teacher_sha256"],
                                                  "temperature": distill["temperature"],
                                                  "alpha": distill["alpha"]},
        "hyperparameters": config, "config_fingerprint": summary["config_fingerprint"],
        "best_epoch": int(state["epoch"]), "best_weights": state["weights"],
        "val_macro_f1": float(state["val_macro_f1"]), "val_acc": float(state["val_acc"]),
        "val_records": scored["val"], "test_acc": scored["test"]["accuracy"],
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
        config = resolve_config(ctx.section("training"), kind)
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


def run_chapter(ctx: RunContext, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) both models of every regime, write their records and ``training/training.json``."""
    import matplotlib.pyplot as plt

    from .split import load_frozen

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
    )


def penalty_decision(ctx: RunContext, ch: Chapter, frozen: Any, trained: dict[str, Any]) -> dict[str, Any]:
    """Whether the off-leaf attribution penalty runs, decided from its cost measured on this machine:
    a plain and a penalised step of the background-robust compact model on one batch of train photos
    with their leaf masks (:mod:`.regimes.attribution_penalty`)."""
    import numpy as np
    import torch

    from . import imaging
    from .models import create_model
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


# --------------------------------------------------------------------------- book helpers
def load_histories(run_dir: str | os.PathLike, items: list[Regime] | None = None) -> dict[str, pd.DataFrame]:
    """History per model; with several regimes the key names the regime too (``baseline compact``)."""
    items = items or [Regime(BASELINE, True)]
    out = {}
    for regime in items:
        for kind in MODELS:
            path = model_dir(run_dir, kind, regime) / "history.parquet"
            if path.exists():
                out[kind if len(items) == 1 else f"{regime.name} {kind}"] = pd.read_parquet(path)
    return out


def plot_history(histories: dict[str, pd.DataFrame]) -> Any:
    """Training loss, validation accuracy and validation macro-F1 per epoch, one line per model."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    panels = (("train_loss", "training loss (compact: with distillation)"),
              ("val_acc", "validation accuracy"), ("val_macro_f1", "validation macro-F1"))
    for kind, frame in histories.items():
        for ax, (column, title) in zip(axes, panels, strict=True):
            line, = ax.plot(frame["epoch"], frame[column], marker="o", label=kind)
            ema = f"{column}_ema"
            if ema in frame and frame[ema].notna().any():
                ax.plot(frame["epoch"], frame[ema], linestyle="--", color=line.get_color(),
                        label=f"{kind} (EMA)")
            best = frame[frame["best"]]
            if column != "train_loss" and len(best):
                ax.scatter(best["epoch"].iloc[-1:], best[f"selected_{column.split('_', 1)[1]}"].iloc[-1:],
                           s=120, facecolors="none", edgecolors=line.get_color(), zorder=3)
            ax.set_title(title)
            ax.set_xlabel("epoch")
    axes[1].set_ylim(0, 1.02)
    axes[2].set_ylim(0, 1.02)
    axes[2].legend(fontsize=7, loc="lower right")
    fig.suptitle("Training history (circle: the selected checkpoint)")
    fig.tight_layout()
    return fig


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return flat


def hyperparameter_table(record: dict[str, Any]) -> pd.DataFrame:
    """Every hyper-parameter of both models side by side (flattened keys)."""
    columns = {kind: _flatten(m["hyperparameters"]) for kind, m in record["models"].items()}
    frame = pd.DataFrame(columns).rename_axis("hyper-parameter").reset_index()
    return frame.astype({k: "string" for k in columns}).fillna("—")


def results_table(record: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for kind, m in record["models"].items():
        rows.append({"model": kind, "arch": m["arch"], "parameters": m["params"],
                     "started from": "pretrained" if m["pretrained"]["pretrained"] else "scratch",
                     "teacher": "reference" if m["teacher"] else "none", "best epoch": m["best_epoch"],
                     "weights": m["best_weights"], "val accuracy": m["val_acc"],
                     "val macro-F1": m["val_macro_f1"],
                     "test accuracy": m["test_acc"], "test macro-F1": m["test_macro_f1"],
                     "train images/s": m["images_per_s"], "wall seconds": m["wall_seconds"]})
    return pd.DataFrame(rows)


def describe_models(record: dict[str, Any]) -> str:
    """Plain sentences: what each model is and which weights it started from."""
    lines = []
    for kind, m in record["models"].items():
        start = m["pretrained"]["description"]
        teacher = (f" It learned from the reference's best checkpoint (SHA-256 "
                   f"`{m['teacher']['checkpoint_sha256'][:12]}…`) by knowledge distillation at temperature "
                   f"T = {m['teacher']['temperature']} with weight α = {m['teacher']['alpha']} on the "
                   "T²-scaled KL term." if m["teacher"] else
                   (" It was trained on the labels alone, without a teacher." if kind == "compact" else ""))
        sha = m["pretrained"].get("sha256")
        lines.append(f"- **{kind}**: `{m['arch']}` with a {m['num_classes']}-way head, "
                     f"{m['params']:,} parameters, {m['image_size']}×{m['image_size']} inputs; "
                     f"started from {start}{f' (SHA-256 `{sha}`)' if sha else ''}.{teacher}")
    return "\n".join(lines)


def describe_starts(record: dict[str, Any]) -> str:
    """One sentence on which models started from pretrained weights and which from scratch."""
    tuned = [k for k, m in record["models"].items() if m["pretrained"]["pretrained"]]
    scratch = [k for k in record["models"] if k not in tuned]
    if not tuned:
        return ("No pretrained weights were used, so **both models were trained from scratch**; their "
                "numbers say what these architectures learn from this corpus alone, not what a "
                "pretrained model reaches.")
    text = f"**Fine-tuned from pretrained weights:** {', '.join(tuned)}."
    if scratch:
        text += f" **Trained from scratch:** {', '.join(scratch)}."
    return text


def regime_table(record: dict[str, Any]) -> pd.DataFrame:
    """Both models of every regime: validation and test macro-F1, wall time, where the files are."""
    rows = []
    for name, entry in (record.get("regimes") or {}).items():
        for kind, m in entry["models"].items():
            rows.append({"regime": name, "shipped": entry["shipped"], "model": kind,
                         "folder": entry["folder"], "val macro-F1": m["val_macro_f1"],
                         "test macro-F1": m["test_macro_f1"],
                         "test accuracy": m["test_acc"], "wall seconds": m["wall_seconds"],
                         "checkpoint SHA-256": m["checkpoint_sha256"][:12]})
    return pd.DataFrame(rows)


def describe_regimes(record: dict[str, Any]) -> str:
    """Which regimes ran, which ships, and what the background-robust regime pasted on (from the record)."""
    entries = record.get("regimes") or {}
    names = ", ".join(f"`{n}`" for n in entries) or "`baseline`"
    text = [f"Regimes trained: {names}; the shipped regime is **`{record.get('shipped_regime', BASELINE)}`** "
            "(its files are on the chain's plain paths; the other regimes' files one folder deeper)."]
    robust = (entries.get(BACKGROUND_ROBUST) or {}).get("background")
    if robust:
        pool, masks, p = robust["pool"], robust["masks"], robust["params"]
        kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in pool["per_kind"].items())
        text.append(
            f"The background-robust regime cut each train leaf out with its mask ({masks['usable']:,} of "
            f"{masks['rows']:,} train photos have a usable mask; mean leaf share "
            f"{masks['mean_leaf_share']:.2f}; masks SHA-256 `{masks['sha256'][:12]}…`) and pasted it, on "
            f"{p['paste_p']:.0%} of samples, on one of {pool['n']} backgrounds ({kinds}; pool SHA-256 "
            f"`{pool['sha256'][:12]}…`), the leaf scaled to {p['leaf_scale'][0]:g}–{p['leaf_scale'][1]:g} of "
            f"its lab size, then changed light ({p['light'][0]:g}–{p['light'][1]:g}), white balance "
            f"(±{p['white_balance']:g} per channel), gamma and focus on {p['photometric_p']:.0%} of pasted "
            f"samples. Pool sources: {pool['sources']}.")
    return "\n\n".join(text)


def describe_penalty(record: dict[str, Any]) -> str:
    """One sentence on the attribution penalty: whether it ran and why, from its measured cost."""
    decision = record.get("attribution_penalty") or {}
    if not decision:
        return "The off-leaf attribution penalty was not considered in this run."
    status = "ran" if decision.get("ran") else "was **not run**"
    cost = decision.get("cost") or {}
    timing = (f" (plain step {cost['plain_step_s']:.2f} s, penalised step {cost['penalised_step_s']:.2f} s)"
              if cost.get("plain_step_s") else "")
    return f"The off-leaf attribution penalty {status}: {decision['reason']}{timing}."


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cropcop_utils.train", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, help="run folder made by the earlier chapters")
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    ctx = reopen_run(args.run_dir)
    summary = train_model(ctx, args.model, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, default=str))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:  # pragma: no cover - torch always ships it
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
