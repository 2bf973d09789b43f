"""Clean pools: their workers are started by a server process, not forked from this one."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from cropcop_utils.core import pools


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_workers_are_children_of_the_server_not_of_this_process() -> None:
    with pools.clean_pool(2, ("cropcop_utils.core.pools",)) as pool:
        parents = {pool.submit(os.getppid).result(timeout=120) for _ in range(4)}
    assert os.getpid() not in parents and len(parents) == 1  # one server started them all
