"""The shipped ``.pte``'s two outputs (logits, features) for every set chapter 11's protection reads.

Training rows (the reference features), validation rows and the fitting outliers (:func:`.protection.jigsaw`
of the validation photos) are scored here through the program; the locked test's outputs are chapter 7's
record of its one pass (``runtime/features_test.parquet`` beside its predictions), so the test is not
read again.  The field cohorts and out-of-scope images are scored here too, and their logits must equal
the records chapters 10 and 11 wrote with the same program (:func:`same_logits`), so both chapters
describe the same decisions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.imaging import ImageSpec
from ..nets.features import features_matrix, predict_with_features
from ..nets.predict import PredictConfig, logits_matrix
from ..nets.pte import FeatureRecorder, PteForward
from .protection import Outputs, jigsaw
from .records import AbstentionInputError

FEATURES_TEST = "runtime/features_test.parquet"


def score(
    forward: PteForward,
    rows: pd.DataFrame,
    roots: Any,
    image_section: dict[str, Any],
    batch_size: int,
    desc: str,
) -> tuple[Outputs, pd.DataFrame]:
    """(outputs, prediction record) of ``rows`` through the program, one pass.  The squares are shared
    (``cache``): the out-of-scope images were decoded when every state scored them (:mod:`.out_of_scope`)."""
    cfg = PredictConfig(
        corpus_root=roots if isinstance(roots, dict) else Path(roots),
        spec=ImageSpec.from_section(image_section),
        batch_size=min(batch_size, forward.max_batch),
        cache=True,
    )
    record, features = predict_with_features(forward, rows, cfg, forward.sha256, desc=desc)
    return Outputs(logits_matrix(record), features_matrix(features), rows["label"].to_numpy()), record


def test_outputs(ch: Any, test_record: pd.DataFrame, test_rows: pd.DataFrame, model_state: str,
                 features_path: str = FEATURES_TEST) -> Outputs:
    """The locked test's outputs from chapter 7's one pass: its record and its features record."""
    if not ch.path(features_path).exists():
        raise AbstentionInputError(
            f"{features_path} is missing: the .pte was lowered before it returned its "
            "features; rerun the chain from chapter 'runtime' (07_runtime)"
        )
    features = ch.read_parquet(features_path)
    if not (features["model_state"] == model_state).all():
        raise AbstentionInputError(
            f"{features_path} was written by another program than the .pte; rerun "
            "chapter 'runtime' (07_runtime)"
        )
    ids = test_rows["row_id"].tolist()
    logits = logits_matrix(test_record.set_index("row_id").loc[ids].reset_index())
    return Outputs(logits, features_matrix(features, ids), test_rows["label"].to_numpy())


def fitting_outputs(
    forward: PteForward,
    rows: pd.DataFrame,
    roots: Any,
    image_section: dict[str, Any],
    batch_size: int,
    tiles: int,
    seed: int,
) -> Outputs:
    """The fitting outliers: every validation photo cut into tiles and shuffled, through the program."""
    from ..ptq.pt2e import image_batches

    recorder = FeatureRecorder(forward)
    generator = torch.Generator().manual_seed(seed)
    logits = [
        recorder(jigsaw(batch, tiles, generator))
        for batch in image_batches(
            rows, roots, ImageSpec.from_section(image_section), min(batch_size, forward.max_batch)
        )
    ]
    n = len(rows)
    return Outputs(
        torch.cat(logits).numpy() if logits else np.zeros((0, 0)), recorder.matrix().numpy(), np.full(n, -1)
    )


def same_logits(record: pd.DataFrame, other: pd.DataFrame, what: str) -> None:
    """Refuse to go on when two records of the same program and rows disagree."""
    a = logits_matrix(record.sort_values("row_id"))
    b = logits_matrix(other.sort_values("row_id"))
    if a.shape != b.shape or not np.allclose(a, b, atol=1e-5):
        raise AbstentionInputError(
            f"{what}: the .pte's logits here differ from its recorded ones; the run "
            "folder mixes programs — rerun the chain from chapter 'runtime'"
        )
