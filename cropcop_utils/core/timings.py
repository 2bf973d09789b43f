"""What each chapter of a book run cost: wall seconds and CPU seconds, in ``RUN_DIR/timings.json``.

A chapter runs in its own Jupyter kernel, a child process of the runner that is shut down (and reaped)
when the chapter ends, so its CPU time arrives in the runner's ``RUSAGE_CHILDREN``; the runner's own CPU
(``RUSAGE_SELF``: papermill, the HTML build) is added.  A kernel's worker processes count when their
parent reaped them (pools joined at the end of their work, as the audit's are); a process left running
would be missed, so CPU seconds are a lower bound.  ``bench/book_bench.py`` prints the table.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .evidence import atomic_write_text

TIMINGS = "timings.json"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def measured(step: str, entries: list[dict[str, Any]]) -> Iterator[None]:
    """Append ``{"step", "wall_s", "cpu_s", "finished"}`` for the block to ``entries`` (``finished`` false
    when it raised)."""
    wall, cpu = time.perf_counter(), _cpu_seconds()
    finished = False
    try:
        yield
        finished = True
    finally:
        entries.append({"step": step, "wall_s": time.perf_counter() - wall, "cpu_s": _cpu_seconds() - cpu,
                        "finished": finished})


def write_timings(run_dir: str | Path, entries: list[dict[str, Any]]) -> Path:
    """Merge this invocation's steps into ``RUN_DIR/timings.json`` (a step measured again replaces its
    earlier entry; the others stay, so a run resumed with ``--until`` keeps what it measured before)."""
    path = Path(run_dir) / TIMINGS
    kept = {e["step"]: e for e in read_timings(run_dir)}
    kept.update({e["step"]: {**e, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")} for e in entries})
    atomic_write_text(path, json.dumps({"steps": list(kept.values())}, indent=1) + "\n")
    return path


def read_timings(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / TIMINGS
    return json.loads(path.read_text())["steps"] if path.exists() else []
