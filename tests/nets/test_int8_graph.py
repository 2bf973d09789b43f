from __future__ import annotations

import collections

import pytest
import torch

from cropcop_utils import ptq as quant
from cropcop_utils.nets import int8_graph
from cropcop_utils.nets.models import create_model

SIZE = 32


def _targets(graph: torch.fx.GraphModule) -> collections.Counter:
    return collections.Counter(str(n.target) for n in graph.graph.nodes if n.op == "call_function")


@pytest.fixture(scope="module", params=["test_efficientnet", "tf_efficientnet_lite0"])
def converted(request) -> tuple[torch.fx.GraphModule, bytes]:
    """A static per-channel INT8 graph (with residual adds: one int8 tensor feeding two dequantize ops)."""
    torch.manual_seed(0)
    model = create_model(request.param, 5).eval()
    example = torch.zeros(2, 3, SIZE, SIZE)
    exported = quant.export_dynamic(model, example, max_batch=8)
    candidate, = quant.parse_candidates(
        {"candidates": [{"name": "s", "activations": "static", "calibration_rows": 8}]})
    graph, _ = quant.quantise(exported, candidate, [torch.randn(8, 3, SIZE, SIZE)], example)
    blob = quant.serialise(graph, example, max_batch=8)
    return int8_graph.load_program(blob).module(), blob


def test_the_rewritten_graph_gives_the_same_logits_bit_for_bit(converted):
    graph, blob = converted
    fast = int8_graph.load_executable(blob)
    torch.manual_seed(1)
    for batch in (torch.randn(5, 3, SIZE, SIZE) * 3, torch.rand(1, 3, SIZE, SIZE),
                  torch.zeros(2, 3, SIZE, SIZE)):
        with torch.inference_mode():
            assert torch.equal(fast(batch), graph(batch))


def test_every_quantize_dequantize_pair_and_weight_is_rewritten(converted):
    graph, _ = converted
    before = _targets(graph)
    fast = int8_graph.executable(graph)
    after = _targets(fast)
    rewrite = fast.meta["cropcop_int8_rewrite"]
    assert rewrite["activation_pairs"] == before["quantized_decomposed.quantize_per_tensor.default"] > 0
    assert rewrite["weights"] == before["quantized_decomposed.dequantize_per_channel.default"] > 0
    assert not [t for t in after if t.startswith("quantized_decomposed.")]
    # the source graph is untouched: chapter 6's operator table still counts its quantised ops
    assert _targets(graph) == before


def test_quantize_dequantize_matches_the_decomposed_ops_on_rounding_edges():
    q, dq, _ = int8_graph._ops()
    scale, zero_point = 0.0173, -3
    # values at and around every rounding boundary, and far outside the int8 range
    grid = (torch.arange(-300, 300, dtype=torch.float32) + 0.5) * scale
    x = torch.cat([grid, torch.nextafter(grid, grid + 1), torch.nextafter(grid, grid - 1),
                   torch.tensor([1e6, -1e6, 3e38, -3e38, float("inf"), float("-inf"), 0.0, -0.0])])
    expected = dq(q(x, scale, zero_point, -128, 127, torch.int8), scale, zero_point, -128, 127, torch.int8)
    assert torch.equal(int8_graph.quantize_dequantize(x, scale, zero_point, -128, 127), expected)
