"""CropCop: the library behind the evidence book.

The package reads as the chain (``core`` and ``nets`` are its ground floor; ``book.py`` runs it)::

    core/        run folder and params, evidence registry, imaging contract, metrics, checkpoints, masks
    nets/        the networks and every way of loading and scoring a model state (float, INT8, .pte)
    synthetic/   the embedded synthetic corpus and field cohort (a data source, not a chapter)
    corpus/      chapter 1: scan, quarantine, taxonomy, class map
    audit/       chapter 2: exact and near duplicates, leakage groups, the inherited partition's verdict
    split/       chapter 3: the leakage-group-aware frozen split and the one door to its locked test rows
    probes/      chapter 4: frozen representation, acquisition cues, split membership
    training/    chapter 5: reference and distilled compact model, training regimes
    ptq/         chapter 6: predeclared PTQ candidates chosen on validation
    runtime/     chapter 7: the selected graph lowered to a .pte and executed from disk
    analysis/    chapters 8 and 9: per-class and fruit-slice analysis
    card/        the model card, rendered from the run's JSON (by chapters 10 and 11)
    field/       chapter 10: field transfer and background reliance
    abstention/  chapter 11: calibration and abstention
    explorer/    the interactive error explorer over a finished run

A package imports only ``core``, ``nets``, its own modules and the packages above it in this list
(``tests/test_layers.py`` keeps it so).  Each chapter notebook calls its package's ``run_chapter(ctx)``.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from .core import cpu_tuning

# before any chapter module imports torch: libgomp's spin and glibc's malloc (see cpu_tuning)
cpu_tuning.apply()

from .core.config import RunContext, open_run, reopen_run  # noqa: E402  (after the process settings above)
from .core.freshness import note_imports  # noqa: E402

# inside a book kernel (and the processes it starts): note which folders of the package the chapter's
# code comes from (RUN_DIR/chain/<chapter>.code-read), so a change elsewhere does not rerun it
note_imports(Path(__file__).resolve().parent)
from .core.evidence import native_output_note  # noqa: E402

# A per-user font cache built while matplotlib was being installed lacks its own fonts (STIX, Computer
# Modern): every mathtext label then logs "findfont: ... not found" into the chapter's output, 24 lines in
# one tomato audit page.  The fallback (DejaVu Sans) is what the figure uses either way.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

__all__ = ["RunContext", "native_output_note", "open_run", "reopen_run"]


def __getattr__(name: str) -> Any:
    # Chapter packages import torch, sklearn and friends: load them only when a notebook asks.
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as error:
        if error.name == f"{__name__}.{name}":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        raise
