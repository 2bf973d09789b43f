"""Training checkpoints: atomic writes, ``weights_only`` reads, every RNG state, identity checks on resume.

A checkpoint is a plain dict of tensors and Python scalars / lists / dicts, so it loads with
``torch.load(..., weights_only=True)`` (no pickled code runs when a checkpoint is opened).  RNG states
are stored in that form too: Python's Mersenne-Twister state is a tuple of ints, numpy's key array and
CUDA's byte states are tensors.

Writes go to a temp file in the same folder, then ``os.replace`` (as timm's ``CheckpointSaver``), so a
run killed at any instant leaves the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .evidence import atomic_write_bytes, sha256_bytes

FORMAT = "cropcop-train-checkpoint-v1"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or not one of ours."""


class ResumeMismatch(RuntimeError):
    """A checkpoint was made from other data or another configuration than the run would now use."""


# --------------------------------------------------------------------------- RNG states
def capture_rng() -> dict[str, Any]:
    """Every RNG state a training step can touch, in ``weights_only``-loadable form."""
    version, mt_state, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt_state), "gauss": gauss},
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the states :func:`capture_rng` captured."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(v) for v in py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(("MT19937", npy["key"].numpy().astype(np.uint32), int(npy["pos"]),
                         int(npy["has_gauss"]), float(npy["cached_gaussian"])))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise ResumeMismatch(f"checkpoint holds RNG states of {len(cuda)} CUDA device(s), this machine "
                                 f"has {torch.cuda.device_count()}")
        torch.cuda.set_rng_state_all(cuda)


# --------------------------------------------------------------------------- files
def to_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def save(path: str | os.PathLike, state: dict[str, Any]) -> str:
    """Write ``state`` atomically; returns the file's SHA-256 (the model-state identity)."""
    data = to_bytes(state)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` onto the CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: say which file and what to do
        raise CheckpointError(f"cannot read checkpoint {path} ({type(error).__name__}: {error}); delete it "
                              "to restart that model's training from scratch") from error
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a CropCop training checkpoint (no 'model' entry)")
    return state


# --------------------------------------------------------------------------- identity checks
def _short(value: Any) -> str:
    text = str(value)
    return text[:16] + "…" if len(text) > 20 else text


def diff_fingerprints(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Human-readable lines, one per artifact whose fingerprint differs (or is only on one side)."""
    lines = []
    for name in sorted(set(recorded) | set(current)):
        before, now = recorded.get(name), current.get(name)
        if before != now:
            lines.append(f"{name}: checkpoint made with {_short(before)}, run folder now has {_short(now)}")
    return lines


def diff_config(recorded: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """One line per configuration key whose value differs, with dotted key paths."""
    lines = []
    for key in sorted(set(recorded) | set(current)):
        before, now = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(before, dict) and isinstance(now, dict):
            lines += diff_config(before, now, f"{prefix}{key}.")
        elif before != now:
            lines.append(f"{prefix}{key}: checkpoint {before!r}, now {now!r}")
    return lines


def check_resume(state: dict[str, Any], path: str | os.PathLike, data_fingerprints: dict[str, str],
                 config: dict[str, Any], config_fingerprint: str) -> None:
    """Refuse to resume from ``state`` unless its data and configuration are the run's own.

    Raises :class:`ResumeMismatch` naming every artifact and every configuration key that differs.
    """
    if state.get("format") != FORMAT:
        raise ResumeMismatch(f"{path} was written in format {state.get('format')!r}, expected {FORMAT!r}; "
                             "delete it to restart that model's training")
    problems = diff_fingerprints(state.get("data_fingerprints", {}), data_fingerprints)
    if state.get("config_fingerprint") != config_fingerprint:
        problems += diff_config(state.get("config", {}), config) or [
            f"configuration fingerprint {_short(state.get('config_fingerprint'))} != "
            f"{_short(config_fingerprint)}"]
    if problems:
        raise ResumeMismatch(
            f"refusing to resume from {path}: it was made from other inputs than this run would use.\n  "
            + "\n  ".join(problems)
            + "\nRestore the original inputs, or delete the checkpoint to retrain that model from scratch.")
