"""Abstention that protects: which inputs the shipped program refuses, chosen on validation and proven on
kinds of input it never saw while its thresholds were chosen.

Every score is computed from the ``.pte``'s two outputs (``forward`` → logits, features; chapter 7):

* ``msp`` and ``energy`` — from the logits at the validation temperature (:mod:`.selective`);
* ``mahalanobis``, ``relative_mahalanobis`` and ``knn`` — from the features, against the training photos'
  features (the *reference*), with ``pytorch-ood``'s detectors (``Mahalanobis``: class means and a shared
  covariance; ``RMD``: the same minus a class-agnostic Gaussian's; ``KNN``: distance to the k-th nearest
  unit-normalised training feature).

Each candidate is an *outlier score* (higher = stranger).  The recipe, fitted per candidate on validation
rows only (lab val, plus field val for a field-adapted regime): the outlier threshold keeps
``in_scope_coverage`` of the validation rows; among those, the confidence (calibrated max softmax)
threshold is the lowest whose accepted validation rows keep the profile's ``target_risk``.  An input is
answered when both pass.  Which candidate ships is chosen on a *fitting* kind of outlier that is never
evaluated: validation photos cut into tiles and shuffled (:func:`jigsaw`) — the candidate that rejects
most of them at its threshold.  Every other kind (lab test, each field cohort, non-plant photos,
textures, noise, another crop's leaves, the near out-of-scope folder) is held back and only evaluated.
:func:`validation_reach` says, per validation set, whether any confidence threshold behind the outlier
threshold could meet the in-scope targets there at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from .records import AbstentionInputError
from .selective import aurc, choose_threshold, confidence_scores, proportion

CANDIDATES = ("msp", "energy", "mahalanobis", "relative_mahalanobis", "knn")
CANDIDATE_LABELS = {
    "msp": "max softmax (calibrated)",
    "energy": "energy (logits)",
    "mahalanobis": "Mahalanobis distance (features)",
    "relative_mahalanobis": "relative Mahalanobis (features)",
    "knn": "k-th nearest training feature (features)",
}
FEATURE_CANDIDATES = ("mahalanobis", "relative_mahalanobis", "knn")
FAR_KINDS = ("photo", "texture", "noise", "other_crop")
FITTING_KIND = "jigsaw"
TARGET_DEFAULTS = {
    "far_rejection": 0.95,
    "near_rejection": 0.60,
    "field_coverage": 0.90,
    "field_selective_accuracy": 0.97,
    "lab_coverage": 0.95,
    "lab_selective_risk": 0.01,
}


def targets_of(params: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """The chapter's targets (:data:`TARGET_DEFAULTS` under the profile's ``targets``) and the near kinds
    they apply to (``near_target_kinds``)."""
    return ({**TARGET_DEFAULTS, **(params.get("targets") or {})},
            [str(k) for k in params.get("near_target_kinds") or []])


@dataclass(frozen=True)
class Outputs:
    """One set of inputs through the program: its logits, features and labels (-1: out of scope)."""

    logits: np.ndarray
    features: np.ndarray
    labels: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        return self.logits.argmax(axis=1) == self.labels


def fit_detectors(reference: np.ndarray, labels: np.ndarray, knn_k: int) -> dict[str, Any]:
    """pytorch-ood's feature detectors fitted on the reference (training) features."""
    from pytorch_ood.detector import KNN, RMD, Mahalanobis

    if len(reference) == 0:
        raise AbstentionInputError("the feature scores need reference (training) features; there are none")
    z, y = torch.as_tensor(reference, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.long)
    k = max(1, min(int(knn_k), len(reference) - 1))
    return {
        "mahalanobis": Mahalanobis(None).fit_features(z, y),
        "relative_mahalanobis": RMD(None).fit_features(z, y),
        "knn": KNN(None, k=k).fit_features(z, y),
    }


def outlier_scores(detectors: dict[str, Any], out: Outputs, temperature: float) -> dict[str, np.ndarray]:
    """Every candidate's outlier score (higher = stranger) for these outputs."""
    if len(out.labels) == 0:
        return {name: np.zeros(0) for name in CANDIDATES}
    confidence = confidence_scores(out.logits, temperature)
    scores = {"msp": -confidence["msp"], "energy": -confidence["energy"]}
    with torch.no_grad():
        z = torch.as_tensor(out.features, dtype=torch.float32)
        scores.update(
            {name: detectors[name].predict_features(z).double().numpy() for name in FEATURE_CANDIDATES}
        )
    return scores


def jigsaw(images: torch.Tensor, tiles: int, generator: torch.Generator) -> torch.Tensor:
    """Each image cut into ``tiles`` × ``tiles`` squares, shuffled: a leaf's colours and textures without
    its shape — the fitting outlier kind (seeded, so the fit is reproducible)."""
    n, c, h, w = images.shape
    th, tw = h // tiles, w // tiles
    core = images[:, :, : th * tiles, : tw * tiles].reshape(n, c, tiles, th, tiles, tw)
    pieces = core.permute(0, 2, 4, 1, 3, 5).reshape(n, tiles * tiles, c, th, tw)
    order = torch.stack([torch.randperm(tiles * tiles, generator=generator) for _ in range(n)])
    shuffled = pieces[torch.arange(n)[:, None], order]
    grid = (
        shuffled.reshape(n, tiles, tiles, c, th, tw)
        .permute(0, 3, 1, 4, 2, 5)
        .reshape(n, c, th * tiles, tw * tiles)
    )
    result = images.clone()
    result[:, :, : th * tiles, : tw * tiles] = grid
    return result.contiguous()


def fit_candidates(
    val: dict[str, np.ndarray],
    val_msp: np.ndarray,
    val_correct: np.ndarray,
    fitting: dict[str, np.ndarray],
    params: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """Each candidate's two thresholds from validation rows, its rejection of the fitting outliers, and the
    chosen candidate (most fitting outliers rejected; ties: lower validation AURC, then declared order)."""
    coverage, target, level = (
        float(params["in_scope_coverage"]),
        float(params["target_risk"]),
        float(params["ci_level"]),
    )
    fitted = {}
    for name in CANDIDATES:
        threshold = float(np.quantile(val[name], coverage, method="higher"))
        kept = val[name] <= threshold
        confidence = choose_threshold(val_msp[kept], val_correct[kept], target)
        rejected = fitting[name] > threshold
        fitted[name] = {
            "label": CANDIDATE_LABELS[name],
            "score_threshold": threshold,
            "val_kept": float(kept.mean()),
            "confidence": confidence,
            "val_aurc": aurc(-val[name], val_correct),
            "fitting_rejection": proportion(
                int(rejected.sum()), len(rejected), level, f"{FITTING_KIND} images"
            ),
        }
    order = {name: i for i, name in enumerate(CANDIDATES)}
    chosen = min(
        CANDIDATES,
        key=lambda n: (-(fitted[n]["fitting_rejection"]["value"] or 0.0), fitted[n]["val_aurc"], order[n]),
    )
    return fitted, chosen


def accepted(candidate: dict[str, Any], score: np.ndarray, msp: np.ndarray) -> np.ndarray:
    """The inputs a fitted candidate answers: outlier score within its threshold and confidence above."""
    return (np.asarray(score) <= candidate["score_threshold"]) & (
        np.asarray(msp) >= candidate["confidence"]["threshold"]
    )


def validation_reach(candidate: dict[str, Any], scores: np.ndarray, msp: np.ndarray, correct: np.ndarray,
                     sets: dict[str, tuple[str, np.ndarray]], targets: dict[str, float],
                     level: float) -> dict[str, Any]:
    """What validation already says of the in-scope targets, per validation set (``sets``: name → (``lab``
    or ``field``, its row mask)): the fitted candidate's answered share and accuracy on that set, and its
    *reach* — the most of the set a confidence threshold can answer, behind the candidate's own outlier
    threshold, at the set's accuracy target.  A reach below the coverage target means no confidence
    threshold chosen on validation can promise both targets behind that outlier threshold: the miss is
    foreseeable before any held-back input is scored."""
    out = {}
    for name, (kind, mask) in sets.items():
        mask = np.asarray(mask, dtype=bool)
        if not mask.any():
            continue
        cover, risk = ((targets["lab_coverage"], targets["lab_selective_risk"]) if kind == "lab" else
                       (targets["field_coverage"], 1.0 - targets["field_selective_accuracy"]))
        score, confidence = np.asarray(scores)[mask], np.asarray(msp)[mask]
        right = np.asarray(correct, dtype=bool)[mask]
        answer = accepted(candidate, score, confidence)
        kept = score <= candidate["score_threshold"]
        reach = (choose_threshold(confidence[kept], right[kept], risk)["val_coverage"] * kept.mean()
                 if kept.any() else 0.0)
        out[name] = {
            "kind": kind,
            "n": int(mask.sum()),
            "coverage": proportion(int(answer.sum()), len(answer), level, f"{name} rows"),
            "selective_accuracy": proportion(int((right & answer).sum()), int(answer.sum()), level,
                                             "answered rows"),
            "coverage_target": float(cover),
            "accuracy_target": float(1.0 - risk),
            "reach": float(reach),
            "reachable": bool(reach >= cover),
        }
    return out


def apply_recipe(recipe: dict[str, Any], detectors: dict[str, Any], out: Outputs) -> np.ndarray:
    """The deployment recipe (``abstention.json`` → ``deployment.protection.recipe``) applied to a program's
    outputs: which inputs it answers.  ``detectors``: :func:`fit_detectors` on the recipe's reference
    features (``reference_features.parquet``: features and labels)."""
    scores = outlier_scores(detectors, out, float(recipe["temperature"]))
    candidate = {"score_threshold": recipe["score_threshold"],
                 "confidence": {"threshold": recipe["confidence_threshold"]}}
    msp = confidence_scores(out.logits, float(recipe["temperature"]))["msp"]
    return accepted(candidate, scores[recipe["score"]], msp)


def evaluate(fitted: dict[str, Any], sets: dict[str, dict[str, Any]], level: float) -> pd.DataFrame:
    """One row per candidate and evaluated set: coverage, selective accuracy and AURC for an in-scope
    set; the share rejected for an out-of-scope kind.  ``sets``: name → {"kind": "in_scope" | "far" |
    "near", "scores": candidate → outlier score, "msp", "correct" (None out of scope)}."""
    rows = []
    for name, candidate in fitted.items():
        for set_name, s in sets.items():
            answer = accepted(candidate, s["scores"][name], s["msp"])
            row = {"score": name, "set": set_name, "kind": s["kind"], "n": int(len(answer))}
            if s["kind"] == "in_scope":
                correct = np.asarray(s["correct"], dtype=bool)
                share = proportion(int(answer.sum()), len(answer), level, f"{set_name} rows")
                right = proportion(int((correct & answer).sum()), int(answer.sum()), level, "accepted rows")
                row.update(
                    **_share("coverage", share),
                    **_share("selective_accuracy", right),
                    aurc=aurc(-s["scores"][name], correct) if len(correct) else None,
                    accuracy_all=float(correct.mean()) if len(correct) else None,
                )
            else:
                row.update(
                    _share(
                        "rejected", proportion(int((~answer).sum()), len(answer), level, f"{set_name} images")
                    )
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _share(name: str, share: dict[str, Any]) -> dict[str, Any]:
    low, high = share["ci"] or (None, None)
    return {name: share["value"], f"{name}_lo": low, f"{name}_hi": high}


def verdict(
    table: pd.DataFrame, chosen: str, targets: dict[str, float], near_target_kinds: list[str]
) -> dict[str, Any]:
    """The chosen candidate's figures against the profile's targets: which are met, which are not, and
    which could not be measured here (no such inputs in the run, or none answered).  Point estimates
    decide; the intervals are beside them in the table."""
    mine = table[table["score"] == chosen].set_index("set")
    checks = []

    def check(name: str, value: float | None, op: str, target: float, what: str) -> None:
        met = (
            None if value is None or pd.isna(value)
            else bool(value >= target if op == ">=" else value <= target)
        )
        checks.append(
            {
                "target": name,
                "what": what,
                "value": None if met is None else float(value),
                "op": op,
                "goal": float(target),
                "met": met,
            }
        )

    far = mine[mine["kind"] == "far"]
    for kind, row in far.iterrows():
        check("far_rejection", row["rejected"], ">=", targets["far_rejection"], f"{kind} rejected")
    for kind in near_target_kinds:
        value = mine.loc[kind, "rejected"] if kind in mine.index else None
        check("near_rejection", value, ">=", targets["near_rejection"], f"{kind} rejected")
    fields = mine[(mine["kind"] == "in_scope") & (mine.index != "lab_test")]
    for name, row in fields.iterrows():
        check("field_coverage", row["coverage"], ">=", targets["field_coverage"], f"{name} answered")
        check(
            "field_selective_accuracy",
            row["selective_accuracy"],
            ">=",
            targets["field_selective_accuracy"],
            f"{name}: accuracy on answered photos",
        )
    if "lab_test" in mine.index:
        lab = mine.loc["lab_test"]
        check("lab_coverage", lab["coverage"], ">=", targets["lab_coverage"], "lab test answered")
        risk = (
            None
            if lab["selective_accuracy"] is None or pd.isna(lab["selective_accuracy"])
            else 1.0 - lab["selective_accuracy"]
        )
        check(
            "lab_selective_risk", risk, "<=", targets["lab_selective_risk"], "lab test: error among answered"
        )
    measured = [c for c in checks if c["met"] is not None]
    return {
        "checks": checks,
        "protects": bool(measured) and all(c["met"] for c in measured) and len(measured) == len(checks),
        "unmet": [c["what"] for c in checks if c["met"] is False],
        "unmeasured": [c["what"] for c in checks if c["met"] is None],
    }
