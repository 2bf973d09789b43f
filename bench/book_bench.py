"""Where a book run's time went: each chapter's wall and CPU seconds and its share of the whole (from
``RUN_DIR/timings.json``, which the runner writes), and the training chapter's images per second against a
plain timm loop of the same models on this machine (``train_bench.step_rate``: the same architecture, image
size, batch, threads, frozen layer groups and teacher on random tensors, no data loading, no augmentation,
no validation).

    .venv/bin/python bench/book_bench.py RUN_DIR [--steps 8] [--no-loop]

The loop ratio is a ratio from one run on one machine: book images/s (``training.json``: images of the
optimiser steps over the model's training seconds, augmentation and data loading included, validation not)
over the plain loop's images/s, measured now.  Run it on an idle machine: both sides are wall rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import step_rate  # noqa: E402

from cropcop_utils.core import config, timings  # noqa: E402


def chapter_table(run_dir: Path) -> list[dict]:
    steps = timings.read_timings(run_dir)
    if not steps:
        raise SystemExit(f"{run_dir} has no {timings.TIMINGS}: run the book with this version first")
    wall = sum(s["wall_s"] for s in steps)
    cpu = sum(s["cpu_s"] for s in steps)
    return [{**s, "wall_share": s["wall_s"] / wall, "cpu_share": s["cpu_s"] / cpu if cpu else 0.0,
             "cores_busy": s["cpu_s"] / s["wall_s"] if s["wall_s"] else 0.0} for s in steps]


def print_chapters(rows: list[dict]) -> None:
    print(f"{'step':13s} {'wall s':>9s} {'share':>6s} {'CPU s':>9s} {'share':>6s} {'CPU/wall':>8s}")
    for r in rows:
        mark = "" if r.get("finished", True) else "  (failed)"
        print(f"{r['step']:13s} {r['wall_s']:9.1f} {100 * r['wall_share']:5.1f}% {r['cpu_s']:9.1f} "
              f"{100 * r['cpu_share']:5.1f}% {r['cores_busy']:8.2f}{mark}")
    print(f"{'total':13s} {sum(r['wall_s'] for r in rows):9.1f} {'':6s} {sum(r['cpu_s'] for r in rows):9.1f}")


def training_against_loop(run_dir: Path, steps: int, loop: bool) -> None:
    record = json.loads((run_dir / "training" / "training.json").read_text())
    params = config.reopen_run(run_dir).params
    size = int(params["image"]["size"])
    n_classes = None
    regimes = ({name: r["models"] for name, r in record["regimes"].items()} if record.get("regimes")
               else {"shipped": record["models"]})
    chapter = next((r for r in timings.read_timings(run_dir) if r["step"] == "training"), None)
    images = 0
    for regime, models in regimes.items():
        for kind, model in models.items():
            n_classes = int(model["num_classes"])
            images += int(model["steps"]) * int(model["hyperparameters"]["batch_size"])
            line = (f"{regime:15s} {kind:9s} {model['arch']:24s} book {model['images_per_s']:6.1f} img/s "
                    f"({model['steps']} steps, {model['train_seconds']:.0f} s)")
            if loop:
                hp = model["hyperparameters"]   # the regime's own, as the model was trained
                torch.set_num_threads(int(hp.get("threads") or 1))
                teacher = models["reference"]["arch"] if model.get("teacher") else None
                wall, per_cpu = step_rate(model["arch"], n_classes, size, int(hp["batch_size"]), steps,
                                          bool(hp["channels_last"]), teacher, hp["distill"], hp["weights"],
                                          int(hp.get("frozen_groups") or 0))
                line += f" | plain timm loop {wall:6.1f} img/s ({per_cpu:.1f} per CPU-second): ratio " \
                        f"{model['images_per_s'] / wall:.2f}"
            print(line)
    if chapter and chapter["cpu_s"]:
        print(f"training chapter: {images} training images in {chapter['cpu_s']:.0f} CPU s = "
              f"{images / chapter['cpu_s']:.1f} images per CPU-second (every regime; the chapter's CPU "
              "includes its validation passes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=8, help="timed steps of the plain loop per model")
    parser.add_argument("--no-loop", action="store_true", help="skip the plain timm loop (chapters only)")
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()
    print_chapters(chapter_table(run_dir))
    if (run_dir / "training" / "training.json").exists():
        training_against_loop(run_dir, args.steps, not args.no_loop)


if __name__ == "__main__":
    main()
