"""Prediction records: one row per image, the same format for every model state of the book.

``predict`` batches rows through the loading contract into any callable that maps a float batch
(N, 3, S, S) to logits (N, K): a ``torch.nn.Module``, a converted INT8 graph, an ExecuTorch method.
``records_from_logits`` builds the record from logits computed elsewhere.  Columns: row_id, label,
pred, top5_idx (list[int]), top5_prob (list[float]), margin (top-1 minus top-2 probability),
logits (list[float32], all K classes: calibration and abstention refit on them), model_state (SHA-256
of the scored artifact).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from ..core.config import progress_wanted
from ..core.imaging import ImageSpec
from ..core.metrics import state_metrics
from ..core.squares import EvalImages

RECORD_COLUMNS = ["row_id", "label", "pred", "top5_idx", "top5_prob", "margin", "logits", "model_state"]


@dataclass(frozen=True)
class PredictConfig:
    """How rows become batches: the corpus, the loading contract, batch size and device."""

    corpus_root: Path | Mapping[str, Path]   # one folder, or a folder per row ``source`` (core.sources)
    spec: ImageSpec
    batch_size: int = 128
    workers: int = 0
    device: str = "cpu"
    channels_last: bool = False
    autocast_dtype: torch.dtype | None = None
    cache: bool = False
    progress: bool = False

    @classmethod
    def from_ctx(cls, ctx: Any, **overrides: Any) -> PredictConfig:
        """The run's sources (the corpus, and the field-train folder when the run has one) and ``image``
        section; the rest from ``overrides``."""
        return cls(corpus_root=ctx.source_roots, spec=ImageSpec.from_section(ctx.section("image")),
                   **overrides)


def records_from_logits(row_ids: Any, labels: Any, logits: torch.Tensor | np.ndarray,
                        model_state: str) -> pd.DataFrame:
    """The prediction record of rows whose logits are already computed."""
    logits = torch.as_tensor(np.asarray(logits) if not isinstance(logits, torch.Tensor) else logits)
    prob = torch.softmax(logits.float(), dim=-1)
    k = min(5, prob.shape[-1])
    # ranked on the logits by a stable sort: tied logits (an INT8 grid makes exact ties) go to the lower
    # class index, as every argmax downstream decides them; topk leaves their order unspecified
    top_idx = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    top_prob = prob.gather(-1, top_idx)
    second = top_prob[:, 1] if k > 1 else torch.zeros(len(prob))
    return pd.DataFrame({
        "row_id": list(row_ids),
        "label": np.asarray(labels, dtype=np.int64),
        "pred": top_idx[:, 0].numpy().astype(np.int64),
        "top5_idx": [list(map(int, r)) for r in top_idx.tolist()],
        "top5_prob": [list(map(float, r)) for r in top_prob.tolist()],
        "margin": (top_prob[:, 0] - second).numpy().astype(np.float64),
        "logits": list(logits.float().numpy().astype(np.float32)),
        "model_state": model_state,
    }, columns=RECORD_COLUMNS)


@torch.inference_mode()
def logits_of(model: Callable[[torch.Tensor], torch.Tensor], rows: pd.DataFrame, cfg: PredictConfig,
              desc: str = "predict") -> torch.Tensor:
    """Logits (float32, CPU) of ``rows`` in row order."""
    from torch.utils.data import DataLoader

    if isinstance(model, torch.nn.Module):
        model.eval()
    dataset = EvalImages(rows, cfg.corpus_root, cfg.spec, cache=cfg.cache)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=False, num_workers=cfg.workers,
                        generator=torch.Generator())
    outputs = []
    for images, _ in tqdm(loader, desc=desc, disable=not progress_wanted(cfg.progress), leave=False):
        images = images.to(cfg.device)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        device_type = torch.device(cfg.device).type
        with torch.autocast(device_type, dtype=cfg.autocast_dtype or torch.bfloat16,
                            enabled=cfg.autocast_dtype is not None):
            outputs.append(torch.as_tensor(model(images)).float().cpu())
    if not outputs:
        return torch.empty(0, 0)
    return torch.cat(outputs)


def predict(model: Callable[[torch.Tensor], torch.Tensor], rows: pd.DataFrame, cfg: PredictConfig,
            model_state: str, desc: str = "predict") -> pd.DataFrame:
    """Prediction records of ``rows`` (needs row_id, rel_path, label) under ``model``."""
    missing = {"row_id", "rel_path", "label"} - set(rows.columns)
    if missing:
        raise KeyError(f"rows to predict lack column(s) {sorted(missing)}")
    logits = logits_of(model, rows, cfg, desc=desc)
    return records_from_logits(rows["row_id"], rows["label"], logits, model_state)


def score(records: pd.DataFrame) -> dict[str, float]:
    """Accuracy and macro-F1 of a record over the classes that have rows in it (``metrics``)."""
    y_true = records["label"].to_numpy()
    y_pred = records["pred"].to_numpy()
    if len(y_true) == 0:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "n": 0}
    return {**val_scores(y_true, y_pred), "n": int(len(y_true))}


def val_scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 over the classes with rows (``metrics.state_metrics``)."""
    with warnings.catch_warnings():
        # balanced accuracy warns when a prediction names a class without rows, routine early in training
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        scores = state_metrics(y_true, y_pred, labels=np.unique(y_true))
    return {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"]}


def same_state(path: str | os.PathLike, model_state: str, row_ids: Any) -> bool:
    """Whether an existing record file already holds ``model_state``'s predictions of exactly ``row_ids``."""
    path = Path(path)
    if not path.exists():
        return False
    frame = pd.read_parquet(path, columns=["row_id", "model_state"])
    return bool((frame["model_state"] == model_state).all() and list(frame["row_id"]) == list(row_ids))


def logits_matrix(records: pd.DataFrame) -> np.ndarray:
    """The (N, K) float32 logits of a prediction record, in its row order."""
    if "logits" not in records.columns:
        raise KeyError("prediction record has no 'logits' column: it was written before records kept "
                       "logits; rerun the chapter that wrote it in a new run folder")
    if len(records) == 0:
        return np.empty((0, 0), dtype=np.float32)
    return np.stack([np.asarray(row, dtype=np.float32) for row in records["logits"]])
