"""What got quantised: per-operator counts and stored bytes of a converted graph; the quantizer's patterns.

Kept apart from the flow that makes the graph: these read an FX graph's nodes and attributes only, for the
chapter's ``ptq/ops.parquet`` / ``ptq/stored_bytes.parquet`` tables and the record's summary figures.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

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


def summarise_ops(ops: pd.DataFrame) -> dict[str, Any]:
    weights = int(ops["weight_params"].sum())
    return {"compute_nodes": int(ops["nodes"].sum()), "quantised_nodes": int(ops["quantised"].sum()),
            "int8_weight_nodes": int(ops["int8_weights"].sum()), "weight_params": weights,
            "int8_weight_params": int(ops["int8_weight_params"].sum()),
            "int8_weight_share": float(ops["int8_weight_params"].sum() / weights) if weights else 0.0}
