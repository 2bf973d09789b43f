"""The shipped program's two outputs: the logits, and the pooled features its classifier reads.

Chapter 11's abstention scores what the model has seen through the distance of an input's features to
the training photos' (Mahalanobis, k nearest neighbours), so the program that ships must give them: its
``forward`` method returns ``(logits, features)`` (:data:`OUTPUT_NAMES`).  The selected INT8 graph of
chapter 6 returns logits only; :func:`with_feature_output` adds the classifier's input as a second output
before lowering, and nothing else changes (the logits are bit-identical to a program without it —
``tests/runtime/test_outputs.py``).

Why a new quantize/dequantize pair: in the converted graph the classifier reads a dequantized tensor
(``dequantize(quantize(pooled))``).  Returned as it is, that node is both an output and an input of a
delegated linear, and XNNPACK returns garbage for it (wrong values, an unresized batch dimension —
measured on Lite0, ExecuTorch 1.5).  A second pair with the same quantisation parameters is a plain
"dequantize at the boundary" output, which XNNPACK lowers correctly, and it gives the same INT8 grid
values the classifier reads.  A dynamically quantised graph quantises the features at each call (from
their own range); its output is the float features before that.  Chapter 7 checks the program's
outputs against the graph's (:func:`check_features`) and refuses a program whose features are wrong.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

OUTPUT_NAMES = ("logits", "features")
# XNNPACK's INT8 kernels round differently from the graph's decomposed ops, a few quantisation steps at
# most; a features output that did not lower (garbage) differs by more than its own largest value.
MAX_RELATIVE_GAP = 0.25


class ProgramOutputError(ValueError):
    """The graph's classifier input cannot be found, or the lowered program's features are not right."""


def _is(node: Any, *names: str) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and any(str(node.target).endswith(name) for name in names))


def classifier_input(graph: torch.fx.GraphModule) -> tuple[torch.fx.Node, torch.fx.Node]:
    """(logits node, the node the final linear layer reads) of a one-output classification graph."""
    output = next(n for n in graph.graph.nodes if n.op == "output")
    outputs = pytree.tree_leaves(output.args[0])
    if len(outputs) != 1:
        raise ProgramOutputError(f"the selected graph returns {len(outputs)} tensors; a classifier returns "
                                 "its logits only")
    node, seen = outputs[0], 0
    while not _is(node, "aten.linear.default", "aten.addmm.default"):
        if not isinstance(node, torch.fx.Node) or not node.args or seen > 8:
            raise ProgramOutputError("no linear classifier found behind the graph's logits (walked back "
                                     "through quantize/dequantize ops only)")
        node, seen = node.args[0], seen + 1
    features = node.args[1] if _is(node, "aten.addmm.default") else node.args[0]
    return outputs[0], features


def with_feature_output(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the converted graph (``ExportedProgram.module()``) returning ``(logits, features)``."""
    gm = copy.deepcopy(graph)
    g = gm.graph
    logits, features = classifier_input(gm)
    output = next(n for n in g.nodes if n.op == "output")
    source = features.args[0] if _is(features, "dequantize_per_tensor.default",
                                     "dequantize_per_tensor.tensor") else None
    with g.inserting_before(output):
        if _is(source, "quantize_per_tensor.default"):  # static: the INT8 grid values the classifier reads
            requantised = g.call_function(source.target, source.args, source.kwargs)
            features = g.call_function(features.target, (requantised, *features.args[1:]), features.kwargs)
        elif _is(source, "quantize_per_tensor.tensor"):  # dynamic: the float features it quantises per call
            features = source.args[0]
    output.args = ((logits, features),)
    # the unlifted module unflattens its outputs with this spec; two leaves now
    g._codegen.pytree_info = g._codegen.pytree_info._replace(out_spec=pytree.tree_structure((0, 0)))
    g.lint()
    gm.recompile()
    return gm


def check_features(program_outputs: list[torch.Tensor], graph_outputs: tuple[torch.Tensor, ...],
                   batch: int) -> dict[str, Any]:
    """The lowered program's two outputs against the graph's, on one batch: shapes must match (a
    program whose features output is not resized to the batch is refused), and how far they differ."""
    if len(program_outputs) != len(OUTPUT_NAMES):
        raise ProgramOutputError(f"the program returned {len(program_outputs)} outputs; expected "
                                 f"{', '.join(OUTPUT_NAMES)}")
    shapes = {name: list(out.shape) for name, out in zip(OUTPUT_NAMES, program_outputs, strict=True)}
    expected = {name: list(out.shape) for name, out in zip(OUTPUT_NAMES, graph_outputs, strict=True)}
    if shapes != expected or shapes["features"][0] != batch:
        raise ProgramOutputError(f"the program's outputs have shapes {shapes}, the graph's {expected} on a "
                                 f"batch of {batch}: the features output did not lower correctly")
    gap = (program_outputs[1] - graph_outputs[1]).abs()
    relative = float(gap.max() / graph_outputs[1].abs().max().clamp_min(1e-12))
    if relative > MAX_RELATIVE_GAP:
        raise ProgramOutputError(f"the program's features differ from the graph's by {relative:.0%} of their "
                                 "largest value: the features output did not lower correctly")
    return {"outputs": shapes, "batch_checked": batch, "features_max_abs_diff": float(gap.max()),
            "features_max_relative_diff": relative,
            "features_dim": int(shapes["features"][1])}
