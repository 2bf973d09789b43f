"""Shared by chapter 11's tests: small parameters, logits drawn at a known temperature, a ``.pte`` result."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cropcop_utils.abstention.chapter import DEFAULTS
from cropcop_utils.abstention.out_of_scope import rejection_block
from cropcop_utils.abstention.selective import apply_threshold

PARAMS = {**DEFAULTS, "bootstrap": 50, "conformal_levels": [0.90, 0.95]}


def sampled(n: int, k: int, temperature: float, seed: int,
            spread: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels drawn from softmax(logits / temperature) (Gumbel-max): T is the true temperature."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, spread, size=(n, k))
    labels = np.argmax(logits / temperature + rng.gumbel(size=(n, k)), axis=1)
    return logits, labels


def pte_result(accepted_none: bool = False, field: dict | None = None) -> dict:
    score, correct = np.array([0.9, 0.6, 0.2]), np.array([True, True, False])
    threshold = 0.95 if accepted_none else 0.5
    rejection = rejection_block(pd.DataFrame({"source": [], "logits": []}), 1.0, threshold, "msp", 0.95)
    rejection.pop("scores")
    return {"model_state": "a" * 64, "temperature": 1.2,
            "selective": {"msp": {"choice": {"threshold": threshold},
                                  "test": apply_threshold(score, correct, threshold)}},
            "field": field, "out_of_scope": rejection}
