"""Abstention layer study: would the shipped model's *intermediate* features refuse what its pooled
features cannot (issue 33: another crop's lab leaves sit among the apple classes in the final features)?

    .venv/bin/python bench/abstention_layer_study.py RUN_DIR [--imagenet [--imagenet-int8]]
        [--coverage 0.95 0.97] [--risk 0.02]

The shipped regime's compact model (its float checkpoint — the model the ``.pte`` was quantised from, not
the program itself) is run over the same rows as ``abstention_detector_study.py``, and each stage of its
backbone is summarised per channel by the mean (and, for ``…_std``, the standard deviation) over the
image.  Per stage, pytorch-ood's class-conditional Mahalanobis is fitted on the training rows (Lee et
al. 2018's feature ensemble), and the stages are combined:

* ``sum_z[...]`` — each stage's score standardised on validation rows, summed (no outliers used);
* ``max_z[...]`` — the largest standardised stage score;
* ``lr[...]`` — a logistic regression of the stage scores, validation rows (in) against the jigsaw fitting
  outliers (out): Lee et al.'s weighting, fitted on chapter 11's fitting kind only.

With ``--imagenet`` the packaged ImageNet weights of the same architecture (frozen, never fine-tuned) add
their pooled features (``imagenet``): do generic features keep apart what fine-tuning on one crop merged?
With ``--imagenet-int8`` those features come from an INT8 ``.pte`` of that network, quantised by the shipped
regime's selected PTQ candidate on its calibration rows (what a program returning them would compute).

The two pooled parts (``final``, ``imagenet``) also get pytorch-ood's k-NN (cosine distance to the k-th
nearest training feature, the run's ``abstention.knn_k``) and relative Mahalanobis, alone and summed with
the others (``sum_z[final+knn[imagenet]]``: the shipped features' Mahalanobis plus the ImageNet features'
k-NN, each standardised on validation rows — no outlier enters that fit).

Every detector is thresholded by chapter 11's rule (``study_table``).  ``final`` (the pooled features the
classifier reads) is the float twin of the shipped Mahalanobis, a check on the rest.  A study, not a test:
it reads the locked test through the float model, and changes nothing in the run.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abstention_detector_study import (  # noqa: E402
    Score,
    hindsight_frontier,
    print_frontier,
    print_table,
    program_sets,
    settings,
    shipped_float,
    study_table,
)

from cropcop_utils.abstention.protection import Outputs, fit_detectors, targets_of  # noqa: E402


class LayerForward:
    """The float model with the program's interface: ``outputs(batch)`` → (logits, every stage's channel
    means and standard deviations over the image, then the pooled features — and the ImageNet model's
    pooled features when given — side by side; ``slices`` names each part's columns)."""

    max_batch = 32
    n_outputs = 2

    def __init__(self, model: torch.nn.Module, sha256: str,
                 imagenet: torch.nn.Module | Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model, self.sha256, self.imagenet = model, sha256, imagenet
        self.stages = list(model.blocks)
        self.slices: dict[str, slice] = {}

    def outputs(self, batch: torch.Tensor) -> list[torch.Tensor]:
        captured: list[torch.Tensor] = []
        hooks = [stage.register_forward_hook(lambda _m, _i, out: captured.append(out))
                 for stage in self.stages]
        try:
            with torch.no_grad():
                features = self.model.forward_head(self.model.forward_features(batch), pre_logits=True)
                logits = self.model.get_classifier()(features)
        finally:
            for hook in hooks:
                hook.remove()
        parts, start = [], 0
        for i, out in enumerate(captured):
            for stat, value in (("mean", out.mean(dim=(2, 3))), ("std", out.std(dim=(2, 3)))):
                self.slices[f"stage{i}_{stat}"] = slice(start, start + value.shape[1])
                start += value.shape[1]
                parts.append(value)
        self.slices["final"] = slice(start, start + features.shape[1])
        parts.append(features)
        if self.imagenet is not None:
            with torch.no_grad():
                frozen = (self.imagenet.forward_head(self.imagenet.forward_features(batch), pre_logits=True)
                          if isinstance(self.imagenet, torch.nn.Module) else self.imagenet(batch))
            start += features.shape[1]
            self.slices["imagenet"] = slice(start, start + frozen.shape[1])
            parts.append(frozen)
        return [logits, torch.cat(parts, dim=1)]

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        return self.outputs(batch)[0]


def layer_scores(reference: Outputs, val: Outputs, jigsaw: Outputs, slices: dict[str, slice], knn_k: int
                 ) -> dict[str, Score]:
    """name → outlier score: one Mahalanobis per part of the features, then the parts combined; for the
    pooled parts (``final``, ``imagenet``) also chapter 11's k-NN (cosine) and relative Mahalanobis
    (``fit_detectors``), which make no one-Gaussian-per-class assumption about features never trained on
    these classes."""
    from pytorch_ood.detector import Mahalanobis
    from sklearn.linear_model import LogisticRegression

    y = torch.tensor(reference.labels, dtype=torch.long)

    seen: dict[tuple[int, str], tuple[Outputs, np.ndarray]] = {}  # the combinations reuse each part's score

    def scorer(name: str, detector: Any, part: slice) -> Callable[[Outputs], np.ndarray]:
        def score(o: Outputs) -> np.ndarray:
            if (id(o), name) not in seen:  # the set is kept with its score, so its id stays its own
                seen[id(o), name] = o, detector.predict_features(
                    torch.tensor(o.features[:, part])).double().numpy()
            return seen[id(o), name][1]

        return score

    single = {name: scorer(name, Mahalanobis(None).fit_features(torch.tensor(reference.features[:, part]), y),
                           part) for name, part in slices.items()}
    for name in ("final", "imagenet"):
        if name in slices:
            # a writable copy: the outputs are read-only arrays, which torch warns about
            book = fit_detectors(reference.features[:, slices[name]].copy(), reference.labels, knn_k)
            single[f"knn[{name}]"] = scorer(f"knn[{name}]", book["knn"], slices[name])
            single[f"rmd[{name}]"] = scorer(f"rmd[{name}]", book["relative_mahalanobis"], slices[name])
    on_val = {name: score(val) for name, score in single.items()}
    z = {name: (lambda o, n=name: (single[n](o) - on_val[n].mean()) / max(on_val[n].std(), 1e-12))
         for name in single}
    out: dict[str, Score] = dict(single)
    groups = {
        "means+final": [n for n in slices if n.endswith("_mean")] + ["final"],
        "all": [n for n in slices if n != "imagenet"],  # the stages' Mahalanobis and the pooled one
        "late(3+)+final": [n for n in slices if n.startswith("stage") and int(n[5]) >= 3] + ["final"],
        "early(<=3)+final": [n for n in slices if n.startswith("stage") and int(n[5]) <= 3] + ["final"],
        **({"final+imagenet": ["final", "imagenet"], "final+knn[imagenet]": ["final", "knn[imagenet]"],
            "knn[final]+knn[imagenet]": ["knn[final]", "knn[imagenet]"]} if "imagenet" in slices else {}),
    }
    for label, names in groups.items():
        out[f"sum_z[{label}]"] = lambda o, names=names: np.sum([z[n](o) for n in names], axis=0)
        out[f"max_z[{label}]"] = lambda o, names=names: np.max([z[n](o) for n in names], axis=0)
        x_in = np.stack([z[n](val) for n in names], 1)
        x_out = np.stack([z[n](jigsaw) for n in names], 1)
        lr = LogisticRegression(max_iter=2000).fit(np.concatenate([x_in, x_out]),
                                                   np.r_[np.zeros(len(x_in)), np.ones(len(x_out))])
        out[f"lr[{label}]"] = lambda o, names=names, lr=lr: lr.decision_function(
            np.stack([z[n](o) for n in names], 1))
    return out


def imagenet_program(shipped: SimpleNamespace, model: torch.nn.Module
                     ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The frozen ImageNet network's pooled features as an INT8 ExecuTorch program, quantised the way the
    shipped program was: the candidate chapter 6 selected for the shipped regime, calibrated on that
    regime's calibration rows (its training rows, ``ptq/calibration_rows.parquet``), lowered as chapter 7
    lowers.  Returns the program's forward (features out)."""
    from cropcop_utils import ptq as quant
    from cropcop_utils.core.evidence import sha256_bytes
    from cropcop_utils.core.imaging import ImageSpec
    from cropcop_utils.nets.int8_graph import load_program
    from cropcop_utils.nets.pte import PteForward
    from cropcop_utils.runtime.lowering import lower

    at, ctx = shipped.regime.path, shipped.ctx
    selected = shipped.ch.read_json(at("ptq/ptq.json"))["selected"]
    entry = next(c for c in shipped.ch.read_json(at("ptq/candidates.json"))["candidates"]  # as declared
                 if c["name"] == selected)
    candidate = quant.Candidate(**{**entry, "float_modules": tuple(entry["float_modules"])})
    used = shipped.ch.read_parquet(at("ptq/calibration_rows.parquet"))
    rows = used[used[f"used_by_{candidate.name}"]].sort_values("position")
    spec = ImageSpec.from_section(ctx.section("image"))
    features = copy.deepcopy(model)
    features.reset_classifier(0)  # forward returns the pooled features
    example = torch.zeros((2, 3, spec.size, spec.size))
    batches = quant.image_batches(rows, ctx.source_roots, spec, 32) if candidate.static else []
    graph, _ = quant.quantise(quant.export_dynamic(features, example, 32), candidate, batches, example)
    data, _, _ = lower(load_program(quant.serialise(graph, example, 32)))
    print(f"ImageNet features: {candidate.name} ({len(rows)} calibration rows), a .pte of "
          f"{len(data) / 2**20:.2f} MiB")
    return PteForward(data, sha256_bytes(data))


def main() -> None:
    args, params = settings(__doc__.split("\n\n")[0], imagenet=(
        "also the packaged ImageNet weights' pooled features of the same architecture (frozen, never "
        "fine-tuned), alone and beside the shipped model's"), imagenet_int8=(
        "--imagenet, with those features from an INT8 .pte of the ImageNet network, quantised by the "
        "shipped regime's selected PTQ candidate (what a program shipping them would compute)"), frontier=(
        "also each detector's best thresholds in hindsight against the profile's targets"))
    shipped = shipped_float(args.run_dir)
    imagenet = None
    if args.imagenet or args.imagenet_int8:
        from cropcop_utils.nets.models import create_model

        imagenet = create_model(shipped.state["arch"], len(shipped.frozen.class_names),
                                weights="package").eval()
        if args.imagenet_int8:
            imagenet = imagenet_program(shipped, imagenet)
    forward = LayerForward(shipped.model, shipped.sha256, imagenet)
    torch.set_num_threads(2)
    reference, _, val, jigsaw, sets, temperature = program_sets(args.run_dir, forward)
    scores = layer_scores(reference, val, jigsaw, forward.slices, int(params["knn_k"]))
    print_table(study_table(scores, val, jigsaw, sets, temperature, args.coverage, args.risk), sets)
    if args.frontier:
        targets, near = targets_of(params)
        print_frontier(hindsight_frontier(scores, val, sets, temperature, targets, near), targets, near)


if __name__ == "__main__":
    main()
