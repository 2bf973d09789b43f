"""Abstention view study: the shipped ``.pte``'s scores from one view of each photo against the mean of its
outputs over mirrored views; with ``--per-set``, where chapter 11's pooled validation threshold sits against
each in-scope validation set's own (lab val, field val).

    .venv/bin/python bench/abstention_view_study.py RUN_DIR [--views 1 2 4] [--coverage 0.95] [--risk 0.02]
                                                            [--per-set]

A leaf has no "left" and (for orchard photos) no "up": its mirror images are the same input to a user, so
averaging the program's logits and features over them is test-time augmentation that costs one program call
per view and changes no weight.  Views: 1 — the photo; 2 — and its left-right mirror; 4 — and its
top-bottom mirror and both.  Every detector, reference and threshold is fitted as chapter 11 fits it
(:func:`bench.abstention_detector_study.study_table`), on features computed with the same views.

``--per-set`` also prints, per score, the pooled validation quantile beside lab val's and field val's own,
and the share of each set the pooled threshold keeps (the pooled rule lets the larger field val set
decide).  Printed like the detector study; changes nothing in the run.  With more than one view the lab
test's photos are read again here (chapter 7's record holds one view): a study's look, outside the book's
locked-test log, as the detector study's ``forward`` is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from abstention_detector_study import (  # noqa: E402
    detectors,
    print_table,
    program_sets,
    settings,
    study_table,
)

from cropcop_utils.abstention.chapter import regime_val_rows  # noqa: E402
from cropcop_utils.core.config import reopen_run  # noqa: E402
from cropcop_utils.core.evidence import Chapter  # noqa: E402
from cropcop_utils.core.sources import is_field_train  # noqa: E402
from cropcop_utils.nets.states import load_states  # noqa: E402
from cropcop_utils.split import load_frozen  # noqa: E402
from cropcop_utils.training import regimes  # noqa: E402

MIRRORS = {1: [()], 2: [(), (3,)], 4: [(), (3,), (2,), (2, 3)]}


class Views:
    """The program's interface (``outputs``, ``max_batch``, ``sha256``) with each output the mean over the
    mirrored views of the batch."""

    def __init__(self, forward: object, views: int) -> None:
        self.forward, self.flips = forward, MIRRORS[views]
        self.max_batch, self.sha256 = forward.max_batch, f"{forward.sha256}+views{views}"
        self.n_outputs = forward.n_outputs

    def outputs(self, batch: torch.Tensor) -> list[torch.Tensor]:
        runs = [[t.clone() for t in self.forward.outputs(torch.flip(batch, dims) if dims else batch)]
                for dims in self.flips]
        return [torch.stack(parts).mean(0) for parts in zip(*runs, strict=True)]


def main() -> None:
    def extra(parser: object) -> None:
        parser.add_argument("--views", type=int, nargs="+", default=[1, 2, 4], choices=sorted(MIRRORS))

    args, params = settings(__doc__.split("\n\n")[0], extra,
                            per_set="also each score's validation quantile per set beside the pooled one")
    ctx = reopen_run(args.run_dir)
    ch = Chapter(ctx.run_dir, "abstention")
    frozen = load_frozen(ch)
    regime = regimes.shipped(regimes.of_run(ctx))
    pte = load_states(ch, len(frozen.class_names), names=("pte",), regime=regime)["pte"].forward
    field = is_field_train(regime_val_rows(frozen, regime))  # chapter 11's validation rows, in its order
    for views in args.views:
        reference, from_field, val, jigsaw, sets, temperature = program_sets(
            args.run_dir, Views(pte, views) if views > 1 else None)
        scores = detectors(reference, from_field, temperature, int(params["knn_k"]))
        keep = {k: scores[k] for k in ("msp", "energy", "mahalanobis", "relative_mahalanobis", "knn",
                                         "mahalanobis_source")}
        print(f"\n=== views {views} ===")
        print_table(study_table(keep, val, jigsaw, sets, temperature, args.coverage, args.risk), sets)
        if args.per_set:
            on_val = {name: score(val) for name, score in keep.items()}
            for coverage in args.coverage:
                lab_q = {n: float(np.quantile(v[~field], coverage, method="higher"))
                         for n, v in on_val.items()}
                field_q = {n: float(np.quantile(v[field], coverage, method="higher"))
                           for n, v in on_val.items() if field.any()}
                pooled = {n: float(np.quantile(v, coverage, method="higher")) for n, v in on_val.items()}
                for n in keep:
                    print(f"views {views} cov {coverage} {n}: pooled {pooled[n]:.3f} lab {lab_q[n]:.3f} "
                          f"field {field_q.get(n, float('nan')):.3f} (lab val kept at pooled "
                          f"{(on_val[n][~field] <= pooled[n]).mean():.3f}, field val "
                          f"{(on_val[n][field] <= pooled[n]).mean():.3f})")


if __name__ == "__main__":
    main()
