"""Chapter 7: the selected INT8 graph lowered to an ExecuTorch program (XNNPACK) and executed from disk.

The graph chapter 6 registered (``ptq/selected.pt2``) is lowered with ``to_edge_transform_and_lower``
and the XNNPACK partitioner, serialised with ``to_executorch`` and written atomically to
``runtime/model.pte``.  The program that scores the test rows is then read back from disk, its SHA-256
checked against the registry first (:func:`load_verified_pte` refuses a modified file), and executed
with ``executorch.runtime`` in batches (the batch dimension stayed dynamic through export).  Its
prediction record is new: the .pte never inherits the graph's metrics.

Every test row whose top-1 decision differs between the INT8 graph and the .pte is listed with both
predictions and margins and classed by :func:`classify_disagreement`.  Host latency (batch 1) and peak
memory of the .pte, the device program and the eager float model are each measured in a process of
their own (:mod:`.latency`).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.config import RunContext
from ..core.evidence import Chapter, FingerprintMismatch, atomic_write_bytes, verify_artifact
from ..nets.pte import PTE, PteForward, load_verified_pte
from . import device, outputs
from .latency import MIB, compare_latency, latency_ratios, plot_latency
from .lowering import Lowered, LoweringJob, featured_graph, lower_all

FOLDER = "runtime"
TEST_RECORD = "runtime/predictions_test.parquet"
FEATURES_TEST = "runtime/features_test.parquet"  # the program's second output on the same test pass
DISAGREEMENTS = "runtime/disagreements.parquet"
NATIVE_LOG = "runtime/native.log"  # what ExecuTorch / XNNPACK write to stdout / stderr (C++ logging)
DISAGREEMENT_KINDS = ("corrected error", "reversed correct", "wrong-to-wrong")
DEFAULTS: dict[str, Any] = {"batch_size": 32, "latency_warmup": 5, "latency_runs": 50, "threads": 1,
                            "latency_timeout_s": 900, "latency_seed": 0, "device_batch": 1, "workers": 1}
_OPTIONS = {"test_override", "test_override_reason", "progress", "measure_latency"}


class RuntimeConfigError(ValueError):
    """The profile's ``runtime`` section holds an invalid value."""


def output_check(forward: PteForward, graph: torch.fx.GraphModule, image_size: int,
                 seed: int) -> dict[str, Any]:
    """The program read back from disk against the graph it was lowered from, on one seeded batch of
    noise (no data split is read): both outputs' shapes, and how far the features differ."""
    batch = 3  # neither 1 nor the planned maximum: a features output not resized to the batch shows
    x = torch.rand(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = graph(x)
    return {"method": "forward", "names": list(outputs.OUTPUT_NAMES),
            **outputs.check_features(forward.outputs(x), tuple(expected), batch)}


def state_dict_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """The prequantised state file: the float model's state_dict saved alone with ``torch.save``."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return buffer.getvalue()


def size_record(pte_bytes: int, state_bytes: int) -> dict[str, float | int]:
    return {"pte_bytes": int(pte_bytes), "pte_mib": pte_bytes / MIB, "state_bytes": int(state_bytes),
            "state_mib": state_bytes / MIB, "ratio": pte_bytes / state_bytes,
            "reduction": 1.0 - pte_bytes / state_bytes}


# --------------------------------------------------------------------------- executing the file
# --------------------------------------------------------------------------- disagreement audit
def classify_disagreement(label: int, before: int, after: int) -> str:
    """How a changed top-1 decision moved: corrected error, reversed correct, or wrong-to-wrong.

    ``before`` is the INT8 graph's prediction, ``after`` the .pte's.  Equal predictions are not a
    disagreement and raise ``ValueError``.
    """
    if before == after:
        raise ValueError(f"predictions {before} and {after} agree: not a disagreement")
    if after == label:
        return "corrected error"
    if before == label:
        return "reversed correct"
    return "wrong-to-wrong"


def disagreement_table(graph: pd.DataFrame, pte: pd.DataFrame, class_names: Sequence[str],
                       rel_paths: pd.Series | None = None) -> pd.DataFrame:
    """Every row the two records decide differently, with label, both predictions and margins, and kind.

    ``graph`` and ``pte`` are prediction records of the same rows (any order); ``rel_paths`` maps
    row_id → corpus-relative path.
    """
    from ..ptq import aligned

    pte = aligned(graph, pte, "INT8 graph vs .pte")
    changed = graph["pred"].to_numpy() != pte["pred"].to_numpy()
    names = np.asarray(class_names, dtype=object)
    out = pd.DataFrame({
        "row_id": graph["row_id"].to_numpy()[changed],
        "label": graph["label"].to_numpy()[changed].astype(int),
        "graph_pred": graph["pred"].to_numpy()[changed].astype(int),
        "pte_pred": pte["pred"].to_numpy()[changed].astype(int),
        "graph_margin": graph["margin"].to_numpy()[changed].astype(float),
        "pte_margin": pte["margin"].to_numpy()[changed].astype(float),
    })
    out["kind"] = [classify_disagreement(*v) for v in zip(out["label"], out["graph_pred"], out["pte_pred"],
                                                          strict=True)]
    out["class_name"] = names[out["label"]] if len(out) else []
    out["graph_pred_name"] = names[out["graph_pred"]] if len(out) else []
    out["pte_pred_name"] = names[out["pte_pred"]] if len(out) else []
    if rel_paths is not None:
        out["rel_path"] = out["row_id"].map(rel_paths)
    return out


def disagreement_counts(table: pd.DataFrame) -> dict[str, int]:
    counts = table["kind"].value_counts() if len(table) else pd.Series(dtype=int)
    return {kind: int(counts.get(kind, 0)) for kind in DISAGREEMENT_KINDS}


# --------------------------------------------------------------------------- latency and memory
# --------------------------------------------------------------------------- chapter
def runtime_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    unknown = set(options) - _OPTIONS
    if unknown:
        raise RuntimeConfigError(f"runtime.run_chapter options {sorted(unknown)} are not accepted; options "
                                 f"are {sorted(_OPTIONS)} (the rest lives in the profile's runtime section)")
    params = {**DEFAULTS, "measure_latency": True, **ctx.section("runtime"), **options}
    for key in ("batch_size", "latency_runs", "threads", "device_batch", "workers"):
        if int(params[key]) < 1:
            raise RuntimeConfigError(f"runtime.{key} must be >= 1, got {params[key]}")
    return params


def chapter_latency(ch: Chapter, params: dict[str, Any], image_size: int, pte_sha: str,
                    state: dict[str, Any], state_blob: bytes, device_sha: str | None = None) -> pd.DataFrame:
    """The chapter's .pte (and its device program) against the eager float model (its state_dict in a
    scratch file)."""
    common = {"image_size": image_size, "warmup": int(params["latency_warmup"]),
              "runs": int(params["latency_runs"]), "threads": int(params["threads"]),
              "seed": int(params["latency_seed"])}
    device_spec = None if device_sha is None else {
        **common, "kind": "pte", "path": str(ch.path(device.DEVICE_PTE)), "sha256": device_sha,
        "batch": int(params["device_batch"])}
    with tempfile.TemporaryDirectory(dir=ch.folder) as scratch:
        state_path = Path(scratch) / "float_state.pt"
        state_path.write_bytes(state_blob)
        return compare_latency(
            {**common, "kind": "pte", "path": str(ch.path(PTE)), "sha256": pte_sha},
            {**common, "kind": "eager", "arch": state["arch"], "num_classes": int(state["num_classes"]),
             "state_path": str(state_path)}, float(params["latency_timeout_s"]), device_spec)


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Lower every regime's selected graph (:mod:`.regimes`); the shipped regime's record is
    ``runtime/runtime.json`` and names the others' (``runtime/<regime>/runtime.json``).  Latency is timed,
    and the device program lowered, for the shipped ``.pte`` only: every regime has the same architecture
    and lowering, and the card points a device at the shipped regime's program.  The programs are lowered
    first, side by side in ``runtime.workers`` processes (:mod:`.lowering`)."""
    from ..training import regimes

    params = runtime_params(ctx, **options)
    items = regimes.of_run(ctx)
    shipped = regimes.shipped(items)
    jobs = [job for regime in (shipped, *(r for r in items if not r.shipped))
            for job in lowering_jobs(ctx, regime, int(params["device_batch"]) if regime.shipped else None)]
    lowered = lower_all(jobs, int(params["workers"]))
    timing = {"workers": int(params["workers"]),
              "seconds": {key: result.seconds for key, result in lowered.items()}}
    untimed = {**params, "measure_latency": False, "device_program": False}
    others = {r.name: run_regime(ctx, untimed, r, lowered) for r in items if not r.shipped}
    return run_regime(ctx, params, shipped, lowered, others, lowering=timing)


def lowering_jobs(ctx: RunContext, regime: Any, device_batch: int | None) -> list[LoweringJob]:
    """The programs one regime needs: its selected graph with a dynamic batch (key: the regime's name)
    and, given ``device_batch``, the device program (key: ``<regime>/device``)."""
    from .. import ptq as quant

    at = regime.path
    verify_artifact(ctx.run_dir, at("ptq/ptq.json"))
    selected = json.loads((ctx.run_dir / at("ptq/ptq.json")).read_text())
    graph = selected["selected_graph"]
    verify_artifact(ctx.run_dir, at(quant.SELECTED), graph["sha256"])
    common = {"graph": (ctx.run_dir / at(quant.SELECTED)).read_bytes(),
              "image_size": int(selected["compact"]["image_size"]), "max_batch": int(graph["max_batch"])}
    jobs = [LoweringJob(regime.name, **common)]
    if device_batch is not None:
        jobs.append(LoweringJob(f"{regime.name}/device", device_batch=device_batch, **common))
    return jobs


def run_regime(ctx: RunContext, params: dict[str, Any], regime: Any, lowered: dict[str, Lowered],
               others: dict[str, dict[str, Any]] | None = None,
               lowering: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write one regime's lowered programs, execute the .pte from disk on the locked test, audit it,
    time it."""
    from .. import ptq as quant
    from ..core import checkpoint
    from ..nets import predict
    from ..split import load_frozen

    at = regime.path
    ch = Chapter(ctx.run_dir, "runtime", folder=regime.folder("runtime"))
    frozen = load_frozen(ch)
    ptq_record = ch.read_json(at("ptq/ptq.json"))
    selected = ptq_record["selected_graph"]
    image_size = int(ptq_record["compact"]["image_size"])
    batched = lowered[regime.name]
    ch.add_native_output(at(NATIVE_LOG), batched.native_output)  # ExecuTorch's C++ logging: the log
    with ch.native_output(at(NATIVE_LOG)):
        # the program returns (logits, features): chapter 11's abstention reads both (.outputs)
        graph = featured_graph(ch.verify(at(quant.SELECTED), selected["sha256"]).read_bytes())
    data, delegation, delegation_summary = batched.data, batched.delegation, batched.summary
    atomic_write_bytes(ch.path(at(PTE)), data)
    pte_sha = ch.record_output(at(PTE))
    device_record, device_sha = None, None
    if params.get("device_program", True):
        device_lowered = lowered[f"{regime.name}/device"]
        ch.add_native_output(at(NATIVE_LOG), device_lowered.native_output)
        device_data = device_lowered.data
        atomic_write_bytes(ch.path(at(device.DEVICE_PTE)), device_data)
        device_sha = ch.record_output(at(device.DEVICE_PTE))

    state = checkpoint.load(ch.verify(at(quant.CHECKPOINT), ptq_record["compact"]["sha256"]))
    state_blob = state_dict_bytes(state["model"])
    size = size_record(len(data), len(state_blob))

    with ch.native_output(at(NATIVE_LOG)):
        forward = load_verified_pte(ctx.run_dir, at(PTE))
        program_outputs = output_check(forward, graph, image_size, int(params["latency_seed"]))
        batch_size = min(int(params["batch_size"]), forward.max_batch)
        cfg = predict.PredictConfig.from_ctx(ctx, batch_size=batch_size,
                                             progress=bool(params.get("progress")))
        pte_test, access = quant.score_locked_test(ch, forward, pte_sha, "runtime", cfg,
                                                  bool(params.get("test_override", False)),
                                                  params.get("test_override_reason"), at(TEST_RECORD),
                                                  features_path=at(FEATURES_TEST))
        if device_sha is not None:
            check = device.compare_programs(forward, load_verified_pte(ctx.run_dir, at(device.DEVICE_PTE)),
                                            frozen.rows_for("val"), cfg, outputs.OUTPUT_NAMES)
            device_record = {"path": at(device.DEVICE_PTE), "sha256": device_sha,
                             "batch": int(params["device_batch"]), "pte_bytes": len(device_data),
                             "pte_mib": len(device_data) / MIB, "check": check}
    graph_test = ch.read_parquet(at(quant.TEST_RECORD))
    if (graph_test["model_state"] != selected["sha256"]).any():
        raise FingerprintMismatch(f"{at(quant.TEST_RECORD)} was not written by {at(quant.SELECTED)}; "
                                  "rerun chapter 'ptq' (06_ptq)")
    graph_test = quant.aligned(pte_test, graph_test, "INT8 graph vs .pte")
    float_test = quant.float_record(ch, at(quant.FLOAT_TEST), ptq_record["compact"]["sha256"], pte_test)
    rel_paths = frozen.rows.set_index("row_id")["rel_path"]
    audit = disagreement_table(graph_test, pte_test, frozen.class_names, rel_paths)
    ch.write_parquet(at(DISAGREEMENTS), audit)
    counts = disagreement_counts(audit)
    pte_scores, graph_scores = predict.score(pte_test), predict.score(graph_test)
    test = {"rows": len(pte_test), "access": access, "model_state": pte_sha, "pte": pte_scores,
            "int8_graph": graph_scores, "float": predict.score(float_test),
            "agreement_with_int8_graph": quant.agreement(pte_test["pred"], graph_test["pred"]),
            "agreement_with_float": quant.agreement(pte_test["pred"], float_test["pred"]),
            "disagreements": len(audit), "disagreement_kinds": counts,
            "median_margin_all_rows": float(graph_test["margin"].median()),
            "median_margin_changed_rows": float(audit["graph_margin"].median()) if len(audit) else None}

    latency, ratios = None, {}
    if params["measure_latency"]:
        latency = chapter_latency(ch, params, int(ptq_record["compact"]["image_size"]), pte_sha, state,
                                  state_blob, device_sha)
        ratios = latency_ratios(latency)
        ch.write_parquet(at("runtime/latency.parquet"), latency)
        ch.save_figure(plot_latency(latency), at("runtime/latency.png"))
    ch.write_parquet(at("runtime/delegation.parquet"), delegation)
    for name in others or {}:
        ch.verify(f"{FOLDER}/{name}/{FOLDER}.json")
    figures: dict[str, Any] = {
        "pte_mib": size["pte_mib"], "state_mib": size["state_mib"], "size_reduction": size["reduction"],
        "test_agreement_with_int8_graph": test["agreement_with_int8_graph"],
        "test_disagreements": len(audit),
        **{k.replace(" ", "_").replace("-", "_"): v for k, v in counts.items()},
        "pte_test_accuracy": pte_scores["accuracy"], "pte_test_macro_f1": pte_scores["macro_f1"]}
    if device_record is not None:
        figures["device_program_identical"] = device_record["check"]["identical"]
    if latency is not None:
        figures.update({"latency": at("runtime/latency.png"), "latency_p50_ratio": ratios["p50_ratio"],
                        "memory_ratio": ratios["memory_ratio"],
                        "device_memory_ratio": ratios["device_memory_ratio"],
                        "device_p50_ratio": ratios["device_p50_ratio"]})
    return ch.finish(
        figures=figures, pte={"path": at(PTE), "sha256": pte_sha, **size}, delegation=delegation_summary,
        selected_graph=selected, selected_candidate=ptq_record["selected"], batch_size=batch_size,
        pte_max_batch=forward.max_batch, program_outputs=program_outputs, device_program=device_record,
        test=test, latency=None if latency is None else latency.to_dict("records"), latency_ratios=ratios,
        host={"cpu_count": os.cpu_count(), "platform": sys.platform, "torch": torch.__version__},
        regime=regime.name, lowering=lowering,
        regimes={name: {"record": f"{FOLDER}/{name}/{FOLDER}.json", "pte": other["pte"],
                        "figures": other["figures"]} for name, other in (others or {}).items()},
    )
