"""Chapter 11's protection of the shipped ``.pte`` (:mod:`.protection`), measured on a run: the program's
outputs for every set (:mod:`.program_outputs`), the candidates fitted on validation, the chosen one,
each candidate's figures on every held-back set, and the verdict against the profile's targets.

Writes ``abstention/reference_features.parquet`` (the training rows' features the feature scores measure
distance to; its SHA-256 is in the recipe) and ``abstention/protection.parquet`` (the table).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..core.evidence import Chapter, sha256_bytes
from ..core.sources import is_field_train
from ..nets.features import features_frame
from . import program_outputs as outputs
from .hindsight import frontiers
from .protection import (
    CANDIDATE_LABELS,
    FAR_KINDS,
    FITTING_KIND,
    Outputs,
    evaluate,
    fit_candidates,
    fit_detectors,
    outlier_scores,
    targets_of,
    validation_reach,
    verdict,
)
from .records import FOLDER
from .selective import confidence_scores

REFERENCE = f"{FOLDER}/reference_features.parquet"
TABLE = f"{FOLDER}/protection.parquet"
DECISIONS = f"{FOLDER}/decisions.parquet"  # every evaluated input: answered or refused by the shipped recipe


def _roots(ctx: Any, rows: pd.DataFrame) -> Any:
    return ctx.source_roots if "source" in rows.columns else ctx.corpus_root


def measure_protection(
    ctx: Any,
    ch: Chapter,
    frozen: Any,
    regime: Any,
    forward: Any,
    params: dict[str, Any],
    temperature: float,
    val: tuple[pd.DataFrame, Outputs],
    test_rows: pd.DataFrame,
    test_record: pd.DataFrame,
    out_of_scope: pd.DataFrame,
    cohorts: dict[str, tuple[pd.DataFrame, np.ndarray]],
    recorded_out_of_scope: bool = True,
) -> dict[str, Any]:
    """The block ``protection`` of ``abstention.json`` for one regime's ``.pte`` (its files under the
    regime's folder).  ``val``: (rows, the program's outputs on them); ``out_of_scope``: the out-of-scope
    images (``row_id``, ``rel_path``, ``source``, ``root``), with the shipped .pte's logits when
    ``recorded_out_of_scope`` (they must match); ``cohorts``: name → (cohort rows, chapter 10's logits of
    this regime's .pte, in row order)."""
    at = regime.path
    batch, section = int(params["batch_size"]), ctx.section("image")
    level = float(params["ci_level"])
    train_rows = frozen.rows_for("train", field_train=regime.uses_field_train).sort_values("row_id")
    train, _ = outputs.score(
        forward,
        train_rows.reset_index(drop=True),
        _roots(ctx, train_rows),
        section,
        batch,
        "reference features",
    )
    reference = features_frame(train_rows["row_id"], train.features, forward.sha256).assign(
        label=train.labels)
    ch.write_parquet(at(REFERENCE), reference)
    detectors = fit_detectors(train.features, train.labels, int(params["knn_k"]))

    val_rows, val_out = val
    fitting = outputs.fitting_outputs(
        forward,
        val_rows,
        _roots(ctx, val_rows),
        section,
        batch,
        int(params["jigsaw_tiles"]),
        int(params["seed"]),
    )
    score = {
        "val": outlier_scores(detectors, val_out, temperature),
        "fitting": outlier_scores(detectors, fitting, temperature),
    }
    msp = lambda out: confidence_scores(out.logits, temperature)["msp"]  # noqa: E731
    val_msp = msp(val_out)
    fitted, chosen = fit_candidates(score["val"], val_msp, val_out.correct, score["fitting"], params)

    sets: dict[str, dict[str, Any]] = {}

    def add(name: str, kind: str, out: Outputs, row_ids: Any) -> None:
        sets[name] = {
            "row_ids": list(row_ids),
            "kind": kind,
            "scores": outlier_scores(detectors, out, temperature),
            "msp": msp(out),
            "correct": out.correct if kind == "in_scope" else None,
        }

    add("lab_test", "in_scope", outputs.test_outputs(ch, test_record, test_rows, forward.sha256,
                                                     at(outputs.FEATURES_TEST)),
        test_rows["row_id"])
    for name, (cohort, recorded) in cohorts.items():
        root = ctx.cohort_root(next(c for c in ctx.field_cohorts if c.name == name))
        out, record = outputs.score(forward, cohort, root, section, batch, f"cohort {name}")
        if not np.allclose(out.logits, recorded, atol=1e-5):
            raise outputs.AbstentionInputError(
                f"cohort {name}: the .pte's logits differ from chapter 10's "
                "record; rerun the chain from chapter 'runtime'"
            )
        labelled = cohort["label"].to_numpy() >= 0
        add(name, "in_scope", Outputs(out.logits[labelled], out.features[labelled], out.labels[labelled]),
            cohort["row_id"][labelled])
    for (source, root), frame in out_of_scope.groupby(["source", "root"], sort=True):
        rows = frame[["row_id", "rel_path"]].assign(label=-1).reset_index(drop=True)
        out, record = outputs.score(forward, rows, root, section, batch, f"out of scope: {source}")
        if recorded_out_of_scope:
            outputs.same_logits(record, frame, f"out-of-scope {source}")
        add(str(source), "far" if source in FAR_KINDS else "near", out, rows["row_id"])

    table = evaluate(fitted, sets, level)
    ch.write_parquet(at(TABLE), table)
    ch.write_parquet(at(DECISIONS), decisions(fitted[chosen], chosen, sets))
    targets, near_targets = targets_of(params)
    judged = verdict(table, chosen, targets, near_targets)
    # a diagnosis beside the verdict, never the recipe: could any thresholds meet the targets at all?
    hindsight = frontiers(score["val"], val_msp, sets, targets, near_targets)
    chosen_fit = fitted[chosen]
    from_field = is_field_train(val_rows)
    reach = validation_reach(chosen_fit, score["val"][chosen], val_msp, val_out.correct,
                             {"lab val": ("lab", ~from_field), "field val": ("field", from_field)},
                             targets, level)
    return {
        "library": "pytorch-ood 0.4 (Mahalanobis, RMD, KNN on the program's features); max softmax and "
        "energy from its logits",
        "program": {"method": "forward", "outputs": ["logits", "features"], "sha256": forward.sha256},
        "candidates": fitted,
        "chosen": chosen,
        "chosen_label": CANDIDATE_LABELS[chosen],
        "choice_rule": f"most {FITTING_KIND} outliers rejected at the candidate's own threshold; ties: lower "
        "validation AURC, then declared order",
        "recipe": {
            "temperature": temperature,
            "score": chosen,
            "score_threshold": chosen_fit["score_threshold"],
            "confidence": "msp",
            "confidence_threshold": chosen_fit["confidence"]["threshold"],
            "in_scope_coverage": float(params["in_scope_coverage"]),
            "knn_k": int(params["knn_k"]),
            "reference_features": {
                "path": at(REFERENCE),
                "rows": len(reference),
                "sha256": sha256_bytes(np.ascontiguousarray(train.features).tobytes()),
                "split": "train",
                "regime": regime.name,
            },
        },
        "fitted_on": {
            "val_rows": len(val_rows),
            "reference_rows": len(reference),
            "fitting_kinds": [FITTING_KIND],
            "fitting_rows": len(fitting.labels),
        },
        "held_back": sorted(sets),
        "sets": {name: {"kind": s["kind"], "n": int(len(s["msp"]))} for name, s in sets.items()},
        "chosen_figures": _figures(table[table["score"] == chosen]),
        "targets": targets,
        "near_target_kinds": near_targets,
        "verdict": judged,
        "validation": reach,
        "hindsight": hindsight,
        "table": at(TABLE),
        "decisions": at(DECISIONS),
    }


def decisions(candidate: dict[str, Any], name: str, sets: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per evaluated input: its set, kind, the chosen score, the calibrated max softmax and whether
    the recipe answers it (the explorer filters the lab test on this)."""
    from .protection import accepted

    frames = [pd.DataFrame({"set": set_name, "kind": s["kind"], "row_id": s["row_ids"], "score": name,
                            "outlier_score": s["scores"][name], "msp": s["msp"],
                            "answered": accepted(candidate, s["scores"][name], s["msp"])})
              for set_name, s in sets.items()]
    return pd.concat(frames, ignore_index=True)


def _figures(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """set → its figures (shares with their interval), one candidate's rows of the table."""
    out = {}
    for row in rows.to_dict("records"):
        figures = {"kind": row["kind"], "n": int(row["n"])}
        for name in ("coverage", "selective_accuracy", "rejected"):
            if name in row and row[name] is not None and not pd.isna(row[name]):
                figures[name] = {
                    "value": float(row[name]),
                    "ci": [float(row[f"{name}_lo"]), float(row[f"{name}_hi"])],
                }
        out[row["set"]] = figures
    return out
