"""The audit's process pools, with workers that start clean.

A pool forked from a process whose native thread pools are live inherits their locks but not their
threads: OpenCV's ``setNumThreads`` then waits forever in the child on a condition variable whose waiters
were the parent's threads.  The lab audit's main process runs OpenCV warps and torch before its geometric
and leaf verifiers fork, and the cross-set audit (:mod:`.cross_sets`) runs every stage again in the same
process, where the geometric verifier's forked workers hung on the real apple sets.  Workers started from a
fresh server process (``forkserver``; ``spawn`` where that is missing) never inherit such state; the price
would be one import of the worker's modules (OpenCV, torch, timm: about 1.7 s of CPU) per worker and pool,
16 worker starts per audit with field sets.  The server imports them once instead
(``set_forkserver_preload``, read when the server starts): it never runs a native thread pool, so its
forks inherit loaded modules and no live pool.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

# what the audit's workers run: imported once by the server (a module missing here is imported by each
# worker as it starts, as before)
WORKER_MODULES = tuple(f"cropcop_utils.audit.{name}" for name in
                       ("hashing", "embedding", "geometry", "leaf_align", "reshot")) + ("timm",)


def clean_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A process pool of ``workers`` whose workers are not forks of this process."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # a server already started by this process keeps the list it started with
        context.set_forkserver_preload(list(WORKER_MODULES))
    else:  # no forkserver (Windows, macOS builds without it): fresh interpreters
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=initializer)
