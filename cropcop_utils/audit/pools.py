"""The audit's process pools, with workers that start clean.

A pool forked from a process whose native thread pools are live inherits their locks but not their
threads: OpenCV's ``setNumThreads`` then waits forever in the child on a condition variable whose waiters
were the parent's threads.  The lab audit's main process runs OpenCV warps and torch before its geometric
and leaf verifiers fork, and the cross-set audit (:mod:`.cross_sets`) runs every stage again in the same
process, where the geometric verifier's forked workers hung on the real apple sets.  Workers started from a
fresh server process (``forkserver``; ``spawn`` where that is missing) never inherit such state; the price
is one import of the worker's module per worker and pool.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor


def clean_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A process pool of ``workers`` whose workers are not forks of this process."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=initializer)
