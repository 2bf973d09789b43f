"""The training configuration: every hyper-parameter's default, one model's resolved settings, where it lives.

A profile's ``training`` section is resolved per model (defaults < shared keys < the model's own section)
by :func:`resolve_config`; :func:`model_dir` and :func:`regime_named` say which folder and which regime a
model belongs to.  Kept apart from the chapter because the benches, the report helpers and the tests read
the same settings without training anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.config import RunContext, deep_merge
from ..nets.pretrained import PACKAGE_WEIGHTS, has_package_weights
from . import regimes
from .regimes import BASELINE, FIELD_ADAPTED, Regime

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
    "frozen_groups": 0,         # timm coarse layer groups (stem first, then stages) kept at their pretrained
                                # weights and batch-norm statistics (nets.models.freeze_leading_groups)
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
    "processes": 1,             # training processes: > 1 runs each model under torchrun (DDP; one per GPU)
    "cache_images": True,       # keep decoded squares in memory
    "low_res": None,            # {px, epochs}: the first `epochs` epochs train on the batch resized to `px`
                                # (antialiased), the rest at the image size; validation always at the size
    "eval_batch_size": 128,
}
# Keys of the training section that are not model hyper-parameters: the per-model sections, their
# weights, and the regimes (.regimes, .regimes.backgrounds).
_SECTION_ONLY = {"reference", "compact", "reference_weights", "compact_weights", "regime", "shipped_regime",
                 "background_robust", "attribution_penalty", FIELD_ADAPTED}
# Regimes whose section overrides the models' hyper-parameters (shared keys, then ``reference:`` /
# ``compact:``): field adaptation trains on ~3x the rows of another kind of photo, so its epochs and
# augmentation are chosen on its own validation.
OVERRIDING_REGIMES = (FIELD_ADAPTED,)


class TrainingConfigError(ValueError):
    """The profile's ``training`` section has an unknown key or an impossible value."""


# --------------------------------------------------------------------------- configuration
def resolve_config(section: dict[str, Any], kind: str, regime: str | None = None) -> dict[str, Any]:
    """The full configuration of one model: defaults < shared keys < the model's own section, then, for
    a regime of :data:`OVERRIDING_REGIMES`, < the regime's shared keys < the regime's model section."""
    if kind not in MODELS:
        raise TrainingConfigError(f"unknown model {kind!r}; choose one of {MODELS}")
    shared = {k: v for k, v in section.items() if k not in _SECTION_ONLY}
    own = dict(section.get(kind) or {})
    parts = [("training", shared), (f"training.{kind}", own)]
    if regime in OVERRIDING_REGIMES:
        overrides = dict(section.get(regime) or {})
        parts += [(f"training.{regime}", {k: v for k, v in overrides.items() if k not in MODELS}),
                  (f"training.{regime}.{kind}", dict(overrides.get(kind) or {}))]
    config = dict(DEFAULTS)
    for where, part in parts:
        unknown = sorted(set(part) - set(DEFAULTS))
        if unknown:
            raise TrainingConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
        config = deep_merge(config, part)
    weights = section.get(f"{kind}_weights")
    if weights == PACKAGE_WEIGHTS:
        if not has_package_weights(config["arch"]):
            raise TrainingConfigError(f"training.{kind}_weights: package: no packaged ImageNet weights for "
                                      f"{config['arch']!r}; give a weights file or null")
        config["weights"] = PACKAGE_WEIGHTS
    else:
        config["weights"] = str(Path(weights).expanduser().resolve()) if weights else None
    frozen = int(config["frozen_groups"])
    if frozen < 0:
        raise TrainingConfigError(f"training.{kind}.frozen_groups must be >= 0, got {frozen}")
    if frozen and config["weights"] is None:
        raise TrainingConfigError(f"training.{kind}.frozen_groups: {frozen} layer groups would stay at their "
                                  "random initialisation (no weights given); set it to 0")
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
    low = config["low_res"]
    if low is not None:
        epochs = int(config["epochs"])
        if set(low) != {"px", "epochs"} or int(low["px"]) < 16 or not 0 < int(low["epochs"]) < epochs:
            raise TrainingConfigError(f"training.{kind}.low_res must be null or {{px: >= 16, epochs: 1 to "
                                      f"{epochs - 1}}} (the last epoch trains at the image size), got {low}")
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
