"""Chapter 10 — field transfer and background reliance, grouped by topic.

* :mod:`.cohort` — the field cohort (``--field``): where it lives for a run and the scan of
  ``<lab class>/<images>`` (optional ``labels.csv`` and ``masks/``) under the corpus chapter's contract.
* :mod:`.attribution` — Grad-CAM on the float models, occlusion (captum) on every state, and the
  off-leaf share of attribution mass.
* :mod:`.composites` — background-swap composites (leaf pixels pasted on other backgrounds); :mod:`.bench`
  builds the cells on disk (leaf sets, donors, the composites manifest).
* :mod:`.scores` — each state's lab test record and its zero-shot field results (per class, per source
  label); :mod:`.looks` — attribution measured over the cells; :mod:`.stats` — bootstrap intervals.
* :mod:`.compare` — a training regime against the baseline on the same rows (paired intervals).
* :mod:`.figures` and :mod:`.prose` — the chapter's plots and the sentences rendered from its record.
* :mod:`.transfer` — the chapter's ``run_chapter``: it calls the modules above and writes ``field/``;
  the model card itself is :mod:`cropcop_utils.card`, the leaf masks :mod:`cropcop_utils.core.masks`.
"""

from .prose import (
    attribution_table,
    headline,
    masks_text,
    recall_table,
    regime_table,
    regime_text,
    state_table,
    swap_table,
)
from .transfer import run_chapter

__all__ = ["attribution_table", "headline", "masks_text", "recall_table", "regime_table", "regime_text",
           "run_chapter", "state_table", "swap_table"]
