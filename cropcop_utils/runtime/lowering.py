"""Lowering to ExecuTorch with XNNPACK, one program in-process or several across worker processes.

Chapter 7 lowers every regime's selected graph (with the features output, :mod:`.outputs`) and, for the
shipped regime, the device program (:mod:`.device`).  Each lowering is single-threaded Python passes over
the graph (~20 s for EfficientNet-Lite0 here), and they do not depend on each other, so with
``runtime.workers: 2`` they run side by side in clean worker processes (:func:`~cropcop_utils.core.pools.
clean_pool`) and the chapter waits for the longest instead of the sum.  Lowering is deterministic: a
worker gives the bytes the chapter's own process gives (tested).  What native code writes while lowering
is caught in the process that lowers and handed back, so it lands in the regime's ``native.log`` either
way.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..core.evidence import capture_native_output
from ..core.pools import clean_pool
from ..nets.int8_graph import load_program
from . import device, outputs

# imported once by the pool's server for all its workers.  Not ExecuTorch: importing it warns on stderr
# (torchao's pytree notice), and the server's stderr is the chapter kernel's, which shows in the book; each
# worker imports it inside lower_job, where its output is caught for the log
WORKER_MODULES = ("cropcop_utils.runtime.lowering",)


@dataclass(frozen=True)
class LoweringJob:
    """One program to lower: a selected graph's serialised bytes (``ptq/selected.pt2``) with the features
    output added, exported with a dynamic batch up to ``max_batch`` or, given ``device_batch``, a static
    batch of that many images."""

    key: str
    graph: bytes
    image_size: int
    max_batch: int
    device_batch: int | None = None


@dataclass(frozen=True)
class Lowered:
    """A lowered program: its bytes, delegation table and summary (:func:`lower`), what native code wrote
    while it was lowered, and the seconds it took."""

    data: bytes
    delegation: pd.DataFrame
    summary: dict[str, int]
    native_output: bytes
    seconds: float


def lower(program: Any) -> tuple[bytes, pd.DataFrame, dict[str, int]]:
    """Lower an ``ExportedProgram`` to ExecuTorch with XNNPACK: (.pte bytes, delegation table, summary).

    The table has one row per operator type of the lowered graph with how many of its nodes sit inside
    XNNPACK-delegated subgraphs and how many run outside them (``get_delegation_info``).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.utils.configs import get_xnnpack_edge_compile_config
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    # Lowering re-traces the graph with fake tensors, and the fake conv asks which CPU backend eager
    # PyTorch would pick; the mkldnn and NNPACK heuristics test "batch >= 16", which guards the dynamic
    # batch to <= 15 in the program (a "bounded tensor" resize error at run time).  XNNPACK runs these
    # convs, not those backends, so they are switched off while lowering.
    with warnings.catch_warnings():
        # toggling the mkldnn flags warns about Intel-GPU TF32, which has nothing to do with this CPU run
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False), torch.backends.nnpack.flags(enabled=False):
            # XNNPACK's own edge config: it skips the edge-dialect validity check, which re-verifies the
            # whole graph after every pass (~11 % of a Lite0 lowering here); every graph tried, the
            # apple books' shipped ones among them, lowered to the same program bytes with and without it
            edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                               compile_config=get_xnnpack_edge_compile_config())
            buffer = bytes(edge.to_executorch().buffer)
    info = get_delegation_info(edge.exported_program().graph_module)
    table = info.get_operator_delegation_dataframe().rename(columns={
        "op_type": "op", "occurrences_in_delegated_graphs": "delegated",
        "occurrences_in_non_delegated_graphs": "not_delegated"})
    table = table[table["op"] != "Total"].astype({"delegated": int, "not_delegated": int})
    summary = {"delegated_subgraphs": int(info.num_delegated_subgraphs),
               "delegated_nodes": int(info.num_delegated_nodes),
               "non_delegated_nodes": int(info.num_non_delegated_nodes)}
    return buffer, table.reset_index(drop=True), summary


def featured_graph(graph: bytes) -> torch.nn.Module:
    """The serialised selected graph as a module returning (logits, features)."""
    return outputs.with_feature_output(load_program(graph).module())


def lower_job(job: LoweringJob) -> Lowered:
    """Lower one job in this process, catching its native output."""
    started, caught = time.perf_counter(), []
    with capture_native_output(caught):
        graph = featured_graph(job.graph)
        if job.device_batch is None:
            from ..ptq import export_dynamic

            example = torch.zeros(2, 3, job.image_size, job.image_size)
            program = export_dynamic(graph, example, job.max_batch)
        else:
            program = device.device_program(graph, job.image_size, job.device_batch)
        data, delegation, summary = lower(program)
    return Lowered(data, delegation, summary, b"".join(caught), time.perf_counter() - started)


def _one_thread() -> None:
    # the passes are Python; two workers each with a full torch thread pool would oversubscribe 2 cores
    torch.set_num_threads(1)


def lower_all(jobs: Sequence[LoweringJob], workers: int) -> dict[str, Lowered]:
    """Every job lowered, by key: in this process when ``workers`` is 1 or there is one job, else in up to
    ``workers`` clean worker processes, the jobs submitted in the order given (longest first pays)."""
    if len({job.key for job in jobs}) != len(jobs):
        raise ValueError(f"lowering jobs need distinct keys, got {[job.key for job in jobs]}")
    if workers < 1:
        raise ValueError(f"runtime.workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) <= 1:
        return {job.key: lower_job(job) for job in jobs}
    with clean_pool(min(workers, len(jobs)), WORKER_MODULES, _one_thread) as pool:
        futures = {job.key: pool.submit(lower_job, job) for job in jobs}
        return {key: future.result() for key, future in futures.items()}
