"""Chapter 6 (PTQ): calibration rows (train only) and the PT2E flow on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from ptq_fixtures import ARCH, SIZE

from cropcop_utils import ptq as quant
from cropcop_utils.nets import int8_graph


# --------------------------------------------------------------------------- calibration rows
def _split_rows() -> pd.DataFrame:
    parts = ["train"] * 20 + ["val"] * 5 + ["test"] * 5
    return pd.DataFrame({"row_id": [f"r{i:02d}" for i in range(len(parts))], "split": parts})


def test_calibration_order_is_seeded_nested_and_train_only():
    rows = _split_rows()
    train = rows[rows["split"] == "train"]
    first = quant.calibration_order(train, seed=3)
    assert list(first["row_id"]) == list(quant.calibration_order(train.iloc[::-1], seed=3)["row_id"])
    assert list(first["row_id"]) != list(quant.calibration_order(train, seed=4)["row_id"])
    assert set(first["row_id"]) == set(train["row_id"])
    quant.assert_train_only(first.head(12), rows)
    with pytest.raises(quant.CalibrationLeak, match="rows_for"):
        quant.calibration_order(rows, seed=3)


@pytest.mark.parametrize("intruder", ["val", "test", "absent"])
def test_calibration_rows_from_val_test_or_nowhere_are_refused(intruder):
    rows = _split_rows()
    calibration = rows[rows["split"] == "train"].head(6)
    if intruder == "absent":
        calibration = pd.concat([calibration, pd.DataFrame({"row_id": ["nope"], "split": ["train"]})])
    else:
        calibration = pd.concat([calibration, rows[rows["split"] == intruder].head(1)])
    with pytest.raises(quant.CalibrationLeak, match=intruder):
        quant.assert_train_only(calibration, rows)


# --------------------------------------------------------------------------- PT2E flow on a tiny model
@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    from cropcop_utils.nets.models import create_model

    torch.manual_seed(0)
    return create_model(ARCH, 5).eval()


def test_dynamic_and_static_candidates_quantise_what_the_tables_say(tiny_model):
    example = torch.zeros(2, 3, SIZE, SIZE)
    batches = [torch.randn(4, 3, SIZE, SIZE), torch.randn(3, 3, SIZE, SIZE)]
    dynamic, static = quant.parse_candidates({"candidates": [
        {"name": "d", "activations": "dynamic"},
        {"name": "s", "activations": "static", "calibration_rows": 7}]})
    exported = quant.export_dynamic(tiny_model, example, max_batch=8)
    graph_d, seen_d = quant.quantise(exported, dynamic, batches, example)
    graph_s, seen_s = quant.quantise(exported, static, batches, example)
    assert (seen_d, seen_s) == (0, 7)
    # The float program is left as it was (batch norm is folded in a copy), and quantising it again
    # serialises to the same bytes: a model state's SHA-256 depends on the graph alone.
    again, _ = quant.quantise(exported, dynamic, [], example)
    saved = quant.serialise(graph_d, example, 8)
    assert quant.serialise(again, example, 8) == saved
    # ... nor on where the code ran from: no source path of the installation (timm's, torch's) is kept
    installed = Path(torch.__file__).resolve().parents[1]
    assert str(installed).encode() not in saved and b'File \\"' not in saved
    torch.testing.assert_close(exported.module()(example), tiny_model(example))
    ops_d, ops_s = quant.quantised_ops(graph_d).set_index("op"), quant.quantised_ops(graph_s).set_index("op")
    # Dynamic: int8 weights on conv/linear, never on depthwise convs, no activation op wrapped.
    assert ops_d.loc["linear", "int8_weights"] == 1
    assert ops_d[ops_d.index.str.startswith("conv2d depthwise")]["int8_weights"].sum() == 0
    assert ops_d.loc["silu", "quantised"] == 0
    # Static: every conv/linear weight int8, and activations are wrapped too.
    convs = ops_s[ops_s.index.str.startswith(("conv2d", "linear"))]
    assert (convs["int8_weights"] == convs["nodes"]).all()
    assert ops_s.loc["silu", "quantised"] > 0
    assert ops_s["int8_weight_params"].sum() > ops_d["int8_weight_params"].sum()
    total = sum(p.numel() for n, p in tiny_model.named_parameters() if n.endswith("weight") and p.ndim > 1)
    assert ops_s["weight_params"].sum() == total
    stored = quant.stored_bytes(graph_d).set_index("dtype")
    assert stored.loc["int8", "elements"] == ops_d["int8_weight_params"].sum()
    # Serialised and loaded back, the program computes what the converted graph computes, at any batch.
    program = int8_graph.load_program(quant.serialise(graph_s, example, max_batch=8)).module()
    x = torch.randn(5, 3, SIZE, SIZE)
    torch.testing.assert_close(program(x), graph_s(x))
    assert program(x[:1]).shape == (1, 5)


def test_float_modules_stay_float32_and_a_misnamed_one_is_refused(tiny_model):
    example = torch.zeros(2, 3, SIZE, SIZE)
    batches = [torch.randn(4, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))]
    whole, stem_float = quant.parse_candidates({"candidates": [
        {"name": "w", "activations": "static", "calibration_rows": 4},
        {"name": "f", "activations": "static", "calibration_rows": 4,
         "float_modules": ["conv_stem", "bn1"]}]})
    exported = quant.export_dynamic(tiny_model, example, max_batch=8)
    ops_w = quant.quantised_ops(quant.quantise(exported, whole, batches, example)[0])
    graph_f, _ = quant.quantise(exported, stem_float, batches, example)
    ops_f = quant.quantised_ops(graph_f)
    stem = tiny_model.conv_stem.weight.numel()
    # exactly the stem's weights stay float; every other conv/linear keeps int8 weights
    assert ops_w["int8_weight_params"].sum() - ops_f["int8_weight_params"].sum() == stem
    assert ops_w["int8_weights"].sum() - 1 == ops_f["int8_weights"].sum()
    program = int8_graph.load_program(quant.serialise(graph_f, example, max_batch=8)).module()
    x = torch.randn(3, 3, SIZE, SIZE)
    torch.testing.assert_close(program(x), graph_f(x))
    misnamed = quant.parse_candidates({"candidates": [
        {"name": "m", "activations": "static", "calibration_rows": 4, "float_modules": ["stem"]}]})[0]
    with pytest.raises(quant.PTQConfigError, match="name no module"):
        quant.quantise(exported, misnamed, batches, example)


def test_export_refuses_a_batch_of_one(tiny_model):
    with pytest.raises(ValueError, match="at least 2"):
        quant.export_dynamic(tiny_model, torch.zeros(1, 3, SIZE, SIZE), 8)


class _Relu6Net(torch.nn.Module):
    """Two conv + batch norm + ReLU6 blocks, as EfficientNet-Lite builds them, and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_stem, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.act = torch.nn.ReLU6(inplace=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn2(self.conv(self.act(self.bn1(self.conv_stem(x))))))
        return self.head(x.mean((2, 3)))


def _clip_zero_points(graph: torch.fx.GraphModule) -> list[int]:
    """The zero point of every activation quantisation that reads a ReLU6 clip's output."""
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    return [int(n.args[2]) for n in graph.graph.nodes
            if n.target == quantize and getattr(n.args[0], "target", None) in quant.RELU6]


def test_fuse_relu6_quantises_conv_outputs_from_zero_and_keeps_the_float_function():
    torch.manual_seed(0)
    model = _Relu6Net().eval()
    example = torch.zeros(2, 3, 16, 16)
    exported = quant.export_dynamic(model, example, max_batch=16)
    split = exported.module()
    assert quant.split_relu6(split) == 2
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(split(x), exported.module()(x))  # relu then the clip is the clip
    plain, fused = quant.parse_candidates({"candidates": [
        {"name": "plain", "activations": "static", "calibration_rows": 16},
        {"name": "fused", "activations": "static", "calibration_rows": 16, "fuse_relu6": True}]})
    batches = [torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(2))]
    # without the rewrite the clip shares the range of the conv output before it, negatives included
    assert max(_clip_zero_points(quant.quantise(exported, plain, batches, example)[0])) > -128
    # with it the conv + relu pattern puts the range after the relu: it starts at 0 (int8 zero point -128)
    assert _clip_zero_points(quant.quantise(exported, fused, batches, example)[0]) == [-128, -128]
    with pytest.raises(quant.PTQConfigError, match="fuse_relu6 must be true or false"):
        quant.parse_candidates({"candidates": [{"name": "bad", "activations": "static", "calibration_rows": 1,
                                                "fuse_relu6": "yes"}]})
