"""Host latency (batch 1) and peak memory of a program or model, each measured in a process of its own.

tracemalloc does not see native allocations, so memory is the resident-set high-water mark (reset after
the imports, ``ru_maxrss`` where it cannot be) minus the resident size just before the model was loaded.
Each measurement runs in a fresh interpreter (``python -m cropcop_utils.runtime SPEC``), so no model
sees another's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def latency_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run inside a process of its own: load one model, time batch-1 calls, report peak memory.

    ``spec``: kind ("pte" | "eager"), image_size, warmup, runs, threads, seed, and for "pte" path +
    sha256, for "eager" arch + num_classes + state_path (a state_dict file) and optionally channels_last.
    Memory: the resident-set high-water mark is reset after the imports (Linux ``clear_refs``), so the
    peak counts loading and running the model, not the import transients; where that is unsupported,
    ``ru_maxrss`` is used.
    """
    import gc
    import time

    import executorch.runtime  # noqa: F401  (both kinds import the same libraries: comparable baselines)
    import psutil

    from ..nets.models import create_model

    threads = _set_threads(int(spec["threads"]))
    gc.collect()
    reset = _reset_peak_rss()
    rss_before = psutil.Process().memory_info().rss
    if spec["kind"] == "pte":
        forward: Callable[[torch.Tensor], Any] = PteForward(verified_pte_bytes(spec["path"], spec["sha256"]),
                                                            spec["sha256"])
    elif spec["kind"] == "eager":
        model = create_model(spec["arch"], int(spec["num_classes"])).eval()
        model.load_state_dict(torch.load(spec["state_path"], map_location="cpu", weights_only=True))
        # the chapter's baseline is the model as built (NCHW); bench/runtime_bench.py also times channels-last
        forward = model.to(memory_format=torch.channels_last) if spec.get("channels_last") else model
    else:
        raise ValueError(f"unknown latency kind {spec['kind']!r}")
    size = int(spec["image_size"])
    x = torch.randn((1, 3, size, size), generator=torch.Generator().manual_seed(int(spec["seed"])))
    times = []
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
            "peak_method": "VmHWM reset after imports" if reset else "ru_maxrss since process start"}


def measure(spec: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    """:func:`latency_worker` in a fresh Python process (so neither model sees the other's memory).

    Not a child forked from a process that imported the libraries once: a fork shares the parent's
    library pages without mapping them, so every page the model touches counts again as its memory
    (+6 to +21 MiB per model on the smoke book's programs), and the memory ratios would measure that."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "cropcop_utils.runtime", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        raise LatencyError(f"latency measurement of the {spec['kind']} model exceeded {timeout_s:.0f} s; "
                           "lower runtime.latency_runs") from None
    if done.returncode != 0:
        raise LatencyError(f"latency measurement of the {spec['kind']} model failed "
                           f"(exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_latency(pte_spec: dict[str, Any], eager_spec: dict[str, Any], timeout_s: float = 900,
                    device_spec: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per model (.pte, the device program when given, eager float) with p50 / p95 ms per image
    and memory; sequential runs."""
    rows = [{"model": ".pte (XNNPACK, INT8)", **measure(pte_spec, timeout_s)}]
    if device_spec is not None:
        rows.append({"model": f".pte device program (batch {device_spec.get('batch', 1)})",
                     **measure(device_spec, timeout_s), "kind": "device_pte"})
    rows.append({"model": "eager float (PyTorch)", **measure(eager_spec, timeout_s)})
    return pd.DataFrame(rows)


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
