"""Chapter 5 — Training: the reference and the distilled compact model, per training regime.

The chapter's code, by topic:

* :mod:`.chapter` — one model trained (or resumed) and scored, the regimes, the attribution-penalty
  decision, ``run_chapter`` and the command line (``python -m cropcop_utils.training``).
* :mod:`.settings` — the ``training`` section's defaults, one model's resolved configuration, its folder.
* :mod:`.report` — the notebook's tables, sentences and history figure from ``training/training.json``.
* :mod:`.job` — what one model's training is given (``Job``) and its device / AMP resolution.
* :mod:`.trainer` — the resumable training loop, one process or several (DDP).
* :mod:`.data` — training images, class-balanced sampling and the seeded epoch batches.
* :mod:`.augment` — the training augmentation.
* :mod:`.regimes` — the training regimes (baseline, background-robust), their inputs, the attribution penalty.
"""

from . import regimes
from .chapter import TrainingOrderError, run_chapter, train_model
from .report import (
    describe_models,
    describe_penalty,
    describe_regimes,
    describe_starts,
    hyperparameter_table,
    load_histories,
    plot_history,
    regime_table,
    results_table,
)
from .settings import DEFAULTS, FOLDER, MODELS, TrainingConfigError, model_dir, resolve_config

__all__ = [
    "DEFAULTS", "FOLDER", "MODELS", "TrainingConfigError", "TrainingOrderError", "describe_models",
    "describe_penalty", "describe_regimes", "describe_starts", "hyperparameter_table", "load_histories",
    "model_dir", "plot_history", "regime_table", "regimes", "resolve_config", "results_table", "run_chapter",
    "train_model",
]
