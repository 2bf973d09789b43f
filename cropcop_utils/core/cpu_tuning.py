"""Process settings for a small CPU machine, applied when ``cropcop_utils`` is imported (before torch).

Two native defaults cost the book a large share of its CPU time on a 2-core machine:

* libgomp's long spin.  Torch's OpenMP threads spin for a long while before they sleep.  Beside one
  other busy process that spinning took a two-thread EfficientNet-Lite1 training step from ~36 to ~12
  images/s (one thread: ~22-25).  A short spin (``GOMP_SPINCOUNT=1000``) keeps most of the quiet rate
  (~32-35) and ~18-23 under that load; never spinning (``OMP_WAIT_POLICY=passive``: ~27 loaded) costs a
  fifth of the quiet rate.  libgomp reads it once, when torch loads.
* glibc's malloc returning memory.  Tensors of a few megabytes (a batch's activations) are served by
  ``mmap`` and unmapped when freed, and the heap top is trimmed past 128 KiB, so every training step and
  every scored batch faults its pages in again: the PlantVillage tomato book (default profile) took 177
  million minor page faults and spent 759 of its 4,842 CPU seconds in the kernel.  Serving blocks up to
  32 MiB from the heap and keeping up to 1 GiB of freed heap removes most of those faults.  glibc reads
  its ``MALLOC_*_`` variables when a process starts: the running process gets the same values through
  ``mallopt``; child processes (the book's chapter kernels, worker pools, latency subprocesses) inherit
  the variables.

A user's own setting of any of these variables wins.  No library exposes this: jemalloc or tcmalloc
would need a preload that a pip install cannot arrange.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import MutableMapping
from typing import Any

GOMP = {"GOMP_SPINCOUNT": "1000"}
# glibc mallopt parameters (malloc.h) and the environment variable glibc reads for each at start-up
MALLOC = {"MALLOC_MMAP_THRESHOLD_": (-3, 32 * 2**20),   # M_MMAP_THRESHOLD: glibc's maximum
          "MALLOC_TRIM_THRESHOLD_": (-1, 2**30),        # M_TRIM_THRESHOLD
          "MALLOC_TOP_PAD_": (-2, 256 * 2**20)}         # M_TOP_PAD: grow the heap in larger steps


def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return None


def apply(environ: MutableMapping[str, str] | None = None, libc: Any | None = None) -> dict[str, str]:
    """Set the variables that are not set yet and the running process's malloc; returns what is in force."""
    env = os.environ if environ is None else environ
    for name, value in GOMP.items():
        env.setdefault(name, value)
    libc = _glibc() if libc is None else libc
    if libc is not None:
        for name, (param, value) in MALLOC.items():
            env.setdefault(name, str(value))
            try:
                libc.mallopt(ctypes.c_int(param), ctypes.c_int(int(env[name])))
            except (ValueError, OverflowError):
                pass  # a user's value glibc would not parse either: left to glibc
    return {name: env[name] for name in (*GOMP, *MALLOC) if name in env}
