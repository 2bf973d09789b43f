from __future__ import annotations

import subprocess
import sys

from cropcop_utils.core import cpu_tuning


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param, value) -> int:
        self.calls.append((param.value, value.value))
        return 1


def test_defaults_are_set_and_given_to_the_running_process():
    env: dict[str, str] = {}
    libc = FakeLibc()
    in_force = cpu_tuning.apply(env, libc)
    assert env["GOMP_SPINCOUNT"] == "1000"
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 * 2**20)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(2**30)
    assert sorted(libc.calls) == sorted([(-3, 32 * 2**20), (-1, 2**30), (-2, 256 * 2**20)])
    assert in_force == env


def test_a_users_own_settings_win():
    env = {"GOMP_SPINCOUNT": "0", "MALLOC_TRIM_THRESHOLD_": "4096"}
    libc = FakeLibc()
    cpu_tuning.apply(env, libc)
    assert env["GOMP_SPINCOUNT"] == "0" and env["MALLOC_TRIM_THRESHOLD_"] == "4096"
    assert (-1, 4096) in libc.calls


def test_without_glibc_only_the_openmp_spin_is_set(monkeypatch):
    monkeypatch.setattr(cpu_tuning, "_glibc", lambda: None)
    env: dict[str, str] = {}
    assert cpu_tuning.apply(env) == {"GOMP_SPINCOUNT": "1000"}


def test_child_processes_inherit_the_settings():
    child = 'import os; print(os.environ[\"MALLOC_TOP_PAD_\"])'
    code = ("import cropcop_utils, subprocess, sys; "
            f"print(subprocess.run([sys.executable, '-c', '{child}'], "
            "capture_output=True, text=True).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == str(256 * 2**20)
