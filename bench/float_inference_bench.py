"""Float inference in channels-last order against NCHW order, on a finished run's own float models.

    .venv/bin/python bench/float_inference_bench.py RUN_DIR [--rows 96] [--repeats 3] [--occlusion 1]

Reads RUN_DIR's shipped float reference and compact checkpoints and its image size, and times, in one
process and interleaved, the two layouts of the same weights (``nets.models.for_inference`` keeps the
weights channels-last; the NCHW form is the model as ``create_model`` builds it):

* ``score``: the lab val rows' first ``--rows`` photos through ``predict.logits_of`` at the run's batch
  size (decoding included, as chapter 10 scores a cohort);
* ``occlusion``: ``field.attribution.occlusion`` of ``--occlusion`` image(s) at the profile's window and
  stride (chapter 10's float states);
* ``gradcam``: ``field.attribution.gradcam`` of 16 images at the profile's stage.

Prints each form's median seconds, the ratio NCHW / channels-last, and the largest logit difference
between the two layouts (float rounding; the top-1 class must not move on these rows).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cropcop_utils.core import checkpoint  # noqa: E402
from cropcop_utils.core.config import reopen_run  # noqa: E402
from cropcop_utils.core.evidence import Chapter  # noqa: E402
from cropcop_utils.core.imaging import ImageSpec  # noqa: E402
from cropcop_utils.core.squares import EvalImages  # noqa: E402
from cropcop_utils.field import attribution  # noqa: E402
from cropcop_utils.nets import models  # noqa: E402
from cropcop_utils.nets.predict import PredictConfig, logits_of  # noqa: E402
from cropcop_utils.split import load_frozen  # noqa: E402
from cropcop_utils.training import regimes  # noqa: E402


def timed(fn, model: torch.nn.Module, repeats: int) -> tuple[float, object]:
    out, seconds = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(model)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--occlusion", type=int, default=1)
    args = parser.parse_args()

    ctx = reopen_run(args.run_dir)
    spec = ImageSpec.from_section(ctx.section("image"))
    transfer = ctx.section("field_transfer")
    batch = int(transfer["batch_size"])
    shipped = regimes.shipped(regimes.of_run(ctx))
    frozen = load_frozen(Chapter(ctx.run_dir, "field"))
    rows = frozen.rows_for("val", field_train=shipped.uses_field_train).head(args.rows)
    cfg = PredictConfig.from_ctx(ctx, batch_size=batch)
    images = torch.stack([EvalImages(rows, ctx.source_roots, spec)[i][0] for i in range(16)])
    print(f"{args.run_dir}: {spec.size} px, batch {batch}, {len(rows)} rows, "
          f"{torch.get_num_threads()} threads (torch's default, as the chapters run)")
    print(f"{'model':10s} {'task':10s} {'NCHW s':>8s} {'CL s':>8s} {'ratio':>6s}  logits")
    for kind in ("reference", "compact"):
        state = checkpoint.load(args.run_dir / shipped.path(f"training/{kind}/best.pt"))
        nchw = models.create_model(state["arch"], int(state["num_classes"]))
        nchw.load_state_dict(state["model"])
        nchw.eval()
        last = models.for_inference(copy.deepcopy(nchw))
        tasks = {
            "score": lambda m: logits_of(m, rows, cfg, desc="bench"),
            "occlusion": lambda m: attribution.occlusion(
                m, images[: args.occlusion], [0] * args.occlusion, int(transfer["occlusion_window"]),
                int(transfer["occlusion_stride"])),
            "gradcam": lambda m: attribution.gradcam(m, images, [0] * len(images),
                                                     int(transfer["gradcam_stage"])),
        }
        for task, run in tasks.items():
            a, out_a = timed(run, nchw, args.repeats)
            b, out_b = timed(run, last, args.repeats)
            note = ""
            if task == "score":
                diff = (out_a - out_b).abs().max().item()
                same = bool((out_a.argmax(1) == out_b.argmax(1)).all())
                note = f"max |diff| {diff:.2e}, top-1 {'the same' if same else 'MOVED'}"
            print(f"{kind:10s} {task:10s} {a:8.3f} {b:8.3f} {a / b:6.2f}  {note}")


if __name__ == "__main__":
    main()
