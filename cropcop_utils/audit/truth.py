"""The planted truth of the synthetic corpus, and the evidence for the radius and thresholds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from ..synthetic import PAIR_KINDS, TRANSFORMS
from .candidates import SOURCES, NearCandidates, decision_settings
from .relations import PixelGroups

# --------------------------------------------------------------------------- synthetic truth
TRUTH_KINDS = PAIR_KINDS
NEAR_TRANSFORMS = TRANSFORMS


@dataclass
class Truth:
    """Planted relations as position pairs over the audited rows (only pairs with both ends admitted)."""

    by_kind: dict[str, set[tuple[int, int]]]
    group_of: dict[int, int]  # position -> planted group (connected planted relations)

    @classmethod
    def from_planted(cls, truth: dict[str, Any], rel_paths: Sequence[str]) -> Truth:
        from .. import synthetic

        position = {rel: k for k, rel in enumerate(rel_paths)}

        def as_positions(pairs: set[frozenset[str]]) -> set[tuple[int, int]]:
            out = set()
            for pair in pairs:
                a, b = tuple(pair)
                if a in position and b in position:
                    i, j = position[a], position[b]
                    out.add((min(i, j), max(i, j)))
            return out

        by_kind = {kind: as_positions(synthetic.planted_pairs(truth, [kind])) for kind in TRUTH_KINDS}
        group_of = {}
        for g, members in enumerate(synthetic.planted_groups(truth)):
            for rel in members:
                if rel in position:
                    group_of[position[rel]] = g
        return cls(by_kind, group_of)

    def related(self, i: int, j: int) -> bool:
        g = self.group_of.get(i)
        return g is not None and g == self.group_of.get(j)

    def evaluate(self, trusted: set[tuple[int, int]], trusted_near: set[tuple[int, int]]) -> dict[str, Any]:
        """Recall per planted kind, and precision of trusted (near) pairs against planted groups."""
        found = {kind: len(pairs & trusted) for kind, pairs in self.by_kind.items()}
        recall = {kind: (found[kind] / len(pairs) if pairs else None) for kind, pairs in self.by_kind.items()}
        near = set().union(*(self.by_kind[k] for k in NEAR_TRANSFORMS))
        true_near = sum(self.related(i, j) for i, j in trusted_near)
        true_all = sum(self.related(i, j) for i, j in trusted)
        return {
            "recall": recall,
            "found": found, "planted": {kind: len(pairs) for kind, pairs in self.by_kind.items()},
            "near_duplicate_recall": len(near & trusted) / len(near) if near else None,
            "near_duplicate_found": len(near & trusted), "near_duplicate_planted": len(near),
            "reshot_recall": recall["reshot"],
            "byte_copy_recall": recall["byte_copy"],
            "near_precision": true_near / len(trusted_near) if trusted_near else None,
            "precision": true_all / len(trusted) if trusted else None,
            "trusted_near_pairs": len(trusted_near), "false_near_pairs": len(trusted_near) - true_near,
        }


def _pair_set(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in pairs}


# --------------------------------------------------------------------------- threshold evidence
def _expanded(candidates: NearCandidates, groups: PixelGroups, mask: np.ndarray) -> set[tuple[int, int]]:
    return _pair_set(groups.expand(candidates.pairs[mask])[0])


def threshold_table(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth | None = None,
) -> pd.DataFrame:
    """One row per pHash radius 0..table_radius: pHash candidate pairs (file pairs, excluding exact
    ones), pairs left by the per-image cap, pairs the verifiers confirm; with truth, recall per planted
    kind and precision of what the pHash source alone would trust at that radius."""
    weight = groups.size(candidates.pairs[:, 0]) * groups.size(candidates.pairs[:, 1]) \
        if len(candidates.pairs) else np.zeros(0, dtype=np.int64)
    capped = candidates.capped
    confirmed = capped & candidates.accepted(*decision_settings(cfg))
    exact_set = _pair_set(exact[["i", "j"]].to_numpy()) if truth is not None else set()
    rows = []
    for radius in range(int(cfg["table_radius"]) + 1):
        inside = candidates.phash_distance <= radius
        row: dict[str, Any] = {
            "radius": radius,
            "candidate_pairs": int(weight[inside].sum()),
            "capped_pairs": int(weight[inside & capped].sum()),
            "confirmed_pairs": int(weight[inside & confirmed].sum()),
            "exact_pairs": int(len(exact)),
        }
        capped_n = row["capped_pairs"]
        row["confirmed_share"] = row["confirmed_pairs"] / capped_n if capped_n else None
        if truth is not None:
            near = _expanded(candidates, groups, inside & confirmed)
            result = truth.evaluate(exact_set | near, near)
            row.update({f"recall_{k}": v for k, v in result["recall"].items()})
            row["recall_near_duplicate"] = result["near_duplicate_recall"]
            row["precision_near"] = result["near_precision"]
            row["precision"] = result["precision"]
        rows.append(row)
    return pd.DataFrame(rows)


def verifier_calibration(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth | None = None,
    thresholds: Sequence[float] | None = None,
) -> pd.DataFrame:
    """Confirmed pairs (and with truth precision / recall) per SSIM threshold, for every proposed pair,
    the geometric verifier's decision held at the profile's settings."""
    thresholds = np.round(np.arange(0.50, 1.0001, 0.01), 2) if thresholds is None else np.asarray(thresholds)
    decision = decision_settings(cfg)
    _, min_inliers, min_ratio, min_ssim, support_ssim, support_inliers, leaf_min = decision[:7]
    proposed = candidates.any_source
    geo_ok = (candidates.geometry_ok(min_inliers, min_ratio, min_ssim) | candidates.leaf_ok(leaf_min)
              | candidates.reshot_ok(*decision[7:]))
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    rows = []
    for t in thresholds:
        # the joint rule moves with the threshold: its SSIM level never exceeds the threshold itself
        both = candidates.both_agree(min(support_ssim, float(t)), support_inliers)
        kept = proposed & (geo_ok | both | (candidates.hash_close & (candidates.ssim >= t)))
        row: dict[str, Any] = {"threshold": float(t)}
        row["confirmed_pairs"] = int((groups.size(candidates.pairs[kept, 0])
                                      * groups.size(candidates.pairs[kept, 1])).sum()) if kept.any() else 0
        if truth is not None:
            near = _expanded(candidates, groups, kept)
            result = truth.evaluate(exact_set | near, near)
            row.update({"recall_near_duplicate": result["near_duplicate_recall"],
                        "recall_reshot": result["reshot_recall"], "recall_crop": result["recall"]["crop"],
                        "precision_near": result["near_precision"], "precision": result["precision"]})
        rows.append(row)
    return pd.DataFrame(rows)


def _kept_scores(candidates: NearCandidates, groups: PixelGroups, exact_set: set[tuple[int, int]],
                 truth: Truth, kept: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The planted-truth figures every calibration table reports for the pairs ``kept``, and the whole
    evaluation (for per-kind recalls)."""
    near = _expanded(candidates, groups, kept)
    result = truth.evaluate(exact_set | near, near)
    scores = {"recall_near_duplicate": result["near_duplicate_recall"],
              "recall_reshot": result["reshot_recall"], "precision_near": result["near_precision"],
              "false_near_pairs": result["false_near_pairs"]}
    return scores, result


def geometry_calibration(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth,
    aligned: Sequence[float] = tuple(np.round(np.arange(0.3, 0.951, 0.05), 2)),
) -> pd.DataFrame:
    """Precision and recall per minimum aligned SSIM of the geometric verifier, its inlier thresholds
    and the plain SSIM threshold held at the profile's."""
    decision = decision_settings(cfg)
    threshold, min_inliers, min_ratio, _, support_ssim, support_inliers, leaf_min = decision[:7]
    proposed = candidates.any_source
    ssim_ok = (candidates.hash_close & (candidates.ssim >= threshold)
               | candidates.both_agree(support_ssim, support_inliers) | candidates.leaf_ok(leaf_min)
               | candidates.reshot_ok(*decision[7:]))
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    rows = []
    for s in aligned:
        geo_ok = candidates.geometry_ok(min_inliers, min_ratio, float(s))
        scores, _ = _kept_scores(candidates, groups, exact_set, truth, proposed & (ssim_ok | geo_ok))
        rows.append({"min_aligned_ssim": float(s), **scores})
    return pd.DataFrame(rows)


def leaf_calibration(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth,
    thresholds: Sequence[float] = tuple(np.round(np.arange(0.80, 1.0001, 0.01), 2)),
) -> pd.DataFrame:
    """Precision and recall per leaf-aligned SSIM threshold, the other verifiers held at the profile's
    settings (the leaf verifier only scores pairs they left open, so this is its whole effect)."""
    decision = decision_settings(cfg)
    proposed = candidates.any_source
    others = candidates.accepted(*decision[:6])
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    rows = []
    reshot_ok = candidates.reshot_ok(*decision[7:])
    for t in thresholds:
        added = candidates.leaf_ok(float(t)) & ~others
        scores, result = _kept_scores(candidates, groups, exact_set, truth,
                                      proposed & (others | added | reshot_ok))
        turned = {f"recall_{k}": result["recall"][k] for k in ("rotate", "crop_large", "shear", "perspective")
                  if k in result["recall"]}
        rows.append({"min_leaf_ssim": float(t), "pairs_added": int(added.sum()), **scores, **turned})
    return pd.DataFrame(rows)


def reshot_calibration(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth,
    shares: Sequence[float] = tuple(np.round(np.arange(0.40, 0.951, 0.05), 2)),
) -> pd.DataFrame:
    """Precision and recall per minimum inlier share of the re-shot verifier's lower rule, its other
    settings and the other verifiers held at the profile's (it only scores pairs they left open, so this
    is its whole effect).  Empty when the verifier is off."""
    decision = decision_settings(cfg)
    if len(decision) <= 7:
        return pd.DataFrame()
    proposed = candidates.any_source
    others = candidates.accepted(*decision[:7])
    min_inliers, support_inliers, _, max_angle = decision[7:]
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    rows = []
    for share in shares:
        added = candidates.reshot_ok(min_inliers, support_inliers, float(share), max_angle) & ~others
        scores, _ = _kept_scores(candidates, groups, exact_set, truth, proposed & (others | added))
        rows.append({"min_share": float(share), "pairs_added": int(added.sum()), **scores})
    return pd.DataFrame(rows)


def recall_by_source(
    candidates: NearCandidates,
    groups: PixelGroups,
    exact: pd.DataFrame,
    cfg: dict[str, Any],
    truth: Truth,
) -> pd.DataFrame:
    """Per planted kind: planted pairs, pairs found, recall of the trusted relationships with its exact
    (Clopper-Pearson) 95 % interval, and for each candidate source the share it proposed and the share it
    proposed that the verifiers then trusted.

    The interval says what one corpus can show: with 18 planted pairs, 18 found still leaves the recall
    anywhere from 0.81 up, and one miss is 0.94.  ``bench/audit_seeds.py`` pools other generator seeds.
    """
    accepted = candidates.accepted(*decision_settings(cfg))
    exact_set = _pair_set(exact[["i", "j"]].to_numpy())
    proposed = {s: _expanded(candidates, groups, candidates.proposed[s]) for s in SOURCES}
    trusted_by = {s: _expanded(candidates, groups, candidates.proposed[s] & accepted) for s in SOURCES}
    trusted = exact_set.union(*trusted_by.values())
    rows = []
    for kind, planted in truth.by_kind.items():
        n, found = len(planted), len(planted & trusted)
        ci = binomtest(found, n).proportion_ci(confidence_level=0.95, method="exact") if n else None
        row: dict[str, Any] = {"kind": kind, "planted_pairs": n, "found": found,
                               "recall": found / n if n else None,
                               "recall_ci_low": ci.low if ci else None,
                               "recall_ci_high": ci.high if ci else None,
                               "exact": len(planted & exact_set) / n if n else None}
        for s in SOURCES:
            row[f"proposed_{s}"] = len(planted & proposed[s]) / n if n else None
            row[f"trusted_{s}"] = len(planted & trusted_by[s]) / n if n else None
        rows.append(row)
    return pd.DataFrame(rows)


def calibrated_threshold(calibration: pd.DataFrame, min_precision: float = 0.98) -> float | None:
    """The lowest threshold whose near-pair precision reaches ``min_precision`` (most recall)."""
    if "precision_near" not in calibration:
        return None
    ok = calibration[calibration["precision_near"].fillna(0) >= min_precision]
    return float(ok["threshold"].min()) if len(ok) else None


def radius_reason(table: pd.DataFrame, radius: int, threshold: float) -> str:
    """Why the profile's pHash radius is a sensible place to stop, in numbers from this run."""
    at = table.set_index("radius")
    here, top = at.loc[radius], at.iloc[-1]
    extra_candidates = int(top["capped_pairs"] - here["capped_pairs"])
    extra_confirmed = int(top["confirmed_pairs"] - here["confirmed_pairs"])
    text = (f"pHash radius {radius} (profile audit.phash_radius) with verifier threshold {threshold:.2f}: "
            f"{int(here['confirmed_pairs']):,} of {int(here['capped_pairs']):,} capped candidates are "
            f"confirmed inside it; widening to radius {int(top.name)} adds {extra_candidates:,} candidates "
            f"but only {extra_confirmed:,} confirmed pairs")
    if "recall_near_duplicate" in at and pd.notna(here["precision_near"]):
        text += (f"; on the planted truth the pHash source alone recovers near duplicates with recall "
                 f"{here['recall_near_duplicate']:.3f} here (vs {top['recall_near_duplicate']:.3f} at radius "
                 f"{int(top.name)}; flips, turns, warps and large crops are left to the other sources) with "
                 f"near-pair precision {here['precision_near']:.3f}")
    return text + "."


def family_recall(truth: dict[str, Any], rel_paths: Sequence[str], groups: pd.DataFrame) -> dict[str, Any]:
    """Planted re-shot families whose admitted members all ended up in one leakage group."""
    group_of = dict(zip(rel_paths, groups["group_id"], strict=True))
    families: dict[int, list[str]] = {}
    for f in truth["files"]:
        if f.get("family") is not None and f["rel_path"] in group_of:
            families.setdefault(int(f["family"]), []).append(f["rel_path"])
    families = {k: v for k, v in families.items() if len(v) > 1}
    whole = sum(len({group_of[r] for r in members}) == 1 for members in families.values())
    return {"families": len(families), "kept_whole": int(whole),
            "recall": whole / len(families) if families else None}
