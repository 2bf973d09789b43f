"""CropCop: the library behind the evidence book. Chapters call ``<module>.run_chapter(ctx)``."""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

# Torch's OpenMP threads (libgomp) spin for a long while before they sleep.  Beside one other busy process
# on a 2-core machine that spinning took a two-thread EfficientNet-Lite1 training step from ~36 to ~12
# images/s (one thread: ~22-25).  A short spin keeps most of the quiet rate (~32-35) and ~18-23 under that
# load; never spinning (OMP_WAIT_POLICY=passive: ~27 loaded) costs a fifth of the quiet rate.  libgomp
# reads this once, when torch loads: hence here, before any chapter module imports torch (the book's
# kernels, DataLoader workers and latency subprocesses inherit it).  A user's own setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

from . import config, evidence
from .config import RunContext, open_run, reopen_run

# A per-user font cache built while matplotlib was being installed lacks its own fonts (STIX, Computer
# Modern): every mathtext label then logs "findfont: ... not found" into the chapter's output, 24 lines in
# one tomato audit page.  The fallback (DejaVu Sans) is what the figure uses either way.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

__all__ = ["RunContext", "config", "evidence", "open_run", "reopen_run"]


def __getattr__(name: str) -> Any:
    # Chapter modules import torch, sklearn and friends: load them only when a notebook asks.
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as error:
        if error.name == f"{__name__}.{name}":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        raise
