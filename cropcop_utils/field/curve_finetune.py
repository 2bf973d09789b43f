"""The learning curve's fine-tuned learner: the compact recipe on lab train + k field photos per class.

Each point trains the compact model as chapter 5 does (``training.compact``: architecture, packaged ImageNet
weights, epochs, learning rate, augmentation, EMA; ``field_curve.finetune.overrides`` on top) with the
:mod:`cropcop_utils.training` trainer, on the lab train rows plus draw 0 of k field-train train rows per
class (:func:`.curve.draw_field_rows`), selected on lab val + field val.  Distillation is switched off:
the run's reference learned from lab photos only, and a teacher that fails in the field would pull the
student back towards the lab.  Checkpoints live in ``field/curve/finetune_k<k>/`` (a rerun resumes or
reuses a finished one, as chapter 5 does).  The best checkpoint is scored on the field cohort and, through
the locked-test door, on the lab test rows.

A point that chapter 5 has already trained is read, not trained again: a k that draws every field-train
photo, when the run's field-adapted compact model was trained with this recipe on those rows (the checkpoint's
recorded configuration and split fingerprints say so), and k = 0 from the baseline compact model when
``reuse_baseline_at_zero`` asks.  Such a point's scores come from chapter 5's lab test predictions and
chapter 10's predictions of the cohort.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.config import RunContext, deep_merge
from ..core.evidence import Chapter, sha256_file, sha256_json
from ..core.imaging import ImageSpec
from .curve_draws import FINETUNE, curve_row, draw_field_rows, per_class_counts, scored, scored_cohort

FOLDER = "field/curve"
NO_DISTILL = ("off: the run's reference learned from lab photos only; a teacher that fails in the field "
              "would pull the student back towards the lab")


class CurveFinetuneError(ValueError):
    """``field_curve.finetune.overrides`` names a key the training configuration does not have."""


def curve_config(training: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The compact model's resolved configuration with the curve's overrides and no distillation."""
    from ..training.settings import DEFAULTS, resolve_config

    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise CurveFinetuneError(f"field_curve.finetune.overrides: unknown training key(s) {unknown}; known: "
                                 f"{sorted(DEFAULTS)}")
    config = deep_merge(resolve_config(training, "compact"), overrides)
    config["distill"] = {**config["distill"], "enabled": False}
    return config


def train_point(job_args: dict[str, Any], config: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Train (or resume, or find finished) one point; returns (best checkpoint, trainer summary)."""
    from ..training.job import Job
    from ..training.trainer import Trainer

    job = Job(kind="compact", config=config, **job_args)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    summary = Trainer(job).fit()
    return job.out_dir / "best.pt", summary


def load_model(path: Path) -> Any:
    from ..core import checkpoint as ckpt
    from ..nets.models import create_model, for_inference

    state = ckpt.load(path)
    model = create_model(state["arch"], int(state["num_classes"]))
    model.load_state_dict(state["model"])
    return for_inference(model)


def predictions(model: Any, rows: pd.DataFrame, root: Any, spec: ImageSpec, batch: int,
                sha: str) -> pd.DataFrame:
    from ..nets.predict import PredictConfig, predict

    # every point of the curve scores the same rows: decoded once (the process-wide SquareCache)
    cfg = PredictConfig(corpus_root=Path(root), spec=spec, batch_size=batch, cache=True)
    return predict(model, rows, cfg, sha, desc="curve: predict")


def finetune_points(sets: dict[str, pd.DataFrame], roots: dict[str, Any], class_names: list[str],
                    params: dict[str, Any], config: dict[str, Any], spec: ImageSpec, out_root: Path,
                    read_test: Callable[[str], pd.DataFrame], progress: bool = False
                    ) -> list[dict[str, Any]]:
    """One trained point per k of ``finetune.k``.  ``sets``: ``lab_train``, ``field_pool``, ``val`` (lab val +
    field val) and ``cohort``; ``roots``: ``train`` (what :func:`row_paths` reads the training and
    validation rows with), ``cohort`` and ``test``."""
    lab, pool, cohort = sets["lab_train"], sets["field_pool"], sets["cohort"]
    batch = int(config["eval_batch_size"])
    rows = []
    for k in params["finetune"]["k"]:
        drawn = draw_field_rows(pool, k, int(params["seed"]), 0)
        train = pd.concat([lab, drawn], ignore_index=True)
        fingerprints = {"train_rows": sha256_json(sorted(train["row_id"].astype(str))),
                        "val_rows": sha256_json(sorted(sets["val"]["row_id"].astype(str)))}
        tick = time.perf_counter()
        best, summary = train_point(
            {"spec": spec, "corpus_root": roots["train"], "train_rows": train, "val_rows": sets["val"],
             "class_names": list(class_names), "data_fingerprints": fingerprints,
             "out_dir": out_root / f"finetune_k{k}", "progress": progress}, config)
        sha = sha256_file(best)
        model = load_model(best)
        field = predictions(model, cohort, roots["cohort"], spec, batch, sha)
        test = predictions(model, read_test(sha), roots["test"], spec, batch, sha)
        rows.append(curve_row(
            FINETUNE, k, 0, per_class_counts(drawn, class_names), len(lab),
            scored_cohort(cohort, field["pred"].to_numpy(), class_names, params),
            scored(test["label"].to_numpy(), test["pred"].to_numpy(), class_names, params), sha,
            float(summary.get("wall_seconds") or time.perf_counter() - tick),
            f"{summary['epoch']} epoch(s), {summary['global_step']} steps, "
            f"{summary['train_seconds']:.0f} s of training steps"))
    return rows


def recorded_point(ctx: RunContext, ch: Chapter, regime: Any, cohort: pd.DataFrame, class_names: list[str],
                   params: dict[str, Any], k: int, counts: dict[str, int], n_lab: int,
                   note: str) -> dict[str, Any] | None:
    """The point of a compact model chapter 5 trained for ``regime``, read from what the chain recorded:
    its best checkpoint, chapter 5's lab test predictions (no new test read) and chapter 10's predictions
    of the same cohort.  None when any is missing or belongs to another model state."""
    from ..training.settings import model_dir

    best = model_dir(ctx.run_dir, "compact", regime) / "best.pt"
    test_rel = regime.path("training/compact/predictions_test.parquet")
    field_rel = regime.path("field/predictions_compact.parquet")
    if not (best.exists() and ch.path(test_rel).exists() and ch.path(field_rel).exists()):
        return None
    sha = sha256_file(best)
    test, field = ch.read_parquet(test_rel), ch.read_parquet(field_rel)
    if (test["model_state"] != sha).any() or (field["model_state"] != sha).any():
        return None
    if len(field) != len(cohort) or set(field["row_id"]) != set(cohort["row_id"]):
        return None
    ch.inputs[str(best.relative_to(ctx.run_dir))] = sha
    pred = field.set_index("row_id").loc[cohort["row_id"], "pred"].to_numpy()
    return curve_row(FINETUNE, k, 0, counts, n_lab, scored_cohort(cohort, pred, class_names, params),
                     scored(test["label"].to_numpy(), test["pred"].to_numpy(), class_names, params),
                     sha, None, note)


def baseline_at_zero(ctx: RunContext, ch: Chapter, cohort: pd.DataFrame, class_names: list[str],
                     params: dict[str, Any], n_lab: int) -> dict[str, Any] | None:
    """k = 0 from the run's baseline compact model, when the run trains the baseline regime.  None
    without one."""
    from ..training import regimes

    found = [r for r in regimes.of_run(ctx) if r.name == regimes.BASELINE]
    if not found:
        return None
    return recorded_point(ctx, ch, found[0], cohort, class_names, params, 0, dict.fromkeys(class_names, 0),
                          n_lab, "reused: the run's baseline compact model (chapter 5's recipe: distilled "
                                 "from the reference, selected on lab val only)")


def same_training(best: Path, job_args: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether the checkpoint ``best`` was trained as a point of ``job_args`` and ``config`` would be: the
    same weight-determining configuration (:meth:`Job.fingerprinted_config`, the regime's own label
    aside), the same number of training and validation rows, and the same split files
    (``job_args["data_fingerprints"]``: chapter 5 records the split's)."""
    from ..core import checkpoint as ckpt
    from ..training.job import Job, resolve_amp, resolve_device

    job = Job(kind="compact", config=config, **job_args)
    device = resolve_device(config, job.env)
    wanted = job.fingerprinted_config(device.type, resolve_amp(config, device))
    state = ckpt.load(best)
    trained = {key: value for key, value in dict(state.get("config") or {}).items() if key != "regime"}
    return trained == wanted and state.get("data_fingerprints") == job_args["data_fingerprints"]


def adapted_points(ctx: RunContext, ch: Chapter, sets: dict[str, pd.DataFrame], class_names: list[str],
                   params: dict[str, Any], config: dict[str, Any], spec: ImageSpec,
                   split_fingerprints: dict[str, str]) -> list[dict[str, Any]]:
    """The points whose draw is every field-train photo, read from the run's field-adapted compact model
    when chapter 5 trained it with the curve's recipe on the same rows (lab train + the whole field-train
    pool, selected on the same lab val + field val): training that model again would repeat chapter 5."""
    from ..training import regimes
    from ..training.settings import model_dir

    found = [r for r in regimes.of_run(ctx) if r.name == regimes.FIELD_ADAPTED]
    lab, pool = sets["lab_train"], sets["field_pool"]
    rows = []
    for k in params["finetune"]["k"]:
        drawn = draw_field_rows(pool, k, int(params["seed"]), 0)
        if not found or not len(pool) or len(drawn) != len(pool):
            continue
        best = model_dir(ctx.run_dir, "compact", found[0]) / "best.pt"
        args = {"spec": spec, "corpus_root": ctx.source_roots, "train_rows": pd.concat([lab, drawn]),
                "val_rows": sets["val"], "class_names": list(class_names),
                "data_fingerprints": split_fingerprints, "out_dir": best.parent}
        if not best.exists() or not same_training(best, args, config):
            continue
        row = recorded_point(ctx, ch, found[0], sets["cohort"], class_names, params, k,
                             per_class_counts(drawn, class_names), len(lab),
                             "reused: the run's field-adapted compact model (chapter 5 trained this recipe "
                             "on the same rows: lab train + every field-train photo)")
        if row is not None:
            rows.append(row)
    return rows


def finetune_curve(ctx: RunContext, ch: Chapter, frozen: Any, pool: pd.DataFrame, cohort: pd.DataFrame,
                   root: Path, params: dict[str, Any], read_test: Callable[[str], pd.DataFrame],
                   progress: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fine-tuned learner's rows of the curve and what the record says about them."""
    from ..core.sources import LAB

    names = frozen.class_names
    spec = ImageSpec.from_section(ctx.section("image"))
    config = curve_config(ctx.section("training"), dict(params["finetune"]["overrides"] or {}))
    train = frozen.rows_for("train", field_train=True)
    sets = {"lab_train": train[train["source"] == LAB], "field_pool": pool,
            "val": frozen.rows_for("val", field_train=True), "cohort": cohort}
    ks = list(params["finetune"]["k"])
    rows: list[dict[str, Any]] = []
    if 0 in ks and params["finetune"]["reuse_baseline_at_zero"]:
        zero = baseline_at_zero(ctx, ch, cohort, names, params, len(sets["lab_train"]))
        rows += [] if zero is None else [zero]
    rows += adapted_points(ctx, ch, sets, names, _with_k(params, [k for k in ks if k not in _ks(rows)]),
                           config, spec, dict(frozen.split_json["fingerprints"]))
    roots = {"train": ctx.source_roots, "cohort": root, "test": ctx.corpus_root}
    rows += finetune_points(sets, roots, names, _with_k(params, [k for k in ks if k not in _ks(rows)]),
                            config, spec, ch.path(FOLDER), read_test, progress)
    rows.sort(key=lambda row: ks.index(row["k"]))
    reused = {row["k"]: row["note"] for row in rows if row["note"].startswith("reused")}
    for row in rows:
        if row["k"] not in reused:
            for name in ("best.pt", "history.parquet"):
                ch.record_output(f"{FOLDER}/finetune_k{row['k']}/{name}")
    return rows, {
        "enabled": True, "k": list(params["finetune"]["k"]),
        "k_zero": "reused the run's baseline compact model" if 0 in reused else "trained",
        "reused": {str(k): note for k, note in reused.items()},
        "recipe": {key: config[key] for key in ("arch", "weights", "epochs", "frozen_groups", "batch_size",
                                                "lr", "weight_decay", "warmup_epochs", "label_smoothing",
                                                "ema", "augment", "imbalance")},
        "overrides": dict(params["finetune"]["overrides"] or {}),
        "distillation": NO_DISTILL,
        "selection": "best epoch on lab val + field val macro-F1 (chapter 5's rule)",
        "val_rows": len(sets["val"]), "draw": 0,
        "weights": _weights(config),
    }


def _ks(rows: list[dict[str, Any]]) -> set[int]:
    return {row["k"] for row in rows}


def _with_k(params: dict[str, Any], ks: list[int]) -> dict[str, Any]:
    return {**params, "finetune": {**params["finetune"], "k": ks}}


def _weights(config: dict[str, Any]) -> dict[str, Any] | None:
    from ..nets.pretrained import PACKAGE_WEIGHTS, locate

    if config.get("weights") == PACKAGE_WEIGHTS:
        return locate(config["arch"]).as_dict()
    return None if config.get("weights") is None else {"file": config["weights"]}
