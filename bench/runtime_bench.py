"""The study's deployment path on the paper architecture: .pte size and host latency vs eager float.

Builds MobileNetV4 Conv-Medium with a 120-way head (untrained weights: size and speed do not depend on
the values), quantises it with the dynamic-activation, per-channel-weight XNNPACK candidate (the one the
study selected), lowers it to an ExecuTorch program with the XNNPACK partitioner, and prints the
program's size next to the study's 22.60 MiB, the size ratio to the prequantised state file, and the
batch-1 latency of the .pte against the eager float model, each measured in a process of its own.

    .venv/bin/python bench/runtime_bench.py [--size 256] [--runs 30] [--threads 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from cropcop_utils import ptq as quant
from cropcop_utils.core.evidence import sha256_bytes
from cropcop_utils.nets import pte as pte_program
from cropcop_utils.nets.int8_graph import load_program
from cropcop_utils.nets.models import count_params, create_model
from cropcop_utils.runtime import chapter as runtime
from cropcop_utils.runtime import device, lowering
from cropcop_utils.runtime import latency as timing

STUDY_PTE_MIB = 22.5986      # the study's .pte
STUDY_REDUCTION = 0.3192     # smaller than the prequantised state file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mobilenetv4_conv_medium")
    parser.add_argument("--num-classes", type=int, default=120)
    parser.add_argument("--size", type=int, default=256, help="input side in pixels")
    parser.add_argument("--max-batch", type=int, default=32, help="upper bound of the dynamic batch size")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30, help="timed batch-1 calls per model")
    parser.add_argument("--threads", type=int, default=1, help="torch and ExecuTorch threads alike")
    parser.add_argument("--device-batch", type=int, default=1, help="the device program's static batch")
    parser.add_argument("--activations", choices=("dynamic", "static"), default="dynamic",
                        help="dynamic (the study's candidate) or static (calibrated on seeded noise here)")
    parser.add_argument("--out", type=Path, default=None, help="keep model.pte here (default: a temp dir)")
    args = parser.parse_args()

    started = time.perf_counter()
    torch.manual_seed(0)
    model = create_model(args.arch, args.num_classes).eval()
    state = runtime.state_dict_bytes(model.state_dict())
    candidate = quant.Candidate(f"{args.activations}_pc", args.activations, True, 8, 0)
    example = torch.zeros(2, 3, args.size, args.size)
    noise = torch.Generator().manual_seed(0)
    calibration = [torch.rand(4, 3, args.size, args.size, generator=noise) for _ in range(2)] \
        if candidate.static else []
    graph, _ = quant.quantise(quant.export_dynamic(model, example, args.max_batch), candidate, calibration,
                              example)
    summary = quant.summarise_ops(quant.quantised_ops(graph))
    program = load_program(quant.serialise(graph, example, args.max_batch))
    lowered = time.perf_counter()
    data, _, delegation = lowering.lower(program)
    lowering_s = time.perf_counter() - lowered
    size = runtime.size_record(len(data), len(state))
    batched = pte_program.PteForward(data, sha256_bytes(data))
    bound = batched.max_batch
    device_data, _, _ = lowering.lower(device.device_program(program.module(), args.size, args.device_batch))
    one = pte_program.PteForward(device_data, sha256_bytes(device_data))
    comparison = device.ProgramComparison(batched, one)
    comparison(torch.rand(5, 3, args.size, args.size, generator=noise))
    same = comparison.record(("logits",))

    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        pte_path, state_path = out / "model.pte", out / "float_state.pt"
        device_path = out / "model_device.pte"
        pte_path.write_bytes(data)
        device_path.write_bytes(device_data)
        state_path.write_bytes(state)
        common = {"image_size": args.size, "warmup": args.warmup, "runs": args.runs, "threads": args.threads,
                  "seed": 0}
        latency = timing.compare_latency(
            {**common, "kind": "pte", "path": str(pte_path), "sha256": sha256_bytes(data)},
            {**common, "kind": "eager", "arch": args.arch, "num_classes": args.num_classes,
             "state_path": str(state_path)},
            device_spec={**common, "kind": "pte", "path": str(device_path),
                         "sha256": sha256_bytes(device_data), "batch": args.device_batch})
        # the eager model in channels-last order too (the order the book trains and scores in): a fairer
        # float baseline than the NCHW one the chapter keeps
        last = timing.measure({**common, "kind": "eager", "arch": args.arch, "num_classes": args.num_classes,
                                "state_path": str(state_path), "channels_last": True})
    ratios = timing.latency_ratios(latency)
    rows = latency.set_index("kind")

    print(f"model               {args.arch}, {args.num_classes} classes, {count_params(model):,} parameters, "
          f"{args.size}x{args.size} input (untrained weights)")
    print(f"candidate           {args.activations} activations, per-channel int8 weights: "
          f"{summary['int8_weight_nodes']} conv/linear nodes int8, "
          f"{100 * summary['int8_weight_share']:.1f}% of {summary['weight_params']:,} weight parameters")
    print(f"delegation          {delegation['delegated_nodes']} nodes in {delegation['delegated_subgraphs']} "
          f"XNNPACK subgraph(s), {delegation['non_delegated_nodes']} outside; lowered in {lowering_s:.0f} s")
    print(f"prequantised state  {size['state_mib']:.4f} MiB ({size['state_bytes']:,} bytes)")
    print(f".pte                {size['pte_mib']:.4f} MiB ({size['pte_bytes']:,} bytes)   "
          f"study: {STUDY_PTE_MIB:.4f} MiB   difference {size['pte_mib'] - STUDY_PTE_MIB:+.4f} MiB   "
          f"(batches up to {bound})")
    print(f"size reduction      {100 * size['reduction']:.2f}% smaller than the state file   "
          f"study: {100 * STUDY_REDUCTION:.2f}%")
    print(f"device program      static batch {args.device_batch}, {len(device_data) / 2**20:.4f} MiB; "
          "outputs vs "
          f"the batched .pte on 5 noise images: max |difference| {same['max_abs_diff']['logits']:.3g}, "
          f"top-1 agreement {100 * same['top1_agreement']:.0f}%")
    labels = (("pte", f".pte (batch<={bound})"), ("device_pte", ".pte device"), ("eager", "eager float"))
    for kind, label in labels:
        row = rows.loc[kind]
        print(f"latency {label:<16} p50 {row['p50_ms']:8.2f} ms   p95 {row['p95_ms']:8.2f} ms   "
              f"peak memory above baseline {row['peak_above_baseline_mib']:8.1f} MiB "
              f"(batch 1, {row['threads']} thread(s), {row['runs']} runs)")
    print(f"ratio .pte / eager         p50 {ratios['p50_ratio']:.3f}   p95 {ratios['p95_ratio']:.3f}   "
          f"memory {ratios['memory_ratio']:.3f}")
    print(f"ratio device .pte / eager  p50 {ratios['device_p50_ratio']:.3f}   "
          f"p95 {ratios['device_p95_ratio']:.3f}   "
          f"memory {ratios['device_memory_ratio']:.3f}")
    print(f"latency eager float, channels-last   p50 {last['p50_ms']:8.2f} ms   p95 {last['p95_ms']:8.2f} ms"
          f"   peak memory above baseline {last['peak_above_baseline_mib']:8.1f} MiB")
    for kind, label in (("pte", ".pte"), ("device_pte", "device .pte")):
        print(f"ratio {label} / channels-last eager   p50 {rows.loc[kind, 'p50_ms'] / last['p50_ms']:.3f}   "
              f"memory {rows.loc[kind, 'peak_above_baseline_mib'] / last['peak_above_baseline_mib']:.3f}")
    print(f"total               {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
