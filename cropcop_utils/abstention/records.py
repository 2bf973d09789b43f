"""The prediction records chapter 11 reads, and the checks each passes before its logits are used.

Validation records of the float models (chapter 5) and of the selected INT8 graph (chapter 6), the test
records of every model state (chapters 5-7), and the ``.pte``'s validation record, which chapter 11 scores
itself (``abstention/predictions_val_pte.parquet``).  :func:`aligned` returns a record's logits in the
frozen split's row order after checking rows, labels and class count; a record that does not fit raises
:class:`AbstentionInputError`, the error every module of the chapter raises.  Kept apart so that the
other regimes (:mod:`.regimes`) read their records the same way without importing the chapter.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.evidence import Chapter
from ..core.model_states import STATES
from ..nets.predict import logits_matrix

FOLDER = "abstention"


class AbstentionInputError(ValueError):
    """Records that cannot be calibrated or compared (rows, labels or class count do not fit)."""


# --------------------------------------------------------------------------- records
VAL_RECORDS = {"reference": "training/reference/predictions_val.parquet",
               "compact": "training/compact/predictions_val.parquet"}
PTE_VAL = f"{FOLDER}/predictions_val_pte.parquet"
TEST_RECORDS = {s.name: s.path for s in STATES}


def aligned(frame: pd.DataFrame, rows: pd.DataFrame, n_classes: int, path: str) -> tuple[np.ndarray, str]:
    """The record's logits in ``rows`` order (row_id), after checking rows, labels and class count."""
    if frame["row_id"].duplicated().any():
        raise AbstentionInputError(f"{path} lists a row_id twice")
    if frame["model_state"].nunique() > 1:
        raise AbstentionInputError(f"{path} mixes {frame['model_state'].nunique()} model states")
    indexed = frame.set_index("row_id")
    missing = set(rows["row_id"]) - set(indexed.index)
    extra = set(indexed.index) - set(rows["row_id"])
    if missing or extra:
        raise AbstentionInputError(f"{path} does not cover the frozen split's rows: {len(missing)} missing, "
                                   f"{len(extra)} not in that split; rerun the chapter that wrote it")
    indexed = indexed.loc[rows["row_id"]]
    if not np.array_equal(indexed["label"].to_numpy(), rows["label"].to_numpy()):
        raise AbstentionInputError(f"{path} disagrees with split/split.parquet on labels (another class "
                                   "order); rerun the chapter that wrote it")
    logits = logits_matrix(indexed.reset_index())
    if len(logits) and logits.shape[1] != n_classes:
        raise AbstentionInputError(f"{path} has {logits.shape[1]} logits per row, the class map {n_classes}")
    return logits, str(indexed["model_state"].iloc[0]) if len(indexed) else ""


def int8_val_path(ch: Chapter) -> str:
    return f"ptq/predictions_val_{ch.read_json('ptq/ptq.json')['selected']}.parquet"
