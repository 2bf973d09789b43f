"""Chapter 3 — Split: the leakage-group-aware frozen split and the one door to its locked test rows.

The chapter's code, by topic:

* :mod:`.chapter` — the chapter's inputs and outputs (admitted rows with their groups, the re-indexed
  class map, per-class table, inherited-partition verdict, planted check, support plot) and
  ``run_chapter``.
* :mod:`.plan` — the method: fractions, folds, the (vectorised) stratified group k-fold, the choice of
  folds per split and the coverage repair (:func:`plan_split`).
* :mod:`.frozen` — what every later chapter relies on: the zero-crossings check, the integrity errors,
  :class:`FrozenSplit`, :func:`load_frozen` and :func:`read_frozen`.
* :mod:`.field_train` — field-train photos (``--field-train``) into train / val by the cross-set
  leakage groups, following the lab split where a group holds a lab photo.
* :mod:`.locked_test` — the one logged door to the locked test rows.
"""

from .chapter import (
    QUARANTINE_COLUMNS,
    SPLIT_COLUMNS,
    admitted_rows,
    frozen_class_map,
    inherited_verdict,
    per_class_table,
    planted_check,
    plot_split_support,
    run_chapter,
)
from .field_train import (
    FIELD_TRAIN_EXCLUDED,
    FIELD_TRAIN_FILES,
    FIELD_TRAIN_SPLIT,
    FieldTrainPlan,
    check_field_train,
    plan_field_train,
)
from .frozen import (
    FROZEN_FILES,
    SPLITS,
    CrossingReport,
    FrozenSplit,
    LeakageError,
    SplitIntegrityError,
    check_zero_crossings,
    load_frozen,
    read_frozen,
)
from .plan import SplitInputError, SplitPlan, folds_for, majority_class, parse_fractions, plan_split

__all__ = [
    "FIELD_TRAIN_EXCLUDED", "FIELD_TRAIN_FILES", "FIELD_TRAIN_SPLIT", "FROZEN_FILES", "FieldTrainPlan",
    "check_field_train", "plan_field_train", "QUARANTINE_COLUMNS", "SPLITS", "SPLIT_COLUMNS",
    "CrossingReport", "FrozenSplit",
    "LeakageError", "SplitInputError", "SplitIntegrityError", "SplitPlan", "admitted_rows",
    "check_zero_crossings", "folds_for", "frozen_class_map", "inherited_verdict", "load_frozen",
    "majority_class", "parse_fractions", "per_class_table", "plan_split", "planted_check",
    "plot_split_support", "read_frozen", "run_chapter",
]
