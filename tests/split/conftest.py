"""The frozen split the split tests read: one chapter run on the planted corpus per test module."""

from __future__ import annotations

import pytest
from split.split_runs import make_run

from cropcop_utils import split
from cropcop_utils.core import config


@pytest.fixture(scope="module")
def frozen(tmp_path_factory) -> tuple[config.RunContext, dict]:
    ctx = make_run(tmp_path_factory.mktemp("split") / "run")
    return ctx, split.run_chapter(ctx)
