"""Feature records: the pooled features a program's second output gives (:class:`~.pte.FeatureRecorder`),
one row per image, beside the prediction record of the same pass.

A features record has ``row_id``, ``features`` (float32 list) and ``model_state`` (the program's SHA-256);
chapter 7 writes the locked test's (``runtime/features_test.parquet``), chapter 11 the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from .pte import FeatureRecorder, PteForward


def features_frame(row_ids: Any, matrix: torch.Tensor | np.ndarray, model_state: str) -> pd.DataFrame:
    matrix = np.asarray(matrix, dtype=np.float32)
    return pd.DataFrame({"row_id": list(row_ids), "features": list(matrix), "model_state": model_state})


def features_matrix(frame: pd.DataFrame, row_ids: Any | None = None) -> np.ndarray:
    """The record's features (rows × dim, float32), in ``row_ids`` order when given."""
    if row_ids is not None:
        indexed = frame.set_index("row_id")
        missing = set(row_ids) - set(indexed.index)
        if missing:
            raise KeyError(f"the features record lacks {len(missing)} of the rows asked for")
        frame = indexed.loc[list(row_ids)].reset_index()
    if not len(frame):
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack(frame["features"].to_numpy()).astype(np.float32)


def predict_with_features(forward: PteForward, rows: pd.DataFrame, cfg: Any, model_state: str,
                          desc: str = "predict") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(prediction record, features record) of ``rows`` from one pass of the program."""
    from .predict import predict

    recorder = FeatureRecorder(forward)
    record = predict(recorder, rows, cfg, model_state, desc=desc)
    return record, features_frame(rows["row_id"], recorder.matrix(), model_state)
