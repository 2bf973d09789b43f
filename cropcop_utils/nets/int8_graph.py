"""The converted INT8 graph, executed twice as fast with bit-identical logits.

A PT2E-converted graph simulates integer arithmetic with ``quantized_decomposed`` ops, which torch runs
as chains of separate elementwise kernels: every activation goes through multiply, round, add, clamp, a
cast to int8 and back, subtract and multiply, each allocating a new tensor, and every weight is
dequantised again on every call.  On a CPU those ops take three quarters of the graph's time (profile of
the tomato Lite0 graph: convolutions 18 %).  ``executable`` rewrites a copy of the graph so that

- each constant weight is dequantised once, when the graph is loaded, with the graph's own op;
- each activation's quantize -> dequantize pair becomes one call of :func:`quantize_dequantize`, which
  gives the same float32 values in place, without the int8 round trip (exact: the values cast are
  integers within the int8 range).

No fused library kernel does this exactly: ``torch.fake_quantize_per_tensor_affine`` rounds
``x * inv_scale + zero_point`` with a float32 ``1 / scale``, which differs from the decomposed ops in the
last bit on rare inputs; a graph that scores the "converted INT8 graph" state must give its logits.
The rewrite is checked where it is used: ``tests/test_int8_graph.py`` compares logits bit for bit.
"""

from __future__ import annotations

import copy
import io
from typing import Any

import torch
import torch.fx

WEIGHT_PREFIX = "_cropcop_dequantised_weight_"


def _ops() -> tuple[Any, Any, Any]:
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers quantized_decomposed.*)

    ns = torch.ops.quantized_decomposed
    return (ns.quantize_per_tensor.default, ns.dequantize_per_tensor.default,
            ns.dequantize_per_channel.default)


def quantize_dequantize(x: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                        quant_max: int) -> torch.Tensor:
    """``dequantize_per_tensor(quantize_per_tensor(x, ...), ...)`` bit for bit, in four passes over x."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    t = x.mul(1.0 / scale)
    # clamp(round(.) + zp, min, max) - zp as one clamp to [min - zp, max - zp]: the same floats (the rounded
    # values are integers; where adding zp would round, |value| > 2**24, both clamp to the same bound) in
    # two passes over the activation fewer
    t.round_().clamp_(quant_min - zero_point, quant_max - zero_point)
    return t.mul_(scale)


def _constant(gm: torch.fx.GraphModule, arg: Any) -> Any:
    return getattr(gm, arg.target) if isinstance(arg, torch.fx.Node) else arg


def executable(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A rewritten copy of a converted graph (``ExportedProgram.module()``); the original is untouched.

    Records what it rewrote in ``meta["cropcop_int8_rewrite"]`` ({"weights": n, "activation_pairs": m}).
    """
    quantize, dequantize, dequantize_channel = _ops()
    gm = copy.deepcopy(graph)
    g = gm.graph
    weights = pairs = 0
    for node in list(g.nodes):
        constant_inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if (node.op == "call_function" and node.target == dequantize_channel
                and all(a.op == "get_attr" for a in constant_inputs)):
            name = f"{WEIGHT_PREFIX}{weights}"
            weight = dequantize_channel(*[_constant(gm, a) for a in node.args], **node.kwargs)
            gm.register_buffer(name, weight)
            with g.inserting_before(node):
                node.replace_all_uses_with(g.get_attr(name))
            g.erase_node(node)
            weights += 1
    for node in list(g.nodes):
        if node.op != "call_function" or node.target != quantize or node.kwargs:
            continue
        users = list(node.users)
        same = all(u.op == "call_function" and u.target == dequantize and not u.kwargs
                   and tuple(u.args[1:]) == tuple(node.args[1:]) for u in users)
        if not users or not same:
            continue  # an int8 tensor used otherwise keeps the decomposed ops
        with g.inserting_before(users[0]):
            fused = g.call_function(quantize_dequantize, (node.args[0], *node.args[1:5]))
        for user in users:
            user.replace_all_uses_with(fused)
            g.erase_node(user)
        g.erase_node(node)
        pairs += 1
    g.eliminate_dead_code()
    g.lint()
    gm.recompile()
    gm.meta["cropcop_int8_rewrite"] = {"weights": weights, "activation_pairs": pairs}
    return gm


def load_program(data: bytes) -> Any:
    """An ``ExportedProgram`` from ``torch.export.save`` bytes (the registered ``ptq/selected.pt2``)."""
    # The graph calls quantized_decomposed.* ops; importing the PT2E module registers them, without
    # which a fresh process (chapter 7's kernel) cannot deserialise the file.
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401

    return torch.export.load(io.BytesIO(data))


def load_executable(data: bytes) -> torch.fx.GraphModule:
    """The registered ``ptq/selected.pt2`` bytes as a graph ready to score (see :func:`executable`)."""
    return executable(load_program(data).module())
