"""Chapter 10 — field transfer and background reliance, grouped by topic.

* :mod:`.cohort` — the field cohort (``--field``): where it lives for a run and the scan of
  ``<lab class>/<images>`` (optional ``labels.csv`` and ``masks/``) under the corpus chapter's contract.
* :mod:`.masks` — classical leaf masks for lab photographs (colour thresholds + morphology, refined by
  GrabCut) and mask IoU.
* :mod:`.attribution` — Grad-CAM per model state and the off-leaf share of attribution mass.
* :mod:`.composites` — background-swap composites (leaf pixels pasted on other backgrounds).
* :mod:`.transfer` — the chapter's ``run_chapter``: zero-shot field results, the background-swap
  benchmark and the model card.
"""
