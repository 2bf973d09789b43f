"""The four model states the analysis compares, and their predictions paired on identical test rows.

Shared by the analysis chapters (:mod:`cropcop_utils.analysis`), their figures
(:mod:`cropcop_utils.analysis.figures`) and the error explorer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class ModelState:
    name: str
    label: str
    path: str
    chapter: str


STATES: tuple[ModelState, ...] = (
    ModelState("reference", "float reference", "training/reference/predictions_test.parquet", "training"),
    ModelState("compact", "float compact", "training/compact/predictions_test.parquet", "training"),
    ModelState("int8", "converted INT8 graph", "ptq/predictions_test.parquet", "ptq"),
    ModelState("pte", ".pte on the runtime", "runtime/predictions_test.parquet", "runtime"),
)
STATE_NAMES = tuple(s.name for s in STATES)


def states_for(regime: Any = None) -> tuple[ModelState, ...]:
    """The four states of a training regime (:mod:`.regimes`): the plain paths for the shipped one."""
    if regime is None or regime.shipped:
        return STATES
    return tuple(ModelState(s.name, s.label, regime.path(s.path), s.chapter) for s in STATES)
STATE_LABELS = {s.name: s.label for s in STATES}
# Each step of the deployment chain, then the whole chain.
PAIRS: tuple[tuple[str, str], ...] = (("reference", "compact"), ("compact", "int8"), ("int8", "pte"),
                                      ("reference", "pte"))
PREDICTION_COLUMNS = ("row_id", "label", "pred", "margin", "model_state")
ERROR_KINDS = ("cross-crop", "healthy→disease", "disease→healthy", "broad↔specific", "within-crop")
TRANSITIONS = ("correct→correct", "correct→wrong", "wrong→correct", "wrong→same wrong", "wrong→other wrong")


@dataclass
class PairedStates:
    """The test rows (row_id order) with every state's prediction; labels proven identical."""

    rows: pd.DataFrame                   # row_id, label, rel_path
    preds: dict[str, np.ndarray]
    margins: dict[str, np.ndarray]
    model_states: dict[str, str]
    n_classes: int

    @property
    def y(self) -> np.ndarray:
        return self.rows["label"].to_numpy()

    def correct(self, state: str) -> np.ndarray:
        return self.preds[state] == self.y
