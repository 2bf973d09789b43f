"""CropCop: the library behind the evidence book. Chapters call ``<module>.run_chapter(ctx)``."""

from __future__ import annotations

import importlib
import logging
from typing import Any

from . import cpu_tuning

# before any chapter module imports torch: libgomp's spin and glibc's malloc (see cpu_tuning)
cpu_tuning.apply()

from . import config, evidence  # noqa: E402  (after the process settings above)
from .config import RunContext, open_run, reopen_run  # noqa: E402

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
