"""Host latency (batch 1) and peak memory of a program or model, each measured in a process of its own.

tracemalloc does not see native allocations, so memory is the resident-set high-water mark (reset after
the imports, ``ru_maxrss`` where it cannot be) minus the resident size just before the model was loaded.
Each measurement runs in a fresh interpreter (``python -m cropcop_utils.runtime SPEC``), so no model
sees another's memory.  The interpreters start together and import their libraries side by side (for a
small model the imports are most of a measurement); each then waits for a line on its stdin, and they are
let go one at a time, so no two measurements overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from ..core.config import REPO_ROOT
from ..nets.pte import PteForward, verified_pte_bytes

MIB = 2**20
READY = "ready"  # what a worker prints when its imports are done; it then waits for GO on stdin
GO = "go"


class LatencyError(RuntimeError):
    """A latency / memory measurement subprocess failed."""


def _set_threads(threads: int) -> str:
    torch.set_num_threads(threads)
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    except ImportError:  # an ExecuTorch build without the threadpool hook: its default pool is used
        return "executorch default"
    _unsafe_reset_threadpool(threads)
    return str(threads)


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (VmHWM) to the current size; False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss(reset: bool) -> int:
    """Peak resident bytes since the reset (VmHWM), else since process start (``ru_maxrss``)."""
    if reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def latency_worker(spec: dict[str, Any], imported: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run inside a process of its own: load one model, time batch-1 calls, report peak memory.

    ``spec``: kind ("pte" | "eager"), image_size, warmup, runs, threads, seed, and for "pte" path +
    sha256, for "eager" arch + num_classes + state_path (a state_dict file) and optionally channels_last.
    Memory: the resident-set high-water mark is reset after the imports (Linux ``clear_refs``), so the
    peak counts loading and running the model, not the import transients; where that is unsupported,
    ``ru_maxrss`` is used.  ``imported`` is called once the imports are done (:func:`measure_all` holds
    the process there until no other measurement runs).
    """
    import gc

    if spec["kind"] not in ("pte", "eager"):  # before the imports: a wrong spec fails in a second
        raise ValueError(f"unknown latency kind {spec['kind']!r}")
    import executorch.runtime  # noqa: F401  (both kinds import the same libraries: comparable baselines)
    import psutil

    from ..nets.models import create_model

    if imported is not None:
        imported()
    threads = _set_threads(int(spec["threads"]))
    gc.collect()
    reset = _reset_peak_rss()
    rss_before = psutil.Process().memory_info().rss
    if spec["kind"] == "pte":
        forward: Callable[[torch.Tensor], Any] = PteForward(verified_pte_bytes(spec["path"], spec["sha256"]),
                                                            spec["sha256"])
    else:
        model = create_model(spec["arch"], int(spec["num_classes"])).eval()
        model.load_state_dict(torch.load(spec["state_path"], map_location="cpu", weights_only=True))
        # the chapter's baseline is the model as built (NCHW); bench/runtime_bench.py also times channels-last
        forward = model.to(memory_format=torch.channels_last) if spec.get("channels_last") else model
    size = int(spec["image_size"])
    x = torch.randn((1, 3, size, size), generator=torch.Generator().manual_seed(int(spec["seed"])))
    times = []
    timed_from = time.time()  # wall clock, so a caller can see that no two measurements overlapped
    with torch.inference_mode():
        for _ in range(int(spec["warmup"])):
            forward(x)
        for _ in range(int(spec["runs"])):
            start = time.perf_counter()
            forward(x)
            times.append(time.perf_counter() - start)
    peak = _peak_rss(reset)
    ms = 1000 * np.asarray(times)
    return {"kind": spec["kind"], "runs": len(times), "warmup": int(spec["warmup"]), "threads": threads,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": float(ms.mean()), "rss_before_load_mib": rss_before / MIB, "peak_rss_mib": peak / MIB,
            "peak_above_baseline_mib": (peak - rss_before) / MIB,
            "peak_method": "VmHWM reset after imports" if reset else "ru_maxrss since process start",
            "pid": os.getpid(), "timed_from": timed_from, "timed_to": time.time()}


def wait_for_turn() -> None:
    """The worker's side of :func:`measure_all`: say the imports are done, wait to be let go."""
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        raise SystemExit("the latency worker was not let go (its parent stopped waiting)")


def measure_all(specs: list[dict[str, Any]], timeout_s: float = 900) -> list[dict[str, Any]]:
    """:func:`latency_worker` for each spec, each in a fresh Python process, measured one after another.

    Not children forked from a process that imported the libraries once: a fork shares the parent's
    library pages without mapping them, so every page the model touches counts again as its memory
    (+6 to +21 MiB per model on the smoke book's programs), and the memory ratios would measure that.
    ``timeout_s`` bounds the imports (all processes together, from their start) and then each
    measurement (from the moment it is let go)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        errors = [Path(scratch) / f"{i}.err" for i in range(len(specs))]
        procs = []
        try:
            for spec, err in zip(specs, errors, strict=True):
                with err.open("w") as stderr:  # a file, not a pipe: nothing blocks on a full buffer
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "cropcop_utils.runtime", json.dumps(spec)], text=True, env=env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO_ROOT))
            for proc, spec, err in zip(procs, specs, errors, strict=True):  # every import done first
                _await_ready(proc, started + timeout_s, spec, err)
            results = []
            for proc, spec, err in zip(procs, specs, errors, strict=True):
                try:
                    out, _ = proc.communicate(GO + "\n", timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    raise _too_long(spec) from None
                if proc.returncode != 0 or not out.strip():
                    raise _failed(proc, spec, err)
                results.append(json.loads(out.strip().splitlines()[-1]))
            return results
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()


def _await_ready(proc: subprocess.Popen, deadline: float, spec: dict[str, Any], err: Path) -> None:
    """Read the worker's stdout up to its READY line (a library may print before it); a worker still
    importing at the deadline is killed."""
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), proc.kill)
    watchdog.start()
    try:
        for line in iter(proc.stdout.readline, ""):
            if line.strip() == READY:
                return
    finally:
        watchdog.cancel()
    raise _too_long(spec) if time.monotonic() >= deadline else _failed(proc, spec, err)


def _too_long(spec: dict[str, Any]) -> LatencyError:
    return LatencyError(f"latency measurement of the {spec['kind']} model exceeded its time limit; lower "
                        "runtime.latency_runs or raise runtime.latency_timeout_s")


def _failed(proc: subprocess.Popen, spec: dict[str, Any], err: Path) -> LatencyError:
    return LatencyError(f"latency measurement of the {spec['kind']} model failed (exit {proc.wait()}):\n"
                        f"{err.read_text()[-2000:]}")


def measure(spec: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    """One :func:`latency_worker` in a fresh Python process (:func:`measure_all`)."""
    return measure_all([spec], timeout_s)[0]


def compare_latency(pte_spec: dict[str, Any], eager_spec: dict[str, Any], timeout_s: float = 900,
                    device_spec: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per model (.pte, the device program when given, eager float) with p50 / p95 ms per image
    and memory; the measurements run one after another (:func:`measure_all`)."""
    models = [(".pte (XNNPACK, INT8)", pte_spec, {})]
    if device_spec is not None:
        models.append((f".pte device program (batch {device_spec.get('batch', 1)})", device_spec,
                       {"kind": "device_pte"}))
    models.append(("eager float (PyTorch)", eager_spec, {}))
    results = measure_all([spec for _, spec, _ in models], timeout_s)
    return pd.DataFrame([{"model": name, **result, **extra}
                         for (name, _, extra), result in zip(models, results, strict=True)])


def latency_ratios(table: pd.DataFrame) -> dict[str, float]:
    """.pte / eager float for p50, p95 and the memory above baseline (< 1: the .pte is faster / smaller);
    the device program's (``device_``) beside them when the table has it."""
    eager = table[table["kind"] == "eager"].iloc[0]
    out: dict[str, float] = {}
    for kind, prefix in (("pte", ""), ("device_pte", "device_")):
        if not (table["kind"] == kind).any():
            continue
        row = table[table["kind"] == kind].iloc[0]
        out.update({f"{prefix}p50_ratio": float(row["p50_ms"] / eager["p50_ms"]),
                    f"{prefix}p95_ratio": float(row["p95_ms"] / eager["p95_ms"]),
                    f"{prefix}memory_ratio": float(row["peak_above_baseline_mib"]
                                                   / eager["peak_above_baseline_mib"])
                    if eager["peak_above_baseline_mib"] > 0 else float("nan")})
    return out


def plot_latency(table: pd.DataFrame) -> Figure:
    """p50 / p95 latency per image and peak memory above baseline, .pte vs eager float."""
    fig = Figure(figsize=(8.0, 3.2))
    left, right = fig.subplots(1, 2)
    y = np.arange(len(table))
    left.barh(y - 0.2, table["p50_ms"], height=0.4, label="p50", color="tab:blue")
    left.barh(y + 0.2, table["p95_ms"], height=0.4, label="p95", color="tab:orange")
    left.set_yticks(y, table["model"])
    left.set_xlabel("ms per image (batch 1)")
    left.legend(fontsize=8)
    right.barh(y, table["peak_above_baseline_mib"], color="tab:gray")
    right.set_yticks(y, [""] * len(y))
    right.set_xlabel("peak memory above pre-load RSS (MiB)")
    fig.suptitle("Host CPU: the .pte against the eager float model")
    fig.tight_layout()
    return fig
