"""Chapter 10's learning curve: what labelled field photos buy.

Field accuracy and macro-F1 on the scored field cohort (95 % bootstrap intervals) against the number k
of labelled field-train photos per class added to the lab training rows, with the lab test macro-F1 at
each point (does the lab suffer?), for two learners:

* ``frozen_logistic`` — scikit-learn's logistic regression on the ImageNet EfficientNet-Lite0 pooled
  features (:func:`cropcop_utils.audit.embedding.pooled_features`, the audit's embedding, reused from
  ``audit/embedding.npz`` when it was computed the same way): every k of ``field_curve.k``,
  ``field_curve.draws`` seeded draws each;
* ``finetune_compact`` — the compact model's recipe (``training.compact``, packaged ImageNet weights, the
  :mod:`cropcop_utils.training` trainer; :mod:`.curve_finetune`), one draw per k of
  ``field_curve.finetune.k``, selected on lab val + field val.

Draws are nested: draw d of a class is one seeded permutation of its field-train *train* rows, and k
takes its first k, so a larger k only adds photos (the curve measures the photos, not a reshuffle).  A
class holding fewer than k rows gives all it has; ``n_field_per_class`` records what was used.  Lab test
rows are read through :mod:`cropcop_utils.split.locked_test` once per scored learner (each read logged).
Outputs: ``field/curve.parquet``, ``field/curve.json``, ``field/learning_curve.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.config import RunContext, deep_merge
from ..core.evidence import Chapter, sha256_bytes, sha256_json
from .curve_draws import (
    COLUMNS,
    FROZEN,
    LEARNER_LABELS,
    MEASURES,
    curve_row,
    draw_field_rows,
    per_class_counts,
    scored,
    scored_cohort,
)
from .relatives import CROSS_GROUPS, CROSS_PAIRS, field_train_relatives

SECTION = "field_curve"
CURVE = "field/curve.parquet"
FIGURE = "field/learning_curve.png"
DEFAULTS: dict[str, Any] = {
    "k": [0, 10, 25, 50, 100, 250, 500],
    "draws": 5,
    "seed": 0,
    "bootstrap": 1000,
    "ci_level": 0.95,
    "targets": [0.8, 0.9],
    "frozen": {"enabled": True, "logistic_c": 1.0, "max_iter": 3000},
    "finetune": {"enabled": True, "k": [0, 25, 100, 500], "reuse_baseline_at_zero": False, "overrides": {}},
}
TEST_REASON = ("chapter 10 (learning curve): a learner that already read the locked test split is scored "
               "on it again when the curve is rerun; evaluation only, nothing is selected on it")


class CurveConfigError(ValueError):
    """The profile's ``field_curve`` section holds an invalid value."""


def curve_params(ctx: RunContext | None = None, **options: Any) -> dict[str, Any]:
    """``field_curve`` resolved over :data:`DEFAULTS` and checked; errors name the key."""
    section = ctx.section(SECTION) if ctx is not None else {}
    given = deep_merge(section, options)
    unknown = sorted(set(given) - set(DEFAULTS)) + [
        f"{part}.{key}" for part in ("frozen", "finetune") for key in sorted(set(given.get(part) or {})
                                                                              - set(DEFAULTS[part]))]
    if unknown:
        raise CurveConfigError(f"{SECTION}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)} and frozen."
                               f"{sorted(DEFAULTS['frozen'])}, finetune.{sorted(DEFAULTS['finetune'])}")
    params = deep_merge(DEFAULTS, given)
    for where, ks in (("k", params["k"]), ("finetune.k", params["finetune"]["k"])):
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks) \
                or len(set(ks)) != len(ks):
            raise CurveConfigError(f"{SECTION}.{where} must be distinct whole numbers >= 0, got {ks!r}")
    for key in ("draws", "bootstrap"):
        if isinstance(params[key], bool) or not isinstance(params[key], int) or params[key] < 1:
            raise CurveConfigError(f"{SECTION}.{key} must be a whole number >= 1, got {params[key]!r}")
    if not 0 < float(params["ci_level"]) < 1:
        raise CurveConfigError(f"{SECTION}.ci_level must be in (0, 1), got {params['ci_level']!r}")
    if any(not 0 < float(t) <= 1 for t in params["targets"]):
        raise CurveConfigError(f"{SECTION}.targets are field accuracies in (0, 1], got {params['targets']!r}")
    if float(params["frozen"]["logistic_c"]) <= 0 or int(params["frozen"]["max_iter"]) < 1:
        raise CurveConfigError(f"{SECTION}.frozen.logistic_c must be > 0 and max_iter >= 1")
    params["k"], params["finetune"]["k"] = sorted(params["k"]), sorted(params["finetune"]["k"])
    return params


# --------------------------------------------------------------------------- frozen features
class FeatureBank:
    """Pooled Lite0 features by row id: taken from ``audit/embedding.npz`` when it was computed the way
    this curve would (same weights, side, mean and std), else computed from the loading contract's
    squares (:func:`cropcop_utils.audit.embedding.pooled_features`)."""

    def __init__(self, side: int, reuse: Path | None = None, progress: bool = False) -> None:
        self.side, self.reuse, self.progress = int(side), reuse, progress
        self.features: dict[str, np.ndarray] = {}
        self.sources: dict[str, int] = {"reused": 0, "computed": 0}

    def of(self, rows: pd.DataFrame, roots: Any) -> np.ndarray:
        """Features (N, 1280) of ``rows`` in order; ``roots`` as for
        :func:`cropcop_utils.core.squares.row_paths`."""
        from ..audit import embedding
        from ..core.squares import SquareCache, row_paths
        from ..nets.pretrained import INPUT_MEAN, INPUT_STD

        ids = rows["row_id"].astype(str).to_numpy()
        missing = np.array([i not in self.features for i in ids], dtype=bool)
        if missing.any() and self.reuse is not None and self.reuse.exists():
            found, _ = embedding.reusable_features(
                self.reuse, embedding.ARCH, embedding.weights_description()["sha256"], self.side,
                list(INPUT_MEAN), list(INPUT_STD), ids[missing])
            if found is not None:
                self.features.update(zip(ids[missing], found, strict=True))
                self.sources["reused"] += int(missing.sum())
                missing[:] = False
        if missing.any():
            todo = rows[missing]
            paths = row_paths(todo, roots)
            # 256 squares a batch of features (the process-wide SquareCache keeps them within its budget)
            for start in range(0, len(paths), 256):
                cache = SquareCache(paths[start:start + 256], self.side, enabled=True)
                cache.fill(progress=self.progress, desc="curve: decode")
                block = embedding.pooled_features(np.stack([cache.get(i) for i in range(len(cache.paths))]))
                self.features.update(zip(ids[missing][start:start + 256], block, strict=True))
            self.sources["computed"] += int(missing.sum())
        if not len(ids):
            return np.zeros((0, embedding.DIM), np.float32)
        return np.stack([self.features[i] for i in ids])


def fit_frozen(x: np.ndarray, y: np.ndarray, params: dict[str, Any]) -> tuple[Any, str]:
    """Standardised features into a multinomial logistic regression; returns (model, SHA-256 of its
    fitted numbers: the model state a lab test read is logged under)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frozen = params["frozen"]
    model = make_pipeline(StandardScaler(), LogisticRegression(C=float(frozen["logistic_c"]),
                                                               max_iter=int(frozen["max_iter"])))
    model.fit(x, y)
    scaler, logistic = model[0], model[-1]
    numbers = b"".join(np.ascontiguousarray(a, dtype=np.float64).tobytes() for a in (
        scaler.mean_, scaler.scale_, logistic.coef_, logistic.intercept_, logistic.classes_))
    return model, sha256_bytes(numbers)


def _predict(model: Any, x: np.ndarray) -> np.ndarray:
    return model.predict(x).astype(np.int64)


def frozen_curve(bank: FeatureBank, sets: Mapping[str, pd.DataFrame], roots: Mapping[str, Any],
                 class_names: list[str], params: dict[str, Any],
                 read_test: Callable[[str], pd.DataFrame]) -> list[dict[str, Any]]:
    """Every (k, draw) of the frozen-feature learner.  ``sets``: ``lab_train``, ``field_pool`` (field-train
    train rows) and ``cohort``; ``roots``: the folder of each, and of ``test``; ``read_test(model_state)``
    hands out the lab test rows (logged)."""
    lab, pool, cohort = sets["lab_train"], sets["field_pool"], sets["cohort"]
    x_lab, x_cohort = bank.of(lab, roots["lab_train"]), bank.of(cohort, roots["cohort"])
    index = {row: i for i, row in enumerate(pool["row_id"])}
    x_pool = bank.of(pool, roots["field_pool"])
    rows: list[dict[str, Any]] = []
    test, x_test = None, None
    fitted: dict[tuple[str, ...], tuple[int, tuple]] = {}  # drawn rows -> (draw, results) already fitted
    for k in params["k"]:
        for draw in range(int(params["draws"]) if k else 1):  # k = 0 is the lab alone: one fit
            drawn = draw_field_rows(pool, k, int(params["seed"]), draw)
            key = (str(k), *sorted(drawn["row_id"].astype(str)))
            if key in fitted:  # every class gave all it holds: the same rows as an earlier draw
                first, results = fitted[key]
                rows.append(curve_row(FROZEN, k, draw, *results, f"the same rows as draw {first}"))
                continue
            x = np.concatenate([x_lab, x_pool[[index[r] for r in drawn["row_id"]]]])
            y = np.concatenate([lab["label"].to_numpy(), drawn["label"].to_numpy()]).astype(np.int64)
            model, state = fit_frozen(x, y, params)
            rows_test = read_test(state)
            if test is None:
                test, x_test = rows_test, bank.of(rows_test, roots["test"])
            results = (per_class_counts(drawn, class_names), len(lab),
                       scored_cohort(cohort, _predict(model, x_cohort), class_names, params),
                       scored(test["label"].to_numpy(), _predict(model, x_test), class_names, params),
                       state, None)
            fitted[key] = (draw, results)
            rows.append(curve_row(FROZEN, k, draw, *results))
    return rows


# --------------------------------------------------------------------------- summary
def smallest_k(table: pd.DataFrame, learner: str, target: float) -> dict[str, Any]:
    """The smallest k whose field accuracy (mean over draws) reaches ``target``, and the smallest whose
    interval's lower end (mean over draws) does; None for "not reached" with the largest k tried."""
    rows = table[table["learner"] == learner]
    if not len(rows):
        return {"target": target, "k": None, "k_lower_bound": None, "largest_k_tried": None}
    means = rows.groupby("k")[["field_accuracy", "field_accuracy_lo"]].mean().sort_index()
    reached = means.index[means["field_accuracy"] >= target]
    safe = means.index[means["field_accuracy_lo"] >= target]
    return {"target": target, "k": int(reached[0]) if len(reached) else None,
            "k_lower_bound": int(safe[0]) if len(safe) else None, "largest_k_tried": int(means.index[-1])}


def summary_by_k(table: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Per learner and k: mean field accuracy, macro-F1 and lab test macro-F1 over draws, with the draws'
    spread and the mean interval limits (what the figure draws)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for learner, rows in table.groupby("learner", sort=False):
        out[str(learner)] = [
            {"k": int(k), "draws": len(g), "n_field_per_class_min": int(min(
                min(json.loads(c).values(), default=0) for c in g["n_field_per_class"])),
             **{col: _mean(g[col]) for col in MEASURES},
             "field_accuracy_draw_min": float(g["field_accuracy"].min()),
             "field_accuracy_draw_max": float(g["field_accuracy"].max())}
            for k, g in rows.groupby("k", sort=True)]
    return out


def _mean(values: pd.Series) -> float | None:
    """Mean of the defined values (an interval limit is None where it is undefined), None if none is."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.mean()) if len(values) else None


def run_curve(ctx: RunContext, progress: bool = False) -> dict[str, Any]:
    """Measure the learning curve of the run and write ``field/curve.parquet``, ``field/curve.json`` and
    ``field/learning_curve.png``; returns the record (also when there is nothing to measure: ``status``
    and ``reason`` say why)."""
    from ..core.sources import FIELD_TRAIN
    from ..split import load_frozen, locked_test
    from . import curve_figures
    from .cohort import field_root, sample_fraction, scan_field

    params = curve_params(ctx)
    ch = Chapter(ctx.run_dir, "curve", folder="field")
    frozen = load_frozen(ch)
    names = frozen.class_names
    lab_train = frozen.rows_for("train")
    root = field_root(ctx)
    base = {"params": params, "classes": names, "learners": LEARNER_LABELS}
    reason = None
    if root is None:
        reason = "the run has no field cohort (`--field`): there is nothing to score the curve on"
    elif frozen.field_train is None or not len(frozen.field_train):
        reason = "the run has no field-train photos (`--field-train`): there is nothing to add"
    cohort = None
    if reason is None:
        scan = scan_field(root, names, max_image_pixels=ctx.section("corpus").get("max_image_pixels"),
                          sample_fraction=sample_fraction(ctx))
        cohort = scan.rows
        reason = "the field cohort has no admitted photo" if not len(cohort) else None
    if reason is not None:
        return ch.finish(figures={}, status="not_measured", reason=reason, **base)
    train = frozen.rows_for("train", field_train=True)
    pool = train[train["source"] == FIELD_TRAIN].reset_index(drop=True)
    related = field_train_relatives(ch, ctx) or {"trusted": set(), "near_miss": set()}
    relatives = related["trusted"] | related["near_miss"]
    cohort = cohort.assign(no_relative=~cohort["row_id"].isin(relatives))
    accesses: list[dict[str, Any]] = []

    def read_test(state: str, reader: str = "field/curve") -> pd.DataFrame:
        earlier = locked_test.accesses_for(ctx.run_dir, state)
        accesses.append({"model_state": state, "access": len(earlier) + 1, "override": bool(earlier)})
        return locked_test.read_test_rows(ctx.run_dir, state, reader=reader, override=bool(earlier),
                                          reason=TEST_REASON if earlier else None)

    side = int(ctx.section("image")["size"])
    bank = FeatureBank(side, ch.path("audit/embedding.npz"), progress)
    if bank.reuse is not None and bank.reuse.exists():
        ch.verify("audit/embedding.npz")
    sets = {"lab_train": lab_train, "field_pool": pool, "cohort": cohort}
    rows: list[dict[str, Any]] = []
    if params["frozen"]["enabled"]:
        roots = {"lab_train": ctx.corpus_root, "field_pool": ctx.field_train_root, "cohort": root,
                 "test": ctx.corpus_root}
        rows += frozen_curve(bank, sets, roots, names, params, read_test)
    finetune: dict[str, Any] = {"enabled": bool(params["finetune"]["enabled"])}
    if params["finetune"]["enabled"]:
        from . import curve_finetune

        tuned, finetune = curve_finetune.finetune_curve(ctx, ch, frozen, pool, cohort, root, params,
                                                        read_test, progress)
        rows += tuned
    table = pd.DataFrame(rows, columns=COLUMNS)
    ch.write_parquet(CURVE, table)
    facts = {"smallest_k": {learner: [smallest_k(table, learner, float(t)) for t in params["targets"]]
                            for learner in table["learner"].unique()},
             "by_k": summary_by_k(table)}
    ch.save_figure(curve_figures.learning_curve_figure(facts["by_k"], params), FIGURE, dpi=110)
    return ch.finish(
        figures={"learning_curve": FIGURE, **{f"{learner}_smallest_k_{round(e['target'] * 100)}": e["k"]
                                              for learner, entries in facts["smallest_k"].items()
                                              for e in entries}},
        status="measured", reason=None, **base, **facts, table=CURVE,
        field_train={"train_rows": len(pool), "per_class": per_class_counts(pool, names)},
        cohort={"root": str(root), "n": len(cohort), "sample": scan.summary["sample"],
                "n_no_relative": int(cohort["no_relative"].sum()),
                "relatives": f"{CROSS_GROUPS} and {CROSS_PAIRS}: a cohort photo in a leakage group with a "
                             "field-train photo, or on the review list with one, has a relative; the "
                             "no_relative columns score the others",
                "rows_sha256": sha256_json(sorted(cohort["sha256"].tolist()))},
        frozen={"backbone": _backbone(), "features": dict(bank.sources), "side": side,
                "classifier": "scikit-learn StandardScaler + LogisticRegression (lbfgs, multinomial)"},
        finetune=finetune, test_access=accesses,
    )


def _backbone() -> dict[str, Any]:
    from ..audit import embedding

    return {"arch": embedding.ARCH, "weights": embedding.weights_description()}
