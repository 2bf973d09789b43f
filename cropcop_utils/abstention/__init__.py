"""Chapter 11 — calibration and abstention, grouped by topic.

* :mod:`.records` — the prediction records the chapter reads (validation, test, the ``.pte``'s
  validation scored here), :func:`~.records.aligned` which checks each against the frozen split, and
  ``AbstentionInputError``.
* :mod:`.calibration` — probabilities at a temperature, NLL, the temperature fit on validation, Brier,
  ECE and reliability bins; ``calibration_block`` for one state.
* :mod:`.selective` — confidence scores, risk–coverage and AURC, the threshold chosen on validation and
  applied to test, Wilson shares (``proportion``); ``selective_block`` for one state.
* :mod:`.conformal` — split conformal sets (``crepes``), their summary and per-class coverage;
  ``conformal_block`` for one state.
* :mod:`.field_cohort` — chapter 10's field cohort and what the recipe does on it (``field_block``).
* :mod:`.out_of_scope` — non-plant photos, textures and noise, another crop's leaves, their prediction
  records and the rejection rate (``rejection_block``).
* :mod:`.protection` — the candidate outlier scores on the ``.pte``'s logits and features (pytorch-ood),
  their thresholds fitted on validation, the choice on the fitting outliers, the evaluation per held-back
  set and the verdict against the profile's targets; :mod:`.program_outputs` gathers the program's
  outputs for every set, :mod:`.shipped_recipe` measures it on a run, :mod:`.protection_prose` renders it.
* :mod:`.chapter` — ``run_chapter``: params, the per-state record, the ``.pte``'s deployment recipe, the
  summary table and closing note; :mod:`.regimes` — the regimes that do not ship, measured the same way,
  and ``side_by_side``; :mod:`.figures` — the chapter's plots.
"""

from .chapter import closing_note, run_chapter, summary_table
from .protection_prose import candidates_table, protection_text
from .regimes import side_by_side

__all__ = ["candidates_table", "closing_note", "protection_text", "run_chapter", "side_by_side",
           "summary_table"]
