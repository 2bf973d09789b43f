"""Sources: where a row's image file lives.

A *source* names the folder a row's ``rel_path`` is relative to.  The lab corpus (``--data``) is ``LAB``;
the labelled field photos a run may train and select on (``--field-train``) are ``FIELD_TRAIN``.  Rows that
mix sources carry a ``source`` column, and :func:`cropcop_utils.core.squares.row_paths` resolves each row
against ``RunContext.source_roots`` (``{source: folder}``).  A row without a ``source`` column is a lab row.
The scored field cohorts (``--field``) are not sources: no model trains or selects on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LAB = "lab"
FIELD_TRAIN = "field_train"
SOURCES = (LAB, FIELD_TRAIN)


def is_field_train(rows: Any) -> np.ndarray:
    """For each row of a frame: whether it is a ``--field-train`` photo (a frame without a ``source``
    column holds lab rows only)."""
    if "source" not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return (rows["source"] == FIELD_TRAIN).to_numpy()
