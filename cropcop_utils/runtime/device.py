"""The program a device runs: the same INT8 graph lowered for a fixed small batch (default 1).

The program the book scores with (``runtime/model.pte``) keeps a dynamic batch dimension up to
``ptq.max_batch`` (32), and ExecuTorch plans its activation buffers for that bound: at batch 1 it holds
about 32 images' worth of activations (1.5x the eager float model's peak memory on the paper
architecture).  A phone scores one photo at a time, so chapter 7 also lowers the graph with a static
batch of ``runtime.device_batch`` into ``runtime/model_device.pte`` and proves the two programs give the
same outputs: both run every validation image (the device program in slices of its batch), and the
largest absolute difference of each output (logits, features) and the top-1 agreement are recorded.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..nets.pte import PteForward

DEVICE_PTE = "runtime/model_device.pte"


def device_program(graph: torch.nn.Module, image_size: int, batch: int) -> Any:
    """``torch.export`` of ``graph`` with a static batch of ``batch`` images (no dynamic dimension: the
    runtime plans buffers for exactly that batch)."""
    if batch < 1:
        raise ValueError(f"runtime.device_batch must be >= 1, got {batch}")
    return torch.export.export(graph, (torch.zeros(batch, 3, image_size, image_size),))


class ProgramComparison:
    """A batch → logits callable (what ``predict.logits_of`` drives) that runs the batched program on the
    batch and the device program on the same images in slices of its own batch, and keeps the largest
    difference of each output and how many top-1 decisions agree."""

    def __init__(self, batched: PteForward, device: PteForward) -> None:
        self.batched, self.device = batched, device
        self.max_abs_diff: list[float] = [0.0] * batched.n_outputs
        self.rows = self.agree = 0

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        # each method reuses its output memory between calls: copies are compared, not views
        reference = [o.clone() for o in self.batched.outputs(batch)]
        step, parts = self.device.max_batch, []
        for i in range(0, len(batch), step):
            chunk, n = batch[i:i + step], len(batch[i:i + step])
            if n < step:  # a static batch takes exactly `step` images: pad the last slice, drop the padding
                chunk = torch.cat([chunk, chunk.new_zeros((step - n, *chunk.shape[1:]))])
            parts.append([o[:n].clone() for o in self.device.outputs(chunk)])
        joined = [torch.cat([p[k] for p in parts]) for k in range(len(reference))]
        for k, (a, b) in enumerate(zip(reference, joined, strict=True)):
            self.max_abs_diff[k] = max(self.max_abs_diff[k], float((a - b).abs().max()) if a.numel() else 0.0)
        self.rows += len(batch)
        self.agree += int((reference[0].argmax(1) == joined[0].argmax(1)).sum())
        return reference[0]

    def record(self, names: tuple[str, ...]) -> dict[str, Any]:
        diffs = dict(zip(names, self.max_abs_diff, strict=False))
        return {"rows": self.rows, "max_abs_diff": diffs,
                "top1_agreement": self.agree / self.rows if self.rows else None,
                "identical": self.rows > 0 and all(d == 0.0 for d in diffs.values())}


def compare_programs(batched: PteForward, device: PteForward, rows: pd.DataFrame, cfg: Any,
                     names: tuple[str, ...]) -> dict[str, Any]:
    """Both programs on every row of ``rows`` (validation: never the locked test) through the book's own
    loader; what :meth:`ProgramComparison.record` says."""
    from ..nets.predict import logits_of

    comparison = ProgramComparison(batched, device)
    logits_of(comparison, rows, cfg, desc="batched vs device program")
    return comparison.record(names)


def device_text(facts: dict[str, Any]) -> str:
    """Chapter 7's paragraph on the device program, from ``runtime.json``."""
    program, check = facts["device_program"], facts["device_program"]["check"]
    diffs = ", ".join(f"{name} {value:.3g}" for name, value in check["max_abs_diff"].items())
    same = ("**identical outputs**: every output element equal" if check["identical"] else
            f"outputs that differ by at most {diffs} (top-1 agreement "
            f"{100 * check['top1_agreement']:.2f}%)")
    images = "image" if program["batch"] == 1 else "images"
    text = (f"`{program['path']}` is the same INT8 graph lowered for a fixed batch of "
            f"**{program['batch']}** {images} ({program['pte_mib']:.2f} MiB, "
            f"SHA-256 `{program['sha256'][:16]}…`): the program a device runs, one photo at a time, with "
            f"buffers planned for that batch instead of {facts['pte_max_batch']}. On the {check['rows']:,} "
            f"validation images both programs gave {same}.")
    ratios = facts.get("latency_ratios") or {}
    if "device_memory_ratio" in ratios:
        text += (f" At batch 1 on this host its peak memory above the pre-load resident size is "
                 f"**{ratios['device_memory_ratio']:.2f}×** the eager float model's (the batched program: "
                 f"{ratios['memory_ratio']:.2f}×) and its p50 latency **{ratios['device_p50_ratio']:.2f}×** "
                 f"(batched: {ratios['p50_ratio']:.2f}×).")
    return text
