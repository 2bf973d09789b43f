"""CropCop: the library behind the evidence book. Chapters call ``<module>.run_chapter(ctx)``."""

from __future__ import annotations

import importlib
from typing import Any

from . import config, evidence
from .config import RunContext, open_run, reopen_run

__all__ = ["RunContext", "config", "evidence", "open_run", "reopen_run"]


def __getattr__(name: str) -> Any:
    # Chapter modules import torch, sklearn and friends: load them only when a notebook asks.
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as error:
        if error.name == f"{__name__}.{name}":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        raise
