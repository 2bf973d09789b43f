"""The audit's settings: unknown keys and out-of-range values are refused."""

from __future__ import annotations

import pandas as pd
import pytest

from cropcop_utils import audit


def test_settings_are_validated() -> None:
    assert audit.settings({})["phash_radius"] == audit.DEFAULTS["phash_radius"]
    with pytest.raises(audit.AuditInputError, match="unknown audit setting"):
        audit.settings({"radius": 3})
    with pytest.raises(audit.AuditInputError, match="phash_radius <= table_radius"):
        audit.settings({"phash_radius": 20, "table_radius": 16})
    with pytest.raises(audit.AuditInputError, match="dihedral_radius"):
        audit.settings({"dihedral_radius": 64})
    with pytest.raises(audit.AuditInputError, match="embedding_k"):
        audit.settings({"embedding_k": -1})
    with pytest.raises(audit.AuditInputError, match="geometry_min_inliers"):
        audit.settings({"geometry_min_inliers": 2})
    for bad in ({"words_k": -1}, {"words_vocabulary": 1}):
        with pytest.raises(audit.AuditInputError, match="words_k"):
            audit.settings(bad)
    for bad in ({"leaf_min_ssim": 3}, {"leaf_review_ssim": -2}):
        with pytest.raises(audit.AuditInputError, match="leaf_min_ssim"):
            audit.settings(bad)
    with pytest.raises(audit.AuditInputError, match="geometry_review_inliers"):
        audit.settings({"geometry_review_inliers": -1})
    with pytest.raises(audit.AuditInputError, match="manifest"):
        audit.admitted_rows(pd.DataFrame({"row_id": ["x"]}))


def test_the_suite_audits_at_the_settings_the_profiles_ship() -> None:
    # The smoke book's audit floors (test_chapter) and every audit_corpus call on DEFAULTS hold for the
    # production settings only while the smoke profile and DEFAULTS resolve to what default.yaml ships.
    from cropcop_utils.core.config import load_profile

    shipped = audit.settings(load_profile("default")["audit"])
    assert audit.settings(load_profile("smoke")["audit"]) == shipped
    assert {**shipped, "workers": None} == audit.DEFAULTS
