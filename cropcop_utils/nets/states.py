"""Every model state of a run as a callable batch → logits, loaded from its verified file.

The chapters after the runtime score images the chain never saw — field photographs, composites,
out-of-scope inputs — with the same four states the analysis compares.  This module is the one place
that knows which file holds which state and how to execute it:

- ``reference`` / ``compact``: the float checkpoints (``training/<kind>/best.pt``), eval mode, channels-last
  (:func:`.models.for_inference`: as the trainer ran them, and faster on a CPU);
- ``int8``: the selected converted graph (``ptq/selected.pt2``);
- ``pte``: the ExecuTorch program (``runtime/model.pte``), executed from its verified bytes.

Every file is re-hashed against ``registry.json`` through the chapter's :class:`~.evidence.Chapter`
before it is loaded, so a state's ``model_state`` (the file's SHA-256) is the same string the earlier
chapters wrote in their prediction records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..core.evidence import Chapter
from ..core.model_states import STATE_NAMES

STATE_FILES: dict[str, str] = {
    "reference": "training/reference/best.pt",
    "compact": "training/compact/best.pt",
    "int8": "ptq/selected.pt2",
    "pte": "runtime/model.pte",
}


class StateLoadError(RuntimeError):
    """A model state's file does not fit the run (class count, missing chapter)."""


@dataclass
class LoadedState:
    """One state ready to score: the callable, the SHA-256 of its file and the largest batch it takes."""

    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    sha256: str
    max_batch: int | None = None
    module: torch.nn.Module | None = None   # the float model, for attribution methods that need one


def load_float(ch: Chapter, rel_path: str, n_classes: int,
               image_size: int | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A float model (eval mode) and its checkpoint, from the verified file ``rel_path``; refused when the
    checkpoint's class count (or, given ``image_size``, its training size) does not fit the run."""
    from ..core import checkpoint
    from . import models

    state = checkpoint.load(ch.verify(rel_path))
    if int(state.get("num_classes", -1)) != n_classes:
        raise StateLoadError(f"{rel_path} has {state.get('num_classes')} classes, the frozen split "
                             f"{n_classes}; rerun chapter 'training' (05_training)")
    if image_size is not None and int(state.get("image_size", image_size)) != image_size:
        raise StateLoadError(f"{rel_path} was trained at {state['image_size']} px, the profile's image "
                             f"size is {image_size} px; rerun chapter 'training' (05_training)")
    model = models.create_model(state["arch"], n_classes)
    model.load_state_dict(state["model"])
    return model.eval(), state


def load_state(ch: Chapter, name: str, n_classes: int, regime: Any = None) -> LoadedState:
    """Load one state (``reference``, ``compact``, ``int8``, ``pte``) of a regime (default: the shipped
    one, on the plain paths) from its verified file."""
    if name not in STATE_FILES:
        raise ValueError(f"unknown model state {name!r}; states are {', '.join(STATE_FILES)}")
    rel_path = STATE_FILES[name] if regime is None else regime.path(STATE_FILES[name])
    if name in ("reference", "compact"):
        from .models import for_inference

        model = for_inference(load_float(ch, rel_path, n_classes)[0])
        return LoadedState(name, model, ch.inputs[rel_path], module=model)
    if name == "int8":
        from . import int8_graph

        # decomposed quantize/dequantize ops rewritten in place: the same logits, bit for bit, twice as fast
        program = int8_graph.load_executable(ch.verify(rel_path).read_bytes())
        # An unlifted exported program refuses .eval(); predict() only calls eval on nn.Modules.
        return LoadedState(name, lambda batch: program(batch), ch.inputs[rel_path])
    from .pte import PteForward, verified_pte_bytes

    path = ch.verify(rel_path)
    forward = PteForward(verified_pte_bytes(path, ch.inputs[rel_path], rel_path), ch.inputs[rel_path])
    return LoadedState(name, forward, ch.inputs[rel_path], max_batch=forward.max_batch)


def load_states(ch: Chapter, n_classes: int, names: Sequence[str] = STATE_NAMES,
                regime: Any = None) -> dict[str, LoadedState]:
    return {name: load_state(ch, name, n_classes, regime) for name in names}


def score_rows(states: dict[str, LoadedState], rows: pd.DataFrame,
               corpus_root: str | Path | Mapping[str, Path], image_section: dict[str, Any],
               batch_size: int = 32) -> dict[str, pd.DataFrame]:
    """Prediction records (with logits) of ``rows`` (row_id, rel_path, label) under every loaded state.

    ``rel_path`` is relative to ``corpus_root``, which need not be the run's corpus (a field cohort,
    a folder of composites), or to the folder of each row's ``source`` when a mapping of folders is
    given (``RunContext.source_roots``).  Images go through the book's loading contract
    (``image_section``).
    """
    from ..core.imaging import ImageSpec
    from .predict import PredictConfig, predict

    spec = ImageSpec.from_section(image_section)
    records = {}
    for name, state in states.items():
        size = min(batch_size, state.max_batch) if state.max_batch else batch_size
        root = corpus_root if isinstance(corpus_root, Mapping) else Path(corpus_root)
        # every state reads the same rows: the first decodes them, the others reuse the squares (the
        # process-wide SquareCache holds exactly what a fresh decode gives)
        cfg = PredictConfig(corpus_root=root, spec=spec, batch_size=size, cache=True)
        records[name] = predict(state.forward, rows, cfg, state.sha256, desc=f"{name}")
    return records
