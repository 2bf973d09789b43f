"""Speed of the converted INT8 graph as the book scores it, against the decomposed graph torch runs as saved.

    .venv/bin/python bench/int8_graph_bench.py RUN_DIR [--batch 32] [--repeats 5] [--threads 1]

Reads RUN_DIR's selected INT8 graph (``ptq/selected.pt2``) and its image size, and times one batch of
random inputs through three forms of the same graph, interleaved, in one process:

* ``decomposed``: the graph as ``torch.export`` loads it (every quantize / dequantize op as torch runs it);
* ``rewrite-5``: :func:`cropcop_utils.nets.int8_graph.executable` with the quantize -> dequantize pair in
  the five elementwise passes the rewrite used before (multiply, round, add the zero point, clamp,
  subtract it, scale) -- kept here only as the measurement's baseline;
* ``rewrite``: ``executable`` as the book runs it (``int8_graph.quantize_dequantize``).

Prints each form's median seconds per batch and the ratios, and whether all three give the same logits
bit for bit (they must: the rewrite is exact).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cropcop_utils.nets import int8_graph  # noqa: E402


def five_pass(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    """The rewrite's earlier quantize -> dequantize: the decomposed ops' arithmetic step by step."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    t = torch.round(x * (1.0 / scale))
    t.add_(zero_point).clamp_(quant_min, quant_max)
    return t.sub_(zero_point).mul_(scale)


def graphs(blob: bytes) -> dict[str, torch.fx.GraphModule]:
    current = int8_graph.quantize_dequantize
    out = {"decomposed": int8_graph.load_program(blob).module()}
    try:
        int8_graph.quantize_dequantize = five_pass  # the node's target is the function executable() sees
        out["rewrite-5"] = int8_graph.load_executable(blob)
    finally:
        int8_graph.quantize_dequantize = current
    out["rewrite"] = int8_graph.load_executable(blob)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    params = yaml.safe_load((args.run_dir / "params.yaml").read_text())["params"]
    size = int(params["image"]["size"])
    forms = graphs((args.run_dir / "ptq/selected.pt2").read_bytes())
    batch = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {name: [] for name in forms}
    logits = {}
    with torch.inference_mode():
        for name, graph in forms.items():  # warm-up, and the logits compared below
            logits[name] = graph(batch)
        for _ in range(args.repeats):
            for name, graph in forms.items():
                start = time.perf_counter()
                graph(batch)
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.run_dir}: INT8 graph, batch {args.batch} at {size} px, {args.threads} thread(s), "
          f"median of {args.repeats}")
    for name, seconds in median.items():
        ratio = median["decomposed"] / seconds
        print(f"  {name:<11} {seconds:7.3f} s/batch   decomposed / this {ratio:5.2f}x")
    print(f"  rewrite-5 / rewrite: {median['rewrite-5'] / median['rewrite']:.2f}x")
    same = all(torch.equal(logits["decomposed"], value) for value in logits.values())
    print(f"  logits bit for bit equal across the three: {same}")


if __name__ == "__main__":
    main()
