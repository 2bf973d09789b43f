"""The audit's process pools (:func:`cropcop_utils.core.pools.clean_pool`), with the modules their server
imports once.

The lab audit's main process runs OpenCV warps and torch before its geometric and leaf verifiers start
workers, and the cross-set audit (:mod:`.cross_sets`) runs every stage again in the same process, where
forked geometric workers hung on the real apple sets: hence clean workers.  Their modules (OpenCV, torch,
timm: about 1.7 s of CPU) would otherwise be imported per worker and pool, 16 worker starts per audit
with field sets.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from ..core import pools

# what the audit's workers run: imported once by the server (a module missing here is imported by each
# worker as it starts, as before)
WORKER_MODULES = tuple(f"cropcop_utils.audit.{name}" for name in
                       ("hashing", "embedding", "geometry", "leaf_align", "reshot")) + ("timm",)


def clean_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A process pool of ``workers`` clean audit workers."""
    return pools.clean_pool(workers, WORKER_MODULES, initializer)
