"""Abstention detector study: chapter 11's outlier-score candidates beside further detectors, all on the
same outputs of a finished run's shipped ``.pte`` — what the protection can reach on these features.

    .venv/bin/python bench/abstention_detector_study.py RUN_DIR [--coverage 0.95 0.97] [--risk 0.02 0.015]

Every detector is fitted and thresholded by chapter 11's rule (:mod:`cropcop_utils.abstention.protection`):
its reference is the shipped regime's training rows' features; the outlier threshold keeps ``coverage`` of
the validation rows (lab val, plus field val for a field-adapted regime); the confidence threshold is the
lowest whose kept validation rows keep the ``risk``.  Beside chapter 11's five candidates:

* ``mahalanobis_l2`` — pytorch-ood's Mahalanobis on L2-normalised features ("Mahalanobis++");
* ``mahalanobis_source`` — Mahalanobis with class × source (lab photo / field-train photo) as its classes,
  so the lab and orchard clusters of a class get their own means;
* ``gaussian_lw`` — a Gaussian per class with Ledoit-Wolf shrinkage (scikit-learn), the nearest one;
* ``pca_residual`` — the feature's norm outside the training features' top principal directions
  (scikit-learn PCA; ViM's residual without its logit term), at 16, 64 and 256 directions.

With ``--head``, detectors that also read the classifier's weights (pytorch-ood), taken from the shipped
regime's float checkpoint (the ``.pte`` was quantised from it; the study prints how far ``features @ W.T + b``
lies from the program's own logits): ``vim_64`` (ViM: the residual outside 64 principal directions, scaled
against the energy, Wang et al. 2022), ``nnguide`` (k-NN similarity in the training bank weighted by
confidence, Park et al. 2023), ``fdbd`` (distance to the decision boundaries over distance to the mean,
Liu & Qin 2024), ``nci`` (alignment with the predicted class's weight vector, Liu et al. 2025), and ``gen``
(generalised entropy of the softmax, logits only, Liu et al. 2023).

Printed per detector and setting: coverage and accuracy on the answered rows of the lab test and of each
field cohort, the share rejected of each out-of-scope kind, and of the jigsaw fitting outliers (the kind
chapter 11 chooses its candidate on).  It reads what chapter 11 reads — the locked test only through
chapter 7's record of the ``.pte``'s logits and features — and changes nothing in the run: a study, not a
test (about 2.5 minutes on 2 cores for the apple book).

With ``--frontier`` it also asks, per detector, whether *any* pair of thresholds meets every target of the
run's profile (``abstention.targets``, ``near_target_kinds``) on the held-back sets themselves
(:func:`hindsight_frontier`): thresholds read off the evaluated sets, which no recipe may do — so a
detector with no such pair cannot meet the targets under any validation-only rule, and the study says
whether a miss belongs to the rule or to the features.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cropcop_utils.abstention import program_outputs as outputs  # noqa: E402
from cropcop_utils.abstention.chapter import abstention_params, regime_val_rows  # noqa: E402
from cropcop_utils.abstention.hindsight import frontier  # noqa: E402
from cropcop_utils.abstention.protection import (  # noqa: E402
    CANDIDATES,
    FAR_KINDS,
    Outputs,
    fit_detectors,
    outlier_scores,
    targets_of,
)
from cropcop_utils.abstention.records import TEST_RECORDS  # noqa: E402
from cropcop_utils.abstention.selective import choose_threshold, confidence_scores  # noqa: E402
from cropcop_utils.core.config import reopen_run  # noqa: E402
from cropcop_utils.core.evidence import Chapter  # noqa: E402
from cropcop_utils.core.sources import is_field_train  # noqa: E402
from cropcop_utils.field.cohorts import cohort_path  # noqa: E402
from cropcop_utils.nets.states import STATE_FILES, load_float, load_states  # noqa: E402
from cropcop_utils.split import load_frozen  # noqa: E402
from cropcop_utils.training import regimes  # noqa: E402

Score = Callable[[Outputs], np.ndarray]


Sets = dict[str, tuple[str, Outputs]]


def program_sets(run_dir: Path, forward: object | None = None
                 ) -> tuple[Outputs, np.ndarray, Outputs, Outputs, Sets, float]:
    """The shipped .pte's outputs: reference (training rows) with each row's source flag, validation, the
    jigsaw fitting outliers, and every evaluated set (name → (kind, outputs)); and the temperature.

    ``forward``: another callable with the program's interface (``outputs(batch)`` → logits, features;
    ``max_batch``; ``sha256``) scored instead of the .pte on the same rows — then the lab test is scored
    through it too, where the .pte's test outputs come from chapter 7's record."""
    ctx = reopen_run(run_dir)
    ch = Chapter(ctx.run_dir, "abstention")
    params = abstention_params(ctx)
    frozen = load_frozen(ch)
    regime = regimes.shipped(regimes.of_run(ctx))
    pte = forward is None
    if pte:
        forward = load_states(ch, len(frozen.class_names), names=("pte",), regime=regime)["pte"].forward
    recipe = ch.read_json("abstention/abstention.json")["deployment"]["protection"]["recipe"]
    section, batch = ctx.section("image"), int(params["batch_size"])

    def roots(rows: pd.DataFrame) -> object:
        return ctx.source_roots if "source" in rows.columns else ctx.corpus_root

    train_rows = (frozen.rows_for("train", field_train=regime.uses_field_train)
                  .sort_values("row_id").reset_index(drop=True))
    reference, _ = outputs.score(forward, train_rows, roots(train_rows), section, batch, "reference")
    from_field = is_field_train(train_rows)
    val_rows = regime_val_rows(frozen, regime)
    val, _ = outputs.score(forward, val_rows, roots(val_rows), section, batch, "val")
    jigsaw = outputs.fitting_outputs(forward, val_rows, roots(val_rows), section, batch,
                                     int(params["jigsaw_tiles"]), int(params["seed"]))
    test_rows = frozen.rows_for("test").sort_values("row_id").reset_index(drop=True)
    if pte:
        test = outputs.test_outputs(ch, ch.read_parquet(TEST_RECORDS["pte"]), test_rows, forward.sha256,
                                    regime.path(outputs.FEATURES_TEST))
    else:
        test, _ = outputs.score(forward, test_rows, roots(test_rows), section, batch, "lab test")
    sets = {"lab_test": ("in_scope", test)}
    for cohort in ctx.field_cohorts:
        primary = cohort.name == ctx.field_cohorts[0].name
        entry = "field/cohort.parquet" if primary else cohort_path(cohort.name, "cohort.parquet")
        rows = ch.read_parquet(entry).sort_values("row_id").reset_index(drop=True)
        rows = rows[rows["label"] >= 0].reset_index(drop=True)
        out, _ = outputs.score(forward, rows, ctx.cohort_root(cohort), section, batch, cohort.name)
        sets[cohort.name] = ("in_scope", out)
    scored = ch.read_parquet("abstention/predictions_out_of_scope.parquet")
    scored = scored[scored["state"] == "pte"]
    for (source, root), frame in scored.groupby(["source", "root"], sort=True):
        rows = frame[["row_id", "rel_path"]].assign(label=-1).reset_index(drop=True)
        out, _ = outputs.score(forward, rows, root, section, batch, str(source))
        sets[str(source)] = ("out_of_scope", out)
    return reference, from_field, val, jigsaw, sets, float(recipe["temperature"])


def unit(z: np.ndarray) -> np.ndarray:
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def detectors(reference: Outputs, from_field: np.ndarray, temperature: float, knn_k: int) -> dict[str, Score]:
    """name → outlier score (higher = stranger) of a set's outputs."""
    from pytorch_ood.detector import Mahalanobis
    from sklearn.covariance import LedoitWolf
    from sklearn.decomposition import PCA

    z, y = reference.features, reference.labels
    book = fit_detectors(z, y, knn_k)
    out: dict[str, Score] = {name: (lambda o, n=name: outlier_scores(book, o, temperature)[n])
                             for name in CANDIDATES}

    def mahalanobis(features: np.ndarray, labels: np.ndarray, transform: Callable) -> Score:
        fitted = Mahalanobis(None).fit_features(torch.as_tensor(transform(features), dtype=torch.float32),
                                                torch.as_tensor(labels, dtype=torch.long))
        return lambda o: fitted.predict_features(
            torch.as_tensor(transform(o.features), dtype=torch.float32)).double().numpy()

    out["mahalanobis_l2"] = mahalanobis(z, y, unit)
    out["mahalanobis_source"] = mahalanobis(z, y + int(y.max() + 1) * from_field, lambda f: f)
    gaussians = [LedoitWolf().fit(z[y == c]) for c in np.unique(y)]
    out["gaussian_lw"] = lambda o: np.min(np.stack([g.mahalanobis(o.features) for g in gaussians], 1), 1)
    mean = z.mean(axis=0)
    for d in (16, 64, 256):
        pca = PCA(min(d, len(z) - 1), svd_solver="full").fit(z - mean)  # exact: a rerun prints the same

        def residual(o: Outputs, pca: PCA = pca) -> np.ndarray:
            centred = o.features - mean
            return np.linalg.norm(centred - pca.inverse_transform(pca.transform(centred)), axis=1)

        out[f"pca_residual_{d}"] = residual
    return out


def head_detectors(reference: Outputs, head: torch.nn.Linear, knn_k: int) -> dict[str, Score]:
    """name → outlier score of the detectors that read the classifier head (``--head``)."""
    from pytorch_ood.detector import GEN, NCI, NNGuide, ViM, fDBD

    z = torch.as_tensor(reference.features, dtype=torch.float32)
    y = torch.as_tensor(reference.labels, dtype=torch.long)
    fitted = {
        "vim_64": ViM(None, d=min(64, z.shape[1] - 1), w=head.weight.detach(), b=head.bias.detach()),
        "nnguide": NNGuide(None, head, k=max(1, int(knn_k))),
        "fdbd": fDBD(None, head),
        "nci": NCI(None, head),
    }
    for detector in fitted.values():
        detector.fit_features(z, y)

    def score(detector: object) -> Score:
        return lambda o: detector.predict_features(
            torch.as_tensor(o.features, dtype=torch.float32)).detach().double().numpy()

    out: dict[str, Score] = {name: score(d) for name, d in fitted.items()}
    out["gen"] = lambda o: GEN.score(torch.as_tensor(o.logits, dtype=torch.float32)).double().numpy()
    return out


def shipped_float(run_dir: Path) -> SimpleNamespace:
    """What the studies that read the float model share: ``ctx``, ``ch`` (chapter 11's view of the run),
    the shipped ``regime``, the ``frozen`` split, and that regime's float compact ``model`` (the checkpoint
    the .pte was quantised from) with its checkpoint ``state`` and verified ``sha256``."""
    ctx = reopen_run(run_dir)
    ch = Chapter(ctx.run_dir, "abstention")
    regime = regimes.shipped(regimes.of_run(ctx))
    frozen = load_frozen(ch)
    path = regime.path(STATE_FILES["compact"])
    model, state = load_float(ch, path, len(frozen.class_names))
    return SimpleNamespace(ctx=ctx, ch=ch, regime=regime, frozen=frozen, model=model, state=state,
                           sha256=ch.inputs[path])


def shipped_head(run_dir: Path, reference: Outputs) -> torch.nn.Linear:
    """The classifier of the shipped regime's float compact checkpoint; prints how far it reproduces the
    program's logits from the program's features on the training rows."""
    head = shipped_float(run_dir).model.get_classifier()
    with torch.no_grad():
        logits = head(torch.as_tensor(reference.features, dtype=torch.float32)).numpy()
    gap = np.abs(logits - reference.logits)
    agree = float((logits.argmax(1) == reference.logits.argmax(1)).mean())
    print(f"float head on the program's features: |logit difference| median {np.median(gap):.3f}, "
          f"max {gap.max():.3f}; top-1 agreement with the program {agree:.3f}")
    return head


def study_table(scores: dict[str, Score], val: Outputs, jigsaw: Outputs, sets: Sets, temperature: float,
                coverages: list[float], risks: list[float]) -> pd.DataFrame:
    """Each detector thresholded by chapter 11's rule at every (coverage, risk): what it answers of each
    in-scope set (and how often right), and rejects of each out-of-scope kind and of the jigsaw outliers."""
    msp = {name: confidence_scores(o.logits, temperature)["msp"] for name, (_, o) in sets.items()}
    val_msp = confidence_scores(val.logits, temperature)["msp"]
    # each detector scores each set once; only the thresholds change with (coverage, risk)
    scored = {name: {"val": score(val), "jigsaw": score(jigsaw),
                     **{set_name: score(o) for set_name, (_, o) in sets.items()}}
              for name, score in scores.items()}
    rows = []
    for coverage in coverages:
        for risk in risks:
            for name, on in scored.items():
                threshold = float(np.quantile(on["val"], coverage, method="higher"))
                kept = on["val"] <= threshold
                confidence = choose_threshold(val_msp[kept], val.correct[kept], risk)["threshold"]
                row = {"coverage_fit": coverage, "risk_fit": risk, "detector": name,
                       "jigsaw_rejected": float((on["jigsaw"] > threshold).mean())}
                for set_name, (kind, o) in sets.items():
                    answered = (on[set_name] <= threshold) & (msp[set_name] >= confidence)
                    if kind == "in_scope":
                        row[f"{set_name} answered"] = float(answered.mean())
                        right = o.correct[answered]
                        row[f"{set_name} right"] = float(right.mean()) if len(right) else None
                    else:
                        row[f"{set_name} rejected"] = float(1.0 - answered.mean())
                rows.append(row)
    return pd.DataFrame(rows)


def hindsight_frontier(scores: dict[str, Score], val: Outputs, sets: Sets, temperature: float,
                       targets: dict[str, float], near_kinds: list[str]) -> pd.DataFrame:
    """Per detector, chapter 11's hindsight diagnosis (:func:`cropcop_utils.abstention.hindsight.frontier`):
    the best pair of thresholds read off the evaluated sets, its figures, and how many grid pairs meet
    every target — a diagnosis of what the features allow, never a recipe."""
    msp = {name: confidence_scores(o.logits, temperature)["msp"] for name, (_, o) in sets.items()}
    val_msp = confidence_scores(val.logits, temperature)["msp"]
    rows = []
    for name, score in scores.items():
        found = frontier(score(val), val_msp, {
            set_name: {"kind": kind if kind == "in_scope" else ("far" if set_name in FAR_KINDS else "near"),
                       "score": score(o), "msp": msp[set_name], "correct": o.correct}
            for set_name, (kind, o) in sets.items()}, targets, near_kinds)
        row = {key: found[key] for key in ("pairs_meeting_all", "best_slack", "binding", "val_kept",
                                           "confidence_threshold")}
        row.update({f"{set_name} {k}": v for set_name, fig in found["figures"].items()
                    for k, v in fig.items()})
        rows.append({"detector": name, **row})
    return pd.DataFrame(rows).sort_values("best_slack", ascending=False)


def print_frontier(frontier: pd.DataFrame, targets: dict[str, float], near_kinds: list[str]) -> None:
    print("\nin hindsight (thresholds read off the evaluated sets: what the features allow, not a recipe); "
          f"targets {targets}, near kinds {near_kinds}")
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format",
                           "{:.3f}".format):
        print(frontier.set_index("detector").T.to_string())


def print_table(table: pd.DataFrame, sets: Sets) -> None:
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format",
                           "{:.3f}".format):
        for (coverage, risk), part in table.groupby(["coverage_fit", "risk_fit"], sort=False):
            print(f"\nvalidation coverage {coverage}, target risk {risk} (n: "
                  + ", ".join(f"{k} {len(o.labels)}" for k, (_, o) in sets.items()) + ")")
            print(part.drop(columns=["coverage_fit", "risk_fit"]).set_index("detector").T.to_string())


def settings(description: str, extra: Callable[[argparse.ArgumentParser], object] | None = None,
             **flags: str) -> tuple[argparse.Namespace, dict]:
    """The study's arguments (run folder, coverages, risks, ``flags``: name → help of further switches, and
    whatever ``extra`` adds to the parser) and the run's chapter 11 parameters."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    for name, text in flags.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=text)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--coverage", type=float, nargs="+", default=None,
                        help="validation coverage of the outlier threshold (default: the run's)")
    parser.add_argument("--risk", type=float, nargs="+", default=None,
                        help="target risk of the confidence threshold (default: the run's)")
    args = parser.parse_args()
    params = abstention_params(reopen_run(args.run_dir))
    args.coverage = args.coverage or [float(params["in_scope_coverage"])]
    args.risk = args.risk or [float(params["target_risk"])]
    return args, params


def main() -> None:
    args, params = settings(__doc__.split("\n\n")[0], head=(
        "also the detectors that read the classifier head (ViM, NNGuide, fDBD, NCI) and GEN"), frontier=(
        "also each detector's best thresholds in hindsight against the profile's targets"))
    reference, from_field, val, jigsaw, sets, temperature = program_sets(args.run_dir)
    scores = detectors(reference, from_field, temperature, int(params["knn_k"]))
    if args.head:
        scores |= head_detectors(reference, shipped_head(args.run_dir, reference), int(params["knn_k"]))
    print_table(study_table(scores, val, jigsaw, sets, temperature, args.coverage, args.risk), sets)
    if args.frontier:
        targets, near = targets_of(params)
        print_frontier(hindsight_frontier(scores, val, sets, temperature, targets, near), targets, near)


if __name__ == "__main__":
    main()
