"""Static PTQ of a run's compact model with and without the ReLU6 rewrite (``fuse_relu6``), on validation.

XNNPACKQuantizer fuses conv (+ batch norm) + relu and quantises the output after the relu; it has no
pattern for ReLU6 (hardtanh 0..6), so each conv's output is quantised over its negative values too.
This quantises the run's float compact model as chapter 6 does (the chapter's calibration order: the
first N training rows), once as declared and once with every ReLU6 written relu + clip, and prints each
graph's validation macro-F1 drop and top-1 agreement against the float model's recorded predictions.

    .venv/bin/python bench/ptq_relu6_study.py RUN_DIR [--rows 512] [--float-stem]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

import torch

from cropcop_utils import ptq as quant
from cropcop_utils.core.config import reopen_run
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.nets import int8_graph, predict
from cropcop_utils.split import load_frozen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run folder whose chapter 5 finished (read, never written)")
    parser.add_argument("--rows", type=int, default=512, help="calibration rows (a prefix of the order)")
    parser.add_argument("--float-stem", action="store_true", help="keep conv_stem and bn1 float32")
    args = parser.parse_args()

    ctx = reopen_run(args.run_dir)
    # reads through the registry's hash checks; its folder is a scratch one, so the run folder is untouched
    reader = Chapter(ctx.run_dir, "ptq_relu6_study", folder=tempfile.mkdtemp(prefix="ptq_relu6_study_"))
    frozen = load_frozen(reader)
    train_rows, val_rows = frozen.rows_for("train"), frozen.rows_for("val")
    spec = ImageSpec.from_section(ctx.section("image"))
    cfg = replace(predict.PredictConfig.from_ctx(ctx, batch_size=32), cache=True)
    model, _, compact_sha = quant.load_compact(reader, len(frozen.class_names), spec.size)
    float_val = quant.float_record(reader, quant.FLOAT_VAL, compact_sha, val_rows)
    float_f1 = predict.score(float_val)["macro_f1"]
    example = torch.zeros((2, 3, spec.size, spec.size))
    exported = quant.export_dynamic(model, example, 32)
    calibration = list(quant.image_batches(quant.calibration_order(train_rows, 0).head(args.rows),
                                           ctx.source_roots, spec, 32))
    stem = {"float_modules": ["conv_stem", "bn1"]} if args.float_stem else {}
    print(f"float compact model: val macro-F1 {float_f1:.4f} on {len(val_rows):,} rows; {args.rows} "
          f"calibration rows{', stem float32' if stem else ''}")
    for fuse in (False, True):
        started = time.perf_counter()
        declared = {"name": "c", "activations": "static", "calibration_rows": args.rows, "fuse_relu6": fuse}
        (candidate,) = quant.parse_candidates({"candidates": [{**declared, **stem}]})
        graph, _ = quant.quantise(exported, candidate, calibration, example)
        program = int8_graph.executable(int8_graph.load_program(quant.serialise(graph, example, 32)).module())
        record = predict.predict(lambda batch, p=program: p(batch), val_rows, cfg, "study",
                                 desc=f"fuse_relu6={fuse}")
        f1 = predict.score(record)["macro_f1"]
        print(f"fuse_relu6={str(fuse):5}  val macro-F1 {f1:.4f}  drop {100 * (float_f1 - f1):.2f} pt  "
              f"agreement {100 * quant.agreement(record['pred'], float_val['pred']):.2f} %  "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
