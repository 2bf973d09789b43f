"""Chapters 8 and 9 — per-class analysis and the fruit-label slice, grouped by topic.

* :mod:`.states` — what both chapters share: the profile's ``analysis`` section over its defaults, the
  verified reads of the four model states' prediction records and their pairing (same rows, same
  labels, the frozen split's test rows), the class table; the explorer reads the records through it.
* :mod:`.per_class` — chapter 8 (``run_per_class``): the model-state table, paired deltas, McNemar,
  the per-class and support-bin tables, the error taxonomy and transitions, regime deltas, and the
  prose and tables the notebook renders from ``analysis/per_class.json``.
* :mod:`.fruit_slice` — chapter 9 (``run_fruit_slice``): the slice rule over the class map, the
  slice's mean recall and F1 per state with paired intervals, its prose and tables.
* :mod:`.figures` — the plots of both chapters.
"""

from .fruit_slice import fruit_slice_prose, run_fruit_slice, slice_tables
from .per_class import (
    per_class_prose,
    regime_prose,
    run_per_class,
    state_identity_table,
    state_metric_table,
)

__all__ = ["fruit_slice_prose", "per_class_prose", "regime_prose", "run_fruit_slice", "run_per_class",
           "slice_tables", "state_identity_table", "state_metric_table"]
