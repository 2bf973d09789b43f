"""Per-chapter wall and CPU seconds: a child process's CPU is counted once it is reaped, a failing step is
recorded as not finished, and a later invocation replaces only the steps it measured again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cropcop_utils.core import timings


def test_a_reaped_child_process_cpu_is_counted_and_failures_are_marked(tmp_path):
    spent: list[dict] = []
    with timings.measured("busy_child", spent):
        subprocess.run([sys.executable, "-c", "x = 0\nfor i in range(6_000_000): x += i"], check=True)
    with pytest.raises(RuntimeError), timings.measured("broken", spent):
        raise RuntimeError("chapter failed")
    busy, broken = spent
    assert busy["finished"] and not broken["finished"]
    assert busy["cpu_s"] > 0.2 and busy["wall_s"] >= busy["cpu_s"] * 0.5


def test_a_later_invocation_replaces_only_what_it_measured_again(tmp_path):
    timings.write_timings(tmp_path, [{"step": "corpus", "wall_s": 1.0, "cpu_s": 1.0, "finished": True},
                                     {"step": "audit", "wall_s": 5.0, "cpu_s": 9.0, "finished": True}])
    timings.write_timings(tmp_path, [{"step": "audit", "wall_s": 2.0, "cpu_s": 3.0, "finished": True}])
    steps = {s["step"]: s for s in timings.read_timings(tmp_path)}
    assert steps["corpus"]["wall_s"] == 1.0 and steps["audit"]["cpu_s"] == 3.0 and len(steps) == 2
