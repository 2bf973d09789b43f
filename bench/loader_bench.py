"""The training loop with and without a DataLoader worker, on real rows of a finished run.

Runs the trainer's own loop (augmentation from the in-memory image cache, forward, loss, backward,
AdamW, EMA; the compact model distilled from the run's reference) for one epoch over ``--rows`` train
rows of the run's frozen split, alternating ``training.workers`` 0 and 1 so that a change in the
machine's load hits both.  Prints the mean images/s of each and their ratio.  Nothing is written to the
run folder (each trial trains into a temporary directory).

    .venv/bin/python bench/loader_bench.py --run-dir runs/tomato [--rows 960] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from cropcop_utils.core.config import PARAMS_NAME
from cropcop_utils.core.evidence import Chapter, sha256_file
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.split import load_frozen
from cropcop_utils.training import settings as train
from cropcop_utils.training import trainer
from cropcop_utils.training.job import Job


def one_epoch(params: dict, run_dir: Path, kind: str, rows: int, workers: int) -> float:
    """Images/s of one epoch of ``kind`` over ``rows`` train rows with ``workers`` DataLoader workers."""
    frozen = load_frozen(Chapter(run_dir, train.FOLDER))
    config = {**train.resolve_config(params["training"], kind), "epochs": 1, "checkpoint_every": 0,
              "workers": workers}
    teacher = run_dir / "training/reference/best.pt" if kind == "compact" else None
    if teacher is not None and not teacher.exists():
        raise SystemExit(f"{teacher} is missing: the compact model is distilled from the run's reference")
    data = params["data"]
    corpus = run_dir / "synthetic" / "corpus" if data == "synthetic" else Path(data)
    sample = frozen.rows_for("train").sample(rows, random_state=0)
    with tempfile.TemporaryDirectory() as out:
        job = Job(kind=kind, config=config, spec=ImageSpec.from_section(params["image"]),
                  corpus_root=corpus, train_rows=sample,
                  val_rows=frozen.rows_for("val").head(64), class_names=list(frozen.class_names),
                  data_fingerprints=dict(frozen.split_json["fingerprints"]), out_dir=Path(out),
                  teacher_path=teacher, teacher_sha256=sha256_file(teacher) if teacher else None,
                  progress=False)
        return float(trainer.Trainer(job).fit()["images_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, help="a run whose split (and reference) are finished")
    parser.add_argument("--rows", type=int, default=960)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run_dir = Path(args.run_dir).resolve()
    params_path = run_dir / PARAMS_NAME
    if not params_path.exists():
        raise SystemExit(f"{params_path} is missing: give a run folder made by the book")
    params = yaml.safe_load(params_path.read_text())["params"]
    for kind in train.MODELS:
        rates: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for workers in (1, 0):
                rates[workers].append(one_epoch(params, run_dir, kind, args.rows, workers))
        with_worker, without = statistics.mean(rates[1]), statistics.mean(rates[0])
        runs = {w: ", ".join(f"{r:.1f}" for r in rates[w]) for w in rates}
        print(f"{kind:9s} {args.rows} rows: one worker {with_worker:6.1f} img/s ({runs[1]}), no worker "
              f"{without:6.1f} img/s ({runs[0]}); ratio {without / with_worker:.2f}", flush=True)


if __name__ == "__main__":
    main()
