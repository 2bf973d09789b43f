"""Process pools whose workers start clean: not forks of a process whose native thread pools are live.

A pool forked from a process whose native thread pools are live inherits their locks but not their
threads: OpenCV's ``setNumThreads`` then waited forever in a forked audit worker on a condition variable
whose waiters were the parent's threads (the real apple sets).  Workers started from a fresh server
process (``forkserver``; ``spawn`` where that is missing) never inherit such state.  The price would be
one import of the worker's modules per worker and pool; the server imports them once instead
(``set_forkserver_preload``, read when the server starts): it never runs a native thread pool, so its
forks inherit loaded modules and no live pool.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor


def clean_pool(workers: int, preload: Sequence[str] = (),
               initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A process pool of ``workers`` whose workers are not forks of this process; ``preload`` names the
    modules the server imports once for all its workers (a server already started by this process keeps
    the list it started with: a module missing from it is imported by each worker as it starts)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
    else:  # no forkserver (Windows, macOS builds without it): fresh interpreters
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=initializer)
