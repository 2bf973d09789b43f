"""Prediction records: format, row order, and scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score
from train_fixtures import build_run

from cropcop_utils.core import imaging
from cropcop_utils.nets.predict import (
    RECORD_COLUMNS,
    PredictConfig,
    logits_matrix,
    predict,
    records_from_logits,
    same_state,
    score,
)


def test_records_hold_top_k_probabilities_and_the_margin():
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    frame = records_from_logits(["r1", "r2"], [0, 1], logits, "f" * 64)
    assert list(frame.columns) == RECORD_COLUMNS
    prob = torch.softmax(logits, -1)
    assert frame["pred"].tolist() == [0, 2]
    assert frame.loc[0, "top5_idx"] == [0, 2, 1]  # fewer than five classes: all of them, best first
    assert np.allclose(frame.loc[0, "top5_prob"], sorted(prob[0].tolist(), reverse=True))
    assert frame.loc[1, "margin"] == pytest.approx(float(prob[1, 2] - prob[1, 0]))
    assert (frame["model_state"] == "f" * 64).all()


def test_records_keep_every_logit_through_parquet(tmp_path):
    logits = torch.tensor([[2.0, -1.5, 1.0], [0.25, 0.0, 5.0]])
    path = tmp_path / "p.parquet"
    records_from_logits(["r1", "r2"], [0, 1], logits, "f" * 64).to_parquet(path)
    back = logits_matrix(pd.read_parquet(path))
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, logits.numpy())
    with pytest.raises(KeyError, match="no 'logits' column"):
        logits_matrix(pd.DataFrame({"row_id": ["r1"]}))


def test_predict_batches_rows_through_the_loading_contract_in_row_order(tmp_path):
    ctx = build_run(tmp_path)
    rows = pd.read_parquet(ctx.run_dir / "split" / "split.parquet").query("split == 'val'")
    rows = rows.sample(frac=1.0, random_state=0).reset_index(drop=True)
    spec = imaging.ImageSpec.from_section(ctx.section("image"))

    def mean_colour(batch: torch.Tensor) -> torch.Tensor:  # any callable mapping a batch to logits
        return batch.mean(dim=(2, 3))

    frame = predict(mean_colour, rows, PredictConfig.from_ctx(ctx, batch_size=5), "e" * 64)
    paths = [ctx.corpus_root / p for p in rows["rel_path"]]
    tensors = [imaging.load_tensor(p, spec.size, spec.mean, spec.std) for p in paths]
    expected = torch.stack([t.mean(dim=(1, 2)) for t in tensors])
    manual = records_from_logits(rows["row_id"], rows["label"], expected, "e" * 64)
    pd.testing.assert_frame_equal(frame, manual)
    path = tmp_path / "p.parquet"
    frame.to_parquet(path)
    assert same_state(path, "e" * 64, rows["row_id"])
    assert not same_state(path, "d" * 64, rows["row_id"])


def test_score_is_sklearn_over_the_classes_present():
    frame = pd.DataFrame({"label": [0, 0, 1, 1, 2], "pred": [0, 1, 1, 1, 3]})
    scores = score(frame)
    assert scores["accuracy"] == pytest.approx(accuracy_score(frame["label"], frame["pred"]))
    assert scores["macro_f1"] == pytest.approx(f1_score(frame["label"], frame["pred"], labels=[0, 1, 2],
                                                        average="macro", zero_division=0))


def test_tied_logits_rank_the_lower_class_first_as_argmax_does():
    # an INT8 grid makes exact ties; chapters 10 and 11 must read the same decision from one record
    logits = np.array([[0.0848, -0.328, 0.0792, 0.0848], [0.1, 0.3, 0.3, 0.3], [2.0, 1.0, 3.0, 0.0]],
                      dtype=np.float32)
    record = records_from_logits(["a", "b", "c"], [0, 1, 2], logits, "state")
    assert record["pred"].tolist() == logits.argmax(axis=1).tolist() == [0, 1, 2]
    assert record["top5_idx"].tolist() == [[0, 3, 2, 1], [1, 2, 3, 0], [2, 0, 1, 3]]
    assert np.allclose([p[0] - p[1] for p in record["top5_prob"]], record["margin"])
