"""Chapter 6: post-training quantisation of the compact model (PT2E, XNNPACK), selected on validation only.

The candidates are declared in the profile's ``ptq`` section and written, with a fingerprint, to
``ptq/candidates.json`` before any model is quantised.  Each candidate goes through the PT2E flow —
``torch.export`` with a dynamic batch dimension, ``XNNPACKQuantizer``, ``prepare_pt2e``, calibration,
``convert_pt2e`` — and is then re-exported and serialised (``torch.export.save``); the serialised bytes
are loaded back and *that* program is what gets scored, so the SHA-256 in every prediction record names
exactly the graph that made the predictions.

Selection uses the validation split only: a gate (maximum macro-F1 drop against the float model,
minimum top-1 agreement with it) passes or fails each candidate; passing candidates rank before failing
ones, then higher validation macro-F1 first; a tie on macro-F1 goes to the candidate with fewer
calibration rows (the simpler recipe, less data depended on), then to the earlier declared candidate.
Only the selected graph reads the locked test split (through :mod:`cropcop_utils.locked_test`).

Calibration rows come from the training split only; :func:`assert_train_only` checks it against the
frozen split before any calibration image is opened.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from . import int8_graph
from .config import RunContext, progress_wanted
from .evidence import Chapter, atomic_write_bytes, sha256_bytes, sha256_json

FOLDER = "ptq"
ACTIVATIONS = ("dynamic", "static")
SELECTION_RULE = ("gate passed first; then higher validation macro-F1; a macro-F1 tie goes to fewer "
                  "effective calibration rows, then to the earlier declared candidate")
# Macro-F1 values are compared at this many decimals, so float noise never breaks a true tie.
TIE_DECIMALS = 12
# The gate compares in points (percent) rounded to this many decimals: 0.87 - 0.86 is 1.0000000000000009
# points in floating point and must sit *on* a 1-point limit, while any real metric difference (at least
# 1 / rows, i.e. 1e-4 points even at a million rows) stays far above 1e-9 points.
GATE_DECIMALS = 9
MIN_MAX_BATCH = 4  # a dynamic batch bound of 2 (the export example) lowers to a program fixed at 2
DEFAULTS: dict[str, Any] = {"calibration_seed": 0, "batch_size": 32, "max_batch": 64, "bootstrap": 1000,
                            "seed": 0, "ci_level": 0.95, "require_pass": False}


class PTQConfigError(ValueError):
    """The profile's ``ptq`` section is missing or declares an invalid candidate or gate."""


class CalibrationLeak(RuntimeError):
    """A calibration row is not a training row of the frozen split (val / test must never calibrate)."""


class GateFailure(RuntimeError):
    """``ptq.require_pass`` is set and no candidate passed the validation gate."""


class CheckpointMismatch(ValueError):
    """The compact checkpoint does not fit the frozen split or the profile's image size."""


# --------------------------------------------------------------------------- declaration
@dataclass(frozen=True)
class Candidate:
    """One predeclared quantisation recipe.  ``calibration_rows`` is the profile's (declared) count."""

    name: str
    activations: str          # "dynamic": activation ranges computed at run time; "static": calibrated
    per_channel: bool         # weights: one scale per output channel (True) or per tensor
    calibration_rows: int
    order: int                # position in the profile: the last tie-break

    @property
    def static(self) -> bool:
        return self.activations == "static"

    def effective_rows(self, n_train: int) -> int:
        """The declared count capped at the training split's size (small corpora scale down)."""
        return min(self.calibration_rows, int(n_train)) if self.static else 0


def parse_candidates(section: dict[str, Any]) -> list[Candidate]:
    """The candidates of a profile's ``ptq`` section, validated, in declared order."""
    declared = section.get("candidates")
    if not declared:
        raise PTQConfigError("the profile's ptq section declares no candidates (ptq.candidates): the "
                             "quantisation candidates must be declared before the chapter runs")
    candidates, seen = [], set()
    for order, entry in enumerate(declared):
        name = str(entry.get("name", ""))
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise PTQConfigError(f"ptq.candidates[{order}].name = {name!r}: use a-z, 0-9 and _ only")
        if name in seen:
            raise PTQConfigError(f"ptq.candidates: the name {name!r} is declared twice")
        seen.add(name)
        activations = entry.get("activations")
        if activations not in ACTIVATIONS:
            raise PTQConfigError(f"ptq candidate {name!r}: activations must be one of {ACTIVATIONS}, "
                                 f"got {activations!r}")
        rows = int(entry.get("calibration_rows", 0))
        if activations == "dynamic" and rows != 0:
            raise PTQConfigError(f"ptq candidate {name!r}: dynamic activations need no calibration rows, "
                                 f"got calibration_rows = {rows}")
        if activations == "static" and rows < 1:
            raise PTQConfigError(f"ptq candidate {name!r}: static activations need calibration_rows >= 1")
        candidates.append(Candidate(name, activations, bool(entry.get("per_channel", True)), rows, order))
    return candidates


@dataclass(frozen=True)
class Gate:
    """The validation gate: both criteria must hold.  Values are fractions (0.01 = 1 point).

    Both sides of each comparison are converted to points (percent) and rounded to ``points_decimals``
    first (:func:`gate_points`), so a drop equal to the limit up to floating-point noise is on the
    boundary, and the boundary passes.  The precision is part of the declared (fingerprinted) gate.
    """

    max_macro_f1_drop: float
    min_agreement: float
    points_decimals: int = GATE_DECIMALS

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> Gate:
        gate = section.get("gate") or {}
        missing = {"max_macro_f1_drop", "min_agreement"} - set(gate)
        if missing:
            raise PTQConfigError(f"ptq.gate lacks {sorted(missing)}; declare max_macro_f1_drop and "
                                 "min_agreement (fractions) in the profile")
        made = cls(float(gate["max_macro_f1_drop"]), float(gate["min_agreement"]))
        if made.max_macro_f1_drop < 0 or not 0.0 <= made.min_agreement <= 1.0:
            raise PTQConfigError(f"ptq.gate out of range: {made}")
        return made

    def verdict(self, macro_f1_drop: float, agreement: float) -> tuple[bool, str]:
        """(passed, why) for one candidate's validation drop and agreement."""
        drop, limit = f"{100 * macro_f1_drop:.2f} pt", f"{100 * self.max_macro_f1_drop:.2f} pt"
        agree, floor = f"{100 * agreement:.2f}%", f"{100 * self.min_agreement:.2f}%"
        decimals = self.points_decimals
        failures = []
        if gate_points(macro_f1_drop, decimals) > gate_points(self.max_macro_f1_drop, decimals):
            failures.append(f"macro-F1 drop {drop} > {limit}")
        if gate_points(agreement, decimals) < gate_points(self.min_agreement, decimals):
            failures.append(f"agreement {agree} < {floor}")
        if failures:
            return False, "fails: " + "; ".join(failures)
        return True, f"passes: macro-F1 drop {drop} ≤ {limit}, agreement {agree} ≥ {floor}"


def gate_points(fraction: float, decimals: int = GATE_DECIMALS) -> float:
    """A fraction in points (percent), rounded to the gate's declared precision."""
    return round(100.0 * float(fraction), int(decimals))


def macro_f1_drop(float_macro_f1: float, candidate_macro_f1: float) -> float:
    """How much macro-F1 a candidate loses against the float model (negative: it gains)."""
    return float(float_macro_f1) - float(candidate_macro_f1)


def declaration(candidates: Sequence[Candidate], gate: Gate, n_train: int, calibration_seed: int,
                max_batch: int) -> dict[str, Any]:
    """What ``ptq/candidates.json`` records: the declaration, its fingerprint, the effective counts.

    The fingerprint covers only what the profile declared (candidates, gate, rule, seed), so the same
    declaration on another corpus has the same fingerprint; effective counts are recorded beside it.
    """
    declared = {"candidates": [asdict(c) for c in candidates], "gate": asdict(gate),
                "selection_rule": SELECTION_RULE, "calibration_seed": int(calibration_seed),
                "calibration_split": "train", "max_batch": int(max_batch)}
    return {"fingerprint": sha256_json(declared), **declared, "n_train": int(n_train),
            "effective_calibration_rows": {c.name: c.effective_rows(n_train) for c in candidates}}


# --------------------------------------------------------------------------- calibration rows
def calibration_order(train_rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A seeded permutation of the training rows; each static candidate takes a prefix of it.

    The prefixes are nested (the smaller set is part of the larger), so two static candidates differ in
    how many rows they saw, not in which.  The rows are sorted by ``row_id`` first so the order does not
    depend on how the frame arrived.
    """
    if "split" in train_rows and (train_rows["split"] != "train").any():
        bad = sorted(set(train_rows.loc[train_rows["split"] != "train", "split"]))
        raise CalibrationLeak(f"calibration_order was handed rows of split(s) {bad}; pass only "
                              "FrozenSplit.rows_for('train')")
    ordered = train_rows.sort_values("row_id", kind="stable").reset_index(drop=True)
    permutation = np.random.default_rng(seed).permutation(len(ordered))
    return ordered.iloc[permutation].reset_index(drop=True)


def assert_train_only(calibration: pd.DataFrame, split_rows: pd.DataFrame) -> None:
    """Raise :class:`CalibrationLeak` unless every calibration row is a training row of the frozen split."""
    split_of = dict(zip(split_rows["row_id"], split_rows["split"], strict=True))
    found = pd.Series([split_of.get(r, "absent") for r in calibration["row_id"]], dtype=object)
    if (found != "train").any():
        counts = found[found != "train"].value_counts().to_dict()
        example = calibration["row_id"].iloc[int(np.flatnonzero((found != "train").to_numpy())[0])]
        raise CalibrationLeak(f"{int((found != 'train').sum())} calibration row(s) are not training rows "
                              f"of split/split.parquet ({counts}; e.g. row_id {example}). Calibration may "
                              "only use the train split; validation and test rows never calibrate.")


# --------------------------------------------------------------------------- PT2E flow
def batch_dim(max_batch: int) -> Any:
    """The dynamic batch dimension every export uses (min 1, so a single image runs too)."""
    return torch.export.Dim("batch", min=1, max=int(max_batch))


def export_dynamic(module: torch.nn.Module, example: torch.Tensor, max_batch: int) -> Any:
    """``torch.export`` with a dynamic batch dimension; without it batched calibration/evaluation fails."""
    if example.shape[0] < 2:
        raise ValueError("export with an example batch of at least 2 rows (a batch of 1 specialises to 1)")
    return torch.export.export(module, (example,), dynamic_shapes=({0: batch_dim(max_batch)},))


def quantizer_for(candidate: Candidate) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=candidate.per_channel,
                                               is_dynamic=candidate.activations == "dynamic")
    return XNNPACKQuantizer().set_global(config)


def quantise(exported: Any, candidate: Candidate, calibration: Iterable[torch.Tensor],
             example: torch.Tensor) -> tuple[torch.fx.GraphModule, int]:
    """Prepare → calibrate → convert the float ``exported`` program (from :func:`export_dynamic`).

    Returns the converted graph and the number of rows it calibrated on.  The float program is exported
    once and deep-copied per candidate (``prepare_pt2e`` folds batch norm into the weights of the graph it
    is given).  Dynamic candidates see no image: their weight observers (the only ones that keep state)
    still need one forward pass to record each channel's range, so they get a single all-zero batch —
    weights do not depend on the input, and activation ranges are computed at run time.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(copy.deepcopy(exported.module()), quantizer_for(candidate))
    seen = 0
    with torch.no_grad():
        if candidate.static:
            for batch in calibration:
                prepared(batch)
                seen += int(batch.shape[0])
            if seen == 0:
                raise ValueError(f"static candidate {candidate.name!r} got no calibration batch")
        else:
            prepared(torch.zeros((1, *example.shape[1:]), dtype=example.dtype))
    return convert_pt2e(prepared), seen


def quantizer_patterns() -> dict[str, list[str]]:
    """The XNNPACK quantizer's annotation patterns, split by whether a dynamic config applies them.

    With dynamic activations only the patterns marked dynamic are annotated (bare conv / linear); the
    fused ones (conv → relu, add, pooling, ...) are static-only, which is why a dynamic candidate leaves
    every conv that feeds a ReLU in float.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    patterns = XNNPACKQuantizer.SUPPORTED_PATTERNS
    return {"dynamic": [p.name for p in patterns if p.is_dynamic],
            "static_only": [p.name for p in patterns if not p.is_dynamic]}


def serialise(graph: torch.nn.Module, example: torch.Tensor, max_batch: int) -> bytes:
    """The converted graph re-exported (dynamic batch) and saved with ``torch.export.save``, as bytes.

    Node provenance (``from_node``) records the Python ``id()`` of the graphs a node passed through, so
    two identical quantisations would serialise to different bytes; it is dropped, which makes the
    SHA-256 — the model-state identity the locked test counts accesses by — a function of the graph alone.
    """
    exported = export_dynamic(graph, example, max_batch)
    for module in exported.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                node.meta.pop("from_node", None)
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return buffer.getvalue()


def load_program(data: bytes) -> Any:
    """An ``ExportedProgram`` from ``torch.export.save`` bytes (the registered ``ptq/selected.pt2``)."""
    # The graph calls quantized_decomposed.* ops; importing the PT2E module registers them, without
    # which a fresh process (chapter 7's kernel) cannot deserialise the file.
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401

    return torch.export.load(io.BytesIO(data))


# --------------------------------------------------------------------------- what got quantised
_QUANT_PREFIX = "quantized_decomposed."
_ACTIVATIONS = {"relu", "relu6", "hardtanh", "silu", "hardswish", "gelu", "sigmoid", "hardsigmoid"}


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))
    return str(name).split(".")[-1].rstrip("_")


def _is_qdq(node: Any, kind: str) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and str(node.target).startswith(_QUANT_PREFIX + kind))


def _attr(graph: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor | None:
    if node.op != "get_attr":
        return None
    value: Any = graph
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value if isinstance(value, torch.Tensor) else None


def _weight(graph: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[torch.Tensor | None, bool]:
    """The weight tensor of a conv/linear node and whether it is stored as int8 behind a dequantize."""
    if len(node.args) < 2 or not isinstance(node.args[1], torch.fx.Node):
        return None, False
    source = node.args[1]
    if _is_qdq(source, "dequantize") and isinstance(source.args[0], torch.fx.Node):
        tensor = _attr(graph, source.args[0])
        return tensor, tensor is not None and tensor.dtype == torch.int8
    return _attr(graph, source), False


def _conv_kind(weight: torch.Tensor | None, groups: int) -> str:
    if weight is None:
        return "conv2d"
    if groups > 1:
        return "conv2d depthwise" if weight.shape[1] == 1 else "conv2d grouped"
    height, width = weight.shape[2:]
    return f"conv2d {height}×{width}"


def quantised_ops(graph: torch.fx.GraphModule) -> pd.DataFrame:
    """Per operator type: nodes, nodes reading a dequantized input, nodes with int8 weights, parameters.

    A node counts as quantised when one of its inputs comes out of a ``dequantize`` (the quantizer wrapped
    it); conv2d is split by shape (1×1, k×k, depthwise) because XNNPACK's patterns treat them differently.
    """
    rows: dict[str, dict[str, int]] = {}
    for node in graph.graph.nodes:
        if node.op != "call_function" or str(node.target).startswith(_QUANT_PREFIX):
            continue
        name = _op_name(node)
        if name in {"getitem", "sym_size"}:
            continue
        weight, int8_weight = (None, False)
        if name in {"conv2d", "linear"}:
            weight, int8_weight = _weight(graph, node)
            if name == "conv2d":
                groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
                name = _conv_kind(weight, int(groups))
            # XNNPACK's patterns match "conv → activation" apart from a bare conv: show which one it is.
            users = list(node.users)
            if len(users) == 1 and users[0].op == "call_function" and _op_name(users[0]) in _ACTIVATIONS:
                name += f" → {_op_name(users[0])}"
        inputs = [a for a in node.all_input_nodes]
        entry = rows.setdefault(name, {"nodes": 0, "quantised": 0, "int8_weights": 0, "weight_params": 0,
                                       "int8_weight_params": 0})
        entry["nodes"] += 1
        entry["quantised"] += int(any(_is_qdq(a, "dequantize") for a in inputs))
        entry["int8_weights"] += int(int8_weight)
        if weight is not None:
            entry["weight_params"] += int(weight.numel())
            entry["int8_weight_params"] += int(weight.numel()) if int8_weight else 0
    table = pd.DataFrame([{"op": k, **v} for k, v in rows.items()],
                         columns=["op", "nodes", "quantised", "int8_weights", "weight_params",
                                  "int8_weight_params"])
    return table.sort_values(["weight_params", "nodes"], ascending=False, ignore_index=True)


def stored_bytes(graph: torch.fx.GraphModule) -> pd.DataFrame:
    """Bytes of every tensor the graph stores (weights, biases, scales), by dtype."""
    seen: dict[str, torch.Tensor] = {}
    for node in graph.graph.nodes:
        # Unused attributes (the float originals an unlifted program still carries) are not stored data.
        tensor = _attr(graph, node) if node.users else None
        if tensor is not None:
            seen.setdefault(str(node.target), tensor)
    frame = pd.DataFrame([{"dtype": str(t.dtype).removeprefix("torch."), "tensors": 1,
                           "elements": t.numel(), "bytes": t.numel() * t.element_size()}
                          for t in seen.values()], columns=["dtype", "tensors", "elements", "bytes"])
    return frame.groupby("dtype", as_index=False).sum().sort_values("bytes", ascending=False,
                                                                     ignore_index=True)


# --------------------------------------------------------------------------- gate and selection
def apply_gate(table: pd.DataFrame, gate: Gate) -> pd.DataFrame:
    """Add ``passed`` and ``verdict`` to a table with ``macro_f1_drop`` and ``agreement`` per candidate."""
    out = table.copy()
    verdicts = [gate.verdict(float(d), float(a)) for d, a in zip(out["macro_f1_drop"], out["agreement"],
                                                                 strict=True)]
    out["passed"] = [v[0] for v in verdicts]
    out["verdict"] = [v[1] for v in verdicts]
    return out


def rank_candidates(table: pd.DataFrame) -> pd.DataFrame:
    """Order by the selection rule; adds ``rank`` (1 = selected).

    Needs ``candidate``, ``passed``, ``macro_f1``, ``calibration_rows`` (effective) and ``order``.
    """
    if table.empty:
        raise ValueError("no candidates to rank")
    key = table.assign(_f1=table["macro_f1"].round(TIE_DECIMALS), _fail=~table["passed"].astype(bool))
    ranked = key.sort_values(["_fail", "_f1", "calibration_rows", "order"],
                             ascending=[True, False, True, True], kind="stable")
    ranked = ranked.drop(columns=["_f1", "_fail"]).reset_index(drop=True)
    ranked["rank"] = np.arange(1, len(ranked) + 1)
    return ranked


def select_candidate(table: pd.DataFrame) -> tuple[str, str]:
    """(selected candidate name, the reason in words) by :func:`rank_candidates`."""
    ranked = rank_candidates(table)
    best = ranked.iloc[0]
    group = ranked[ranked["passed"] == best["passed"]]
    f1 = f"validation macro-F1 {100 * best['macro_f1']:.2f}"
    if best["passed"]:
        reason = (f"{best['candidate']} passed the gate and has the highest {f1} of the {len(group)} "
                  f"passing candidate(s)")
    else:
        reason = (f"no candidate passed the gate; {best['candidate']} has the highest {f1} of all "
                  f"{len(ranked)} ({best['verdict']})")
    tied = group[(group["macro_f1"].round(TIE_DECIMALS) == round(float(best["macro_f1"]), TIE_DECIMALS))
                 & (group["candidate"] != best["candidate"])]
    if len(tied):
        reason += (f"; tied on macro-F1 with {', '.join(tied['candidate'])}, and the tie-break prefers fewer "
                   f"calibration rows ({int(best['calibration_rows'])}), then the declared order")
    return str(best["candidate"]), reason + "."


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


def image_batches(rows: pd.DataFrame, corpus_root: Any, spec: Any, batch_size: int,
                  progress: bool = False, desc: str = "images") -> Iterator[torch.Tensor]:
    """Calibration batches: the rows' images under the loading contract (``data.EvalImages``), in order."""
    from tqdm import tqdm

    from .data import EvalImages

    dataset = EvalImages(rows, corpus_root, spec)
    for start in tqdm(range(0, len(dataset), batch_size), desc=desc, unit="batch",
                      disable=not progress_wanted(progress), leave=False):
        yield torch.stack([dataset[i][0] for i in range(start, min(start + batch_size, len(dataset)))])


# --------------------------------------------------------------------------- figure
def plot_gate(table: pd.DataFrame, gate: Gate, selected: str) -> Figure:
    """Each candidate's validation macro-F1 drop against its agreement with the float model."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    drops = 100 * table["macro_f1_drop"].to_numpy(dtype=float)
    agree = 100 * table["agreement"].to_numpy(dtype=float)
    x_hi = max(float(drops.max(initial=0.0)), 100 * gate.max_macro_f1_drop) * 1.3 + 0.1
    y_lo = min(float(agree.min(initial=100.0)), 100 * gate.min_agreement) - 1.0
    x_lo = min(-0.1, float(drops.min(initial=0.0)) - 0.1)
    ax.fill_between([x_lo, 100 * gate.max_macro_f1_drop], 100 * gate.min_agreement, 100.5, color="tab:green",
                    alpha=0.08, lw=0)
    ax.axvline(100 * gate.max_macro_f1_drop, color="tab:green", ls="--", lw=1, label="gate")
    ax.axhline(100 * gate.min_agreement, color="tab:green", ls="--", lw=1)
    for k, (row, x, y) in enumerate(zip(table.itertuples(), drops, agree, strict=True)):
        chosen = row.candidate == selected
        ax.scatter([x], [y], s=80 if chosen else 40, marker="*" if chosen else "o",
                   color="tab:red" if chosen else ("tab:blue" if row.passed else "tab:gray"), zorder=3)
        # labels climb in rank order: candidates a few hundredths of a point apart stay readable
        ax.annotate(row.candidate + (" (selected)" if chosen else ""), (x, y), textcoords="offset points",
                    xytext=(6, 4 + 10 * (k % 3)), fontsize=8)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, 100.5)
    ax.set_xlabel("validation macro-F1 drop vs float (points)")
    ax.set_ylabel("top-1 agreement with float (%)")
    ax.set_title("Quantisation candidates against the validation gate (shaded: passes)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    return fig


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
    from . import checkpoint, models

    path = ch.verify(rel_path)
    state = checkpoint.load(path)
    if int(state.get("num_classes", -1)) != n_classes:
        raise CheckpointMismatch(f"{rel_path} has {state.get('num_classes')} classes, the frozen split "
                                 f"{n_classes}; rerun chapter 'training' (05_training)")
    if int(state.get("image_size", image_size)) != image_size:
        raise CheckpointMismatch(f"{rel_path} was trained at {state['image_size']} px, the profile's image "
                                 f"size is {image_size} px; rerun chapter 'training' (05_training)")
    model = models.create_model(state["arch"], n_classes)
    model.load_state_dict(state["model"])
    return model.eval(), state, ch.inputs[rel_path]


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


def summarise_ops(ops: pd.DataFrame) -> dict[str, Any]:
    weights = int(ops["weight_params"].sum())
    return {"compute_nodes": int(ops["nodes"].sum()), "quantised_nodes": int(ops["quantised"].sum()),
            "int8_weight_nodes": int(ops["int8_weights"].sum()), "weight_params": weights,
            "int8_weight_params": int(ops["int8_weight_params"].sum()),
            "int8_weight_share": float(ops["int8_weight_params"].sum() / weights) if weights else 0.0}


def score_locked_test(ch: Chapter, forward: Any, model_state: str, reader: str, cfg: Any,
                     override: bool, reason: str | None, rel_path: str) -> tuple[pd.DataFrame, str]:
    """The scored artifact's test record: reused when this exact state already wrote it, else read once.

    Returns (record, how) with how = "read" (through the locked test) or "reused".
    """
    from . import locked_test, predict
    from .evidence import read_registry

    target = ch.path(rel_path)
    if not override and rel_path in read_registry(ch.run_dir) and target.exists():
        frame = ch.read_parquet(rel_path)
        if len(frame) and (frame["model_state"] == model_state).all():
            return frame, "reused"
    rows = locked_test.read_test_rows(ch.run_dir, model_state, reader=reader, override=override,
                                      reason=reason)
    record = predict.predict(forward, rows, cfg, model_state, desc=f"{reader} test")
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
    from . import predict

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
              "per_channel": candidate.per_channel, "declared_rows": candidate.calibration_rows,
              "calibration_rows": n_rows, "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
              "agreement": agreement(record["pred"], float_val["pred"]), "serialised_bytes": len(blob),
              "model_state": model_state, **summarise_ops(ops)}
    return (blob, result, ops.assign(candidate=candidate.name),
            stored_bytes(program).assign(candidate=candidate.name))


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Quantise every regime's compact model (:mod:`.regimes`): the shipped regime's record is
    ``ptq/ptq.json`` and names the others' (``ptq/<regime>/ptq.json``)."""
    from . import regimes

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
    from . import metrics, predict
    from .imaging import ImageSpec
    from .split import load_frozen

    at = regime.path
    ch = Chapter(ctx.run_dir, "ptq", folder=regime.folder("ptq"))
    frozen = load_frozen(ch)
    candidates, gate = parse_candidates(params), Gate.from_section(params)
    max_batch, batch_size = int(params["max_batch"]), int(params["batch_size"])
    train_rows, val_rows = frozen.rows_for("train"), frozen.rows_for("val")
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
    rescored = predict.predict(model, val_rows, val_cfg, compact_sha, desc="float val")
    reproduced = agreement(rescored["pred"], float_val["pred"])

    with ch.native_output(at(NATIVE_LOG)):  # torch / ExecuTorch notices at import go to the log, not the book
        exported = export_dynamic(model, example, max_batch)
    order = calibration_order(train_rows, int(params["calibration_seed"]))
    used = order.head(max(c.effective_rows(len(train_rows)) for c in candidates))
    assert_train_only(used, frozen.rows)
    position = np.arange(len(used))
    calibration_rows = used[["row_id", "rel_path", "label", "split"]]
    ch.write_parquet(at("ptq/calibration_rows.parquet"), calibration_rows.assign(
        position=position,
        **{f"used_by_{c.name}": position < c.effective_rows(len(train_rows)) for c in candidates}))
    results, ops_tables, byte_tables, blobs = [], [], [], {}
    for candidate in candidates:
        calibration = order.head(candidate.effective_rows(len(train_rows)))
        assert_train_only(calibration, frozen.rows)
        batches = image_batches(calibration, ctx.corpus_root, spec, batch_size) if candidate.static else []
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
