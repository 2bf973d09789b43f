"""Which rows are labelled field photos: a frame without a ``source`` column holds lab rows only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cropcop_utils.core.sources import FIELD_TRAIN, LAB, is_field_train


def test_field_train_rows_are_told_from_lab_rows_and_a_frame_without_sources_is_lab():
    mixed = pd.DataFrame({"row_id": ["a", "b", "c"], "source": [LAB, FIELD_TRAIN, LAB]})
    assert is_field_train(mixed).tolist() == [False, True, False]
    lab_only = pd.DataFrame({"row_id": ["a", "b"]})
    flags = is_field_train(lab_only)
    assert flags.dtype == bool and not flags.any() and len(flags) == 2
    assert is_field_train(lab_only.iloc[:0]).shape == (0,) and isinstance(flags, np.ndarray)
