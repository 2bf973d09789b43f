"""Outlier-exposure study (issue 33): does fine-tuning the shipped model to be unsure on kinds that are
*never evaluated* make chapter 11 refuse the kinds that are — another crop's leaves above all?

    .venv/bin/python bench/abstention_exposure_study.py RUN_DIR [--epochs 1] [--weight 0.5]
                                                        [--control | --plain]

The detector and layer studies found no score on the shipped features that rejects 95 % of tomato lab
leaves: fine-tuning on one crop put them among the apple classes.  This study changes the features
instead.  The shipped regime's float compact checkpoint (the model the ``.pte`` was quantised from) is
fine-tuned for ``--epochs`` more epochs on its own training rows with its own augmentation, and beside each
batch of them a batch of exposure outliers whose loss pulls the softmax to uniform (Hendrycks et al. 2019,
"Deep anomaly detection with outlier exposure", weight ``--weight``).  The exposure kinds are generated
here and none of them is ever evaluated by chapter 11:

* ``synthetic_leaf`` — leaves of the embedded synthetic generator's corn, grape, bean and banana classes
  (drawn, not photographed; its apple and tomato classes are left out, so no exposure image is named after
  the run's crop or the evaluated other crop), lab and field renderings;
* ``clutter`` — the background-robust regime's procedural clutter (shapes on a colour, defocused), no leaf.

(The evaluated far kinds are scikit-image photos and textures, noise, and real tomato leaves; the near kind is
the orchard's powdery mildew: none is generated here.)  Two controls: ``--control`` fine-tunes the same
steps with weight 0 (the exposure batch still passes through the network, so batch-norm statistics see it:
only the loss differs), ``--plain`` without any exposure batch (the shipped recipe trained one epoch more).

The fine-tuned model is scored like the program (``outputs`` → logits, pooled features) on every row chapter
11 scores, each detector is fitted and thresholded by chapter 11's rule, and the table of
``abstention_detector_study.py`` is printed.  A study, not a test: it reads the locked test through the float
model (as the layer study does), keeps its checkpoint under ``--out`` (default ``/tmp``), and changes nothing
in the run.  About 5 minutes an epoch for the apple book at 192 px on 2 cores.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abstention_detector_study import (  # noqa: E402
    detectors,
    print_table,
    program_sets,
    settings,
    shipped_float,
    study_table,
)

from cropcop_utils.abstention.chapter import regime_val_rows  # noqa: E402
from cropcop_utils.core import imaging  # noqa: E402
from cropcop_utils.core.evidence import sha256_file  # noqa: E402
from cropcop_utils.core.imaging import ImageSpec  # noqa: E402
from cropcop_utils.training.augment import AugmentParams, augment, to_hwc  # noqa: E402
from cropcop_utils.training.data import TrainImages  # noqa: E402
from cropcop_utils.training.settings import resolve_config  # noqa: E402

EXPOSURE_CROPS = ("corn", "grape", "bean", "banana")   # the synthetic generator's crops used for exposure


class FloatForward:
    """A float model with the program's interface: ``outputs(batch)`` → [logits, pooled features]."""

    max_batch = 32
    n_outputs = 2

    def __init__(self, model: torch.nn.Module, sha256: str) -> None:
        self.model, self.sha256 = model, sha256

    def outputs(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            features = self.model.forward_head(self.model.forward_features(batch), pre_logits=True)
            return [self.model.get_classifier()(features), features]

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        return self.outputs(batch)[0]


def exposure_images(side: int, per_kind: int, seed: int) -> tuple[list[np.ndarray], list[str]]:
    """HWC uint8 squares of the exposure kinds (``per_kind`` each) and each one's kind."""
    from PIL import Image

    from cropcop_utils.synthetic.drawing import render_upright
    from cropcop_utils.synthetic.field import render_field
    from cropcop_utils.synthetic.world import CLASSES, SOURCES
    from cropcop_utils.training.regimes.backgrounds import RobustParams, clutter

    classes = [c.name for c in CLASSES if c.crop in EXPOSURE_CROPS and not c.singleton]
    images, kinds = [], []
    for i in range(per_kind):
        name = classes[i % len(classes)]
        if i % 2:
            image, _ = render_field(seed, side, name, i)
        else:
            source = list(SOURCES)[(i // 2) % len(SOURCES)]
            image = render_upright(seed, side, name, source, uid=10_000 + i)
        images.append(np.asarray(Image.fromarray(np.asarray(image)).convert("RGB").resize((side, side))))
        kinds.append("synthetic_leaf")
    rng, params = np.random.default_rng(seed), RobustParams()
    for _ in range(per_kind):
        images.append(clutter(rng, side, params))
        kinds.append("clutter")
    return images, kinds


def fine_tune(model: torch.nn.Module, train: TrainImages, outliers: list[np.ndarray], augment_params:
              AugmentParams, spec: ImageSpec, epochs: int, weight: float | None, lr: float,
              seed: int) -> dict:
    """``epochs`` of cross-entropy on the training rows plus ``weight`` x the outlier-exposure loss (the
    cross-entropy to the uniform distribution) on as many outliers per step (``weight`` None: no outlier
    batch at all); AdamW, cosine to zero."""
    from torch.nn import functional as F

    generator = torch.Generator().manual_seed(seed)
    batch = 32
    steps_per_epoch = len(train) // batch
    total = epochs * steps_per_epoch
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, total)
    model.train()
    started, losses = time.perf_counter(), []
    for epoch in range(epochs):
        order = torch.randperm(len(train), generator=generator)
        for step in range(steps_per_epoch):
            rows = order[step * batch:(step + 1) * batch].tolist()
            samples = [train[(r, int(torch.randint(0, 2**31, (1,), generator=generator)))] for r in rows]
            x_in = torch.stack([s[0] for s in samples])
            y_in = torch.as_tensor([s[1] for s in samples])
            if weight is None:
                logits = model(x_in.contiguous(memory_format=torch.channels_last))
                loss_in = loss = F.cross_entropy(logits, y_in, label_smoothing=0.1)
                loss_out = torch.tensor(float("nan"))
            else:
                picks = torch.randint(0, len(outliers), (batch,), generator=generator).tolist()
                looks = [to_hwc(augment(outliers[p], augment_params, generator)) for p in picks]
                x_out = torch.stack([imaging.to_tensor(look, spec.mean, spec.std) for look in looks])
                logits = model(torch.cat([x_in, x_out]).contiguous(memory_format=torch.channels_last))
                loss_in = F.cross_entropy(logits[:batch], y_in, label_smoothing=0.1)
                loss_out = -F.log_softmax(logits[batch:], dim=1).mean()
                loss = loss_in + weight * loss_out
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            losses.append((loss_in.item(), loss_out.item()))
            if step % 20 == 0:
                print(f"epoch {epoch + 1} step {step}/{steps_per_epoch}: in {losses[-1][0]:.3f} "
                      f"out {losses[-1][1]:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    model.eval()
    last = np.asarray(losses[-20:]).reshape(-1, 2)
    return {"steps": total, "seconds": time.perf_counter() - started,
            "loss_in_last20": float(last[:, 0].mean()) if len(last) else None,
            "loss_out_last20": float(last[:, 1].mean()) if len(last) else None}


def main() -> None:
    args, params = settings(__doc__.split("\n\n")[0], control=(
        "fine-tune the same steps with exposure weight 0 (is a change the exposure's or more training's?)"),
        plain="fine-tune the same steps without any exposure batch (the shipped recipe, one epoch more)",
        extra=lambda parser: (parser.add_argument("--epochs", type=int, default=1,
                                                  help="0: the shipped float model as it is (the baseline)"),
                              parser.add_argument("--weight", type=float, default=0.5),
                              parser.add_argument("--lr", type=float, default=3e-4),
                              parser.add_argument("--per-kind", type=int, default=600),
                              parser.add_argument("--out", type=Path, default=Path("/tmp"))))
    torch.set_num_threads(2)
    shipped = shipped_float(args.run_dir)
    ctx, regime, frozen, state = shipped.ctx, shipped.regime, shipped.frozen, shipped.state
    model = shipped.model.to(memory_format=torch.channels_last)
    config = resolve_config(ctx.section("training"), "compact", regime.name)  # the regime's own recipe
    augment_params = AugmentParams.from_dict(config["augment"])
    spec = ImageSpec.from_section(ctx.section("image"))
    rows = frozen.rows_for("train", field_train=regime.uses_field_train).sort_values("row_id")
    train = TrainImages(rows.reset_index(drop=True), ctx.source_roots, spec, augment_params)
    outliers, kinds = exposure_images(spec.size, args.per_kind, int(params["seed"]))
    variant = "plain" if args.plain else "control" if args.control else "oe"
    weight = {"plain": None, "control": 0.0, "oe": args.weight}[variant]
    print(f"regime {regime.name}: {len(rows)} training rows, {len(outliers)} exposure images "
          f"({', '.join(f'{k} {kinds.count(k)}' for k in sorted(set(kinds)))}), weight {weight}, "
          f"{args.epochs} epoch(s), lr {args.lr}", flush=True)
    summary = fine_tune(model, train, outliers, augment_params, spec, args.epochs, weight, args.lr,
                        int(params["seed"]))
    print(summary, flush=True)
    path = args.out / f"exposure_{variant}_{args.epochs}ep.pt"
    torch.save({"model": model.state_dict(), "arch": state["arch"], "summary": summary}, path)
    reference, from_field, val, jigsaw, sets, temperature = program_sets(
        args.run_dir, FloatForward(model, sha256_file(path)))
    # what a validation-only choice of recipe would read (the rows keep regime_val_rows' order)
    source = regime_val_rows(frozen, regime).get("source", pd.Series(["lab"] * len(val.labels))).to_numpy()
    print(f"validation accuracy: all {val.correct.mean():.3f}; " + ", ".join(
        f"{name} {val.correct[source == name].mean():.3f} (n {int((source == name).sum())})"
        for name in np.unique(source)), flush=True)
    scores = detectors(reference, from_field, temperature, int(params["knn_k"]))
    print_table(study_table(scores, val, jigsaw, sets, temperature, args.coverage, args.risk), sets)


if __name__ == "__main__":
    main()
