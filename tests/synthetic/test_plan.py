"""The plan of the embedded corpus: class sizes along the long tail."""

from __future__ import annotations

from cropcop_utils import synthetic
from cropcop_utils.core.config import load_profile


def test_class_sizes_form_a_geometric_long_tail() -> None:
    for profile in ("smoke", "default", "paper"):
        params = load_profile(profile)["synthetic"]
        sizes = list(synthetic.class_sizes(params).values())
        assert sizes[0] == params["largest_class"]
        assert sizes == sorted(sizes, reverse=True)
        assert min(sizes) >= 3
        assert sizes[0] / sizes[-1] >= params["tail_ratio"]
