"""Chapter 6: post-training quantisation of the compact model (PT2E, XNNPACK), selected on validation only.

The candidates are declared in the profile's ``ptq`` section and written, with a fingerprint, to
``ptq/candidates.json`` before any model is quantised (:mod:`.candidates`).  Each candidate goes through
the PT2E flow (:mod:`.pt2e`) and is then re-exported and serialised; the serialised bytes are loaded back
and *that* program is what gets scored, so the SHA-256 in every prediction record names exactly the graph
that made the predictions.

Selection uses the validation split only (the gate and the rule: :mod:`.candidates`).  Only the selected
graph reads the locked test split (through :mod:`cropcop_utils.split.locked_test`).

Calibration rows come from the training split only; :func:`.pt2e.assert_train_only` checks it against the
frozen split before any calibration image is opened.

This module holds the chapter itself: its settings, the compact model and its float records as inputs,
one candidate's evaluation, the locked-test read, and ``run_chapter`` / ``run_regime``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.config import RunContext
from ..core.evidence import Chapter, atomic_write_bytes, sha256_bytes
from ..nets import int8_graph
from ..nets.int8_graph import load_program
from .candidates import (
    SELECTION_RULE,
    Candidate,
    Gate,
    PTQConfigError,
    apply_gate,
    declaration,
    macro_f1_drop,
    parse_candidates,
    plot_gate,
    rank_candidates,
    select_candidate,
)
from .graph_ops import quantised_ops, quantizer_patterns, stored_bytes, summarise_ops
from .pt2e import assert_train_only, calibration_order, export_dynamic, image_batches, quantise, serialise

FOLDER = "ptq"
MIN_MAX_BATCH = 4  # a dynamic batch bound of 2 (the export example) lowers to a program fixed at 2
DEFAULTS: dict[str, Any] = {"calibration_seed": 0, "batch_size": 32, "max_batch": 64, "bootstrap": 1000,
                            "seed": 0, "ci_level": 0.95, "require_pass": False}


class GateFailure(RuntimeError):
    """``ptq.require_pass`` is set and no candidate passed the validation gate."""


class CheckpointMismatch(ValueError):
    """The compact checkpoint does not fit the frozen split or the profile's image size."""


# --------------------------------------------------------------------------- scoring
def agreement(pred_a: Sequence[int], pred_b: Sequence[int]) -> float:
    a, b = np.asarray(pred_a), np.asarray(pred_b)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"agreement needs two equally long, non-empty predictions ({a.shape}, {b.shape})")
    return float(np.mean(a == b))


def aligned(reference: pd.DataFrame, other: pd.DataFrame, what: str) -> pd.DataFrame:
    """``other`` in ``reference``'s row order; refuses unless both hold the same rows with the same labels."""
    if set(reference["row_id"]) != set(other["row_id"]) or len(reference) != len(other):
        raise ValueError(f"{what}: the two prediction records do not cover the same rows "
                         f"({len(reference)} vs {len(other)})")
    out = other.set_index("row_id").loc[reference["row_id"]].reset_index()
    if not np.array_equal(out["label"].to_numpy(), reference["label"].to_numpy()):
        raise ValueError(f"{what}: the two prediction records disagree on labels")
    return out


# --------------------------------------------------------------------------- chapter
CHECKPOINT = "training/compact/best.pt"
FLOAT_VAL = "training/compact/predictions_val.parquet"
FLOAT_TEST = "training/compact/predictions_test.parquet"
SELECTED = "ptq/selected.pt2"
TEST_RECORD = "ptq/predictions_test.parquet"
NATIVE_LOG = "ptq/native.log"  # what torch / ExecuTorch write to stdout / stderr while quantising
_OPTIONS = {"test_override", "test_override_reason", "progress"}


def ptq_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """The profile's ``ptq`` section over the defaults.  Options may not touch the declaration."""
    section = ctx.section("ptq")
    if not section:
        raise PTQConfigError(f"profile {ctx.profile!r} (params.yaml of {ctx.run_dir}) has no ptq section; "
                             "the quantisation candidates and gate must be declared in the profile")
    unknown = set(options) - _OPTIONS
    if unknown:
        raise PTQConfigError(f"ptq.run_chapter options {sorted(unknown)} are not accepted: candidates, gate "
                             f"and calibration are declared in the profile; options are {sorted(_OPTIONS)}")
    params = {**DEFAULTS, **section, **options}
    if int(params["max_batch"]) < MIN_MAX_BATCH:
        raise PTQConfigError(f"ptq.max_batch {params['max_batch']} < {MIN_MAX_BATCH}: with a bound this "
                             "close to the export example (2 rows) the lowered program fixes its batch size")
    if not 1 <= int(params["batch_size"]) <= int(params["max_batch"]):
        raise PTQConfigError(f"ptq.batch_size {params['batch_size']} must lie in 1..max_batch "
                             f"({params['max_batch']})")
    return params


def load_compact(ch: Chapter, n_classes: int, image_size: int,
                 rel_path: str = CHECKPOINT) -> tuple[torch.nn.Module, dict[str, Any], str]:
    """The float compact model from its verified checkpoint: (model in eval mode, checkpoint, SHA-256)."""
    from ..nets.states import StateLoadError, load_float

    try:
        model, state = load_float(ch, rel_path, n_classes, image_size)
    except StateLoadError as error:
        raise CheckpointMismatch(str(error)) from None
    return model, state, ch.inputs[rel_path]


def float_record(ch: Chapter, rel_path: str, model_state: str, rows: pd.DataFrame) -> pd.DataFrame:
    """The float compact model's prediction record, verified and in ``rows``' order."""
    frame = ch.read_parquet(rel_path)
    if (frame["model_state"] != model_state).any():
        raise CheckpointMismatch(f"{rel_path} was not written by {CHECKPOINT} (model_state differs); "
                                 "rerun chapter 'training' (05_training)")
    return aligned(rows[["row_id", "label"]], frame, rel_path)


def _callable(program: Any) -> Any:
    # An unlifted exported program refuses .eval(); predict() only calls it on nn.Modules.
    return lambda batch: program(batch)


def score_locked_test(ch: Chapter, forward: Any, model_state: str, reader: str, cfg: Any,
                     override: bool, reason: str | None, rel_path: str,
                     features_path: str | None = None) -> tuple[pd.DataFrame, str]:
    """The scored artifact's test record: reused when this exact state already wrote it, else read once.

    With ``features_path`` the program's second output (its pooled features) is recorded there from the
    same pass, and a reuse needs that record too.  Returns (record, how) with how = "read" (through the
    locked test) or "reused".
    """
    from ..core.evidence import read_registry
    from ..nets import predict
    from ..nets.features import predict_with_features
    from ..split import locked_test

    registry = read_registry(ch.run_dir)
    if not override and all(p in registry and ch.path(p).exists() for p in (rel_path, features_path) if p):
        frames = [ch.read_parquet(p) for p in (rel_path, features_path) if p]
        if all(len(f) and (f["model_state"] == model_state).all() for f in frames):
            return frames[0], "reused"
    rows = locked_test.read_test_rows(ch.run_dir, model_state, reader=reader, override=override,
                                      reason=reason)
    if features_path is None:
        record = predict.predict(forward, rows, cfg, model_state, desc=f"{reader} test")
    else:
        record, features = predict_with_features(forward, rows, cfg, model_state, desc=f"{reader} test")
        ch.write_parquet(features_path, features)
    ch.write_parquet(rel_path, record)
    return record, "read"


def evaluate_candidate(ch: Chapter, exported: Any, candidate: Candidate, batches: Iterable[torch.Tensor],
                       n_rows: int, val_rows: pd.DataFrame, float_val: pd.DataFrame, cfg: Any,
                       example: torch.Tensor, max_batch: int, at: Any = str
                       ) -> tuple[bytes, dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """Quantise one candidate, serialise it, and score the program loaded back from those bytes on val.

    Writes ``ptq/predictions_val_<name>.parquet``; returns (serialised bytes, result row, operator table,
    stored-bytes table).
    """
    from ..nets import predict

    graph, seen = quantise(exported, candidate, batches, example)
    if seen != n_rows:
        raise RuntimeError(f"candidate {candidate.name}: calibrated on {seen} rows, expected {n_rows}")
    blob = serialise(graph, example, max_batch)
    model_state = sha256_bytes(blob)
    program = load_program(blob).module()
    ops = quantised_ops(program)
    record = predict.predict(_callable(int8_graph.executable(program)), val_rows, cfg, model_state,
                             desc=f"{candidate.name} val")
    ch.write_parquet(at(f"ptq/predictions_val_{candidate.name}.parquet"), record)
    scores = predict.score(record)
    result = {"candidate": candidate.name, "order": candidate.order, "activations": candidate.activations,
              "per_channel": candidate.per_channel, "float_modules": " ".join(candidate.float_modules),
              "fuse_relu6": candidate.fuse_relu6,
              "declared_rows": candidate.calibration_rows,
              "calibration_rows": n_rows, "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
              "agreement": agreement(record["pred"], float_val["pred"]), "serialised_bytes": len(blob),
              "model_state": model_state, **summarise_ops(ops)}
    return (blob, result, ops.assign(candidate=candidate.name),
            stored_bytes(program).assign(candidate=candidate.name))


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Quantise every regime's compact model (:mod:`.regimes`): the shipped regime's record is
    ``ptq/ptq.json`` and names the others' (``ptq/<regime>/ptq.json``)."""
    from ..training import regimes

    params = ptq_params(ctx, **options)
    items = regimes.of_run(ctx)
    others = {r.name: run_regime(ctx, params, r) for r in items if not r.shipped}
    return run_regime(ctx, params, regimes.shipped(items), others)


def regime_summary(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """What the shipped record says about another regime's quantisation (its own record has the rest)."""
    return {"record": f"{FOLDER}/{name}/{FOLDER}.json", "selected": record["selected"],
            "figures": {k: v for k, v in record["figures"].items() if k != "gate"}}


def run_regime(ctx: RunContext, params: dict[str, Any], regime: Any,
               others: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Quantise one regime's compact model with every declared candidate, select on validation, score
    on test; its files sit under ``regime.path`` (the plain paths for the shipped regime)."""
    from ..core import metrics
    from ..core.imaging import ImageSpec
    from ..nets import predict
    from ..split import load_frozen

    at = regime.path
    ch = Chapter(ctx.run_dir, "ptq", folder=regime.folder("ptq"))
    frozen = load_frozen(ch)
    candidates, gate = parse_candidates(params), Gate.from_section(params)
    max_batch, batch_size = int(params["max_batch"]), int(params["batch_size"])
    # a field-adapted model is calibrated on its own training rows (lab + field) and selected on its own
    # validation rows: the INT8 ranges must cover the orchard photos it was adapted to
    with_field = regime.uses_field_train
    train_rows = frozen.rows_for("train", field_train=with_field)
    val_rows = frozen.rows_for("val", field_train=with_field)
    split_rows = pd.concat([frozen.rows_for(s, field_train=with_field) for s in ("train", "val", "test")],
                           ignore_index=True)
    declared = declaration(candidates, gate, len(train_rows), int(params["calibration_seed"]), max_batch)
    ch.write_json(at("ptq/candidates.json"), declared)  # before any model is quantised

    spec = ImageSpec.from_section(ctx.section("image"))
    cfg = predict.PredictConfig.from_ctx(ctx, batch_size=batch_size, progress=bool(params.get("progress")))
    model, state, compact_sha = load_compact(ch, len(frozen.class_names), spec.size, at(CHECKPOINT))
    example = torch.zeros((2, 3, spec.size, spec.size))
    float_val = float_record(ch, at(FLOAT_VAL), compact_sha, val_rows)
    float_scores = predict.score(float_val)
    # The baseline is training's record; re-scoring the float model here shows this chapter's pipeline
    # (loading contract, batching) reproduces it.
    # Val is scored three times (float, each candidate): decoded once (data.SquareCache), test never cached.
    val_cfg = replace(cfg, cache=True)
    # channels-last input, as training scored it (nets.models.for_inference), the weights left as they are:
    # this model is exported next
    rescored = predict.predict(model, val_rows, replace(val_cfg, channels_last=True), compact_sha,
                               desc="float val")
    reproduced = agreement(rescored["pred"], float_val["pred"])

    with ch.native_output(at(NATIVE_LOG)):  # torch / ExecuTorch notices at import go to the log, not the book
        exported = export_dynamic(model, example, max_batch)
    order = calibration_order(train_rows, int(params["calibration_seed"]))
    used = order.head(max(c.effective_rows(len(train_rows)) for c in candidates))
    assert_train_only(used, split_rows)
    position = np.arange(len(used))
    calibration_rows = used[["row_id", "rel_path", "label", "split", *(["source"] if with_field else [])]]
    ch.write_parquet(at("ptq/calibration_rows.parquet"), calibration_rows.assign(
        position=position,
        **{f"used_by_{c.name}": position < c.effective_rows(len(train_rows)) for c in candidates}))
    results, ops_tables, byte_tables, blobs = [], [], [], {}
    for candidate in candidates:
        calibration = order.head(candidate.effective_rows(len(train_rows)))
        assert_train_only(calibration, split_rows)
        batches = image_batches(calibration, ctx.source_roots, spec, batch_size) if candidate.static else []
        with ch.native_output(at(NATIVE_LOG)):
            blob, result, ops, stored = evaluate_candidate(ch, exported, candidate, batches, len(calibration),
                                                           val_rows, float_val, val_cfg, example, max_batch,
                                                           at)
        drop = macro_f1_drop(float_scores["macro_f1"], result["macro_f1"])
        results.append({**result, "macro_f1_drop": drop})
        ops_tables.append(ops)
        byte_tables.append(stored)
        blobs[candidate.name] = blob

    ch.verify(at("ptq/candidates.json"))  # the declaration is what it was before any candidate was scored
    table = rank_candidates(apply_gate(pd.DataFrame(results), gate))
    selected, reason = select_candidate(table)
    chosen = table.iloc[0]
    if params["require_pass"] and not bool(chosen["passed"]):
        raise GateFailure(f"no quantisation candidate passed the validation gate ({reason}); "
                          "ptq.require_pass is set, so the chain stops here")
    atomic_write_bytes(ch.path(at(SELECTED)), blobs[selected])
    selected_sha = ch.record_output(at(SELECTED))
    program = int8_graph.load_executable(ch.path(at(SELECTED)).read_bytes())

    int8_test, access = score_locked_test(ch, _callable(program), selected_sha, "ptq", cfg,
                                         bool(params.get("test_override", False)),
                                         params.get("test_override_reason"), at(TEST_RECORD))
    float_test = float_record(ch, at(FLOAT_TEST), compact_sha, int8_test)
    labels = np.unique(int8_test["label"])
    paired = metrics.paired_bootstrap(int8_test["label"], float_test["pred"], int8_test["pred"], labels,
                                      len(frozen.class_names), n_boot=int(params["bootstrap"]),
                                      seed=int(params["seed"]), level=float(params["ci_level"]))
    paired_table = paired.table.assign(state_a="float compact", state_b="converted INT8 graph")
    delta = paired_table.set_index("metric").loc["macro_f1"]
    test = {"rows": len(int8_test), "access": access, "model_state": selected_sha,
            "float": predict.score(float_test), "int8": predict.score(int8_test),
            "agreement_with_float": agreement(int8_test["pred"], float_test["pred"]),
            "changed_rows": int((int8_test["pred"].to_numpy() != float_test["pred"].to_numpy()).sum()),
            "macro_f1_delta": float(delta["delta"]), "macro_f1_delta_lo": float(delta["lo"]),
            "macro_f1_delta_hi": float(delta["hi"]), "bootstrap": int(params["bootstrap"]),
            "ci_level": float(params["ci_level"]), "seed": int(params["seed"])}

    ch.write_parquet(at("ptq/candidates_table.parquet"), table)
    ch.write_parquet(at("ptq/ops.parquet"), pd.concat(ops_tables, ignore_index=True))
    ch.write_parquet(at("ptq/stored_bytes.parquet"), pd.concat(byte_tables, ignore_index=True))
    ch.write_parquet(at("ptq/test_paired.parquet"), paired_table)
    ch.save_figure(plot_gate(table, gate, selected), at("ptq/gate.png"))
    for name in others or {}:
        ch.verify(f"{FOLDER}/{name}/{FOLDER}.json")
    return ch.finish(
        figures={"gate": at("ptq/gate.png"), "selected": selected, "n_candidates": len(table),
                 "n_passed": int(table["passed"].sum()), "selected_passed_gate": bool(chosen["passed"]),
                 "selected_val_macro_f1_drop": float(chosen["macro_f1_drop"]),
                 "selected_val_agreement": float(chosen["agreement"]),
                 "selected_int8_weight_share": float(chosen["int8_weight_share"]),
                 "test_agreement_with_float": test["agreement_with_float"],
                 "test_changed_rows": test["changed_rows"], "test_macro_f1_delta": test["macro_f1_delta"],
                 "test_macro_f1_delta_lo": test["macro_f1_delta_lo"],
                 "test_macro_f1_delta_hi": test["macro_f1_delta_hi"]},
        selected=selected, reason=reason, selection_rule=SELECTION_RULE, gate=asdict(gate),
        quantizer_patterns=quantizer_patterns(),
        candidates_fingerprint=declared["fingerprint"], require_pass=bool(params["require_pass"]),
        candidates=table.to_dict("records"),
        float_val={**float_scores, "reproduced_by_this_chapter": reproduced},
        compact={"checkpoint": at(CHECKPOINT), "sha256": compact_sha, "arch": state["arch"],
                 "num_classes": int(state["num_classes"]), "image_size": spec.size},
        selected_graph={"path": at(SELECTED), "sha256": selected_sha, "bytes": len(blobs[selected]),
                        "max_batch": max_batch},
        calibration={"split": "train", "seed": int(params["calibration_seed"]), "n_train": len(train_rows),
                     "nested_prefixes": True},
        test=test, regime=regime.name,
        regimes={name: regime_summary(name, other) for name, other in (others or {}).items()},
    )
