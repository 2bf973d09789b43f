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
* :mod:`.cohorts` — every cohort after the primary one (``--field`` given again) scanned and scored by
  every state of every regime, each with its relation to field-train; :mod:`.cohort_prose` its section.
* :mod:`.relatives` — the cohort photos related to a labelled field-train photo (``--field-train``) in
  chapter 2's cross-set audit: the "no relative" scores leave them out.
* :mod:`.curve` — the learning curve (field accuracy against k labelled field photos per class; draws in
  :mod:`.curve_draws`, fine-tuning in :mod:`.curve_finetune`, figure and prose in :mod:`.curve_figures`).
* :mod:`.transfer` — the chapter's ``run_chapter``: it calls the modules above and writes ``field/``;
  the model card itself is :mod:`cropcop_utils.card`, the leaf masks :mod:`cropcop_utils.core.masks`.
"""

from .cohort_prose import cohorts_frame, cohorts_text
from .curve import run_curve
from .curve_figures import curve_headline, curve_table
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

__all__ = ["attribution_table", "cohorts_frame", "cohorts_text", "curve_headline", "curve_table", "headline",
           "masks_text", "recall_table",
           "regime_table", "regime_text", "run_chapter", "run_curve", "state_table", "swap_table"]
