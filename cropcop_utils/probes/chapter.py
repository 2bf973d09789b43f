"""Chapter 4: probes — what the frozen benchmark already tells before any model is trained.

Three kinds of probe, each a small scikit-learn classifier fitted on the frozen split:

* **frozen-feature linear probe** — multinomial logistic regression on standardised frozen features
  (the reference backbone when its weights are on this machine, otherwise the hand-crafted colour +
  texture fallback of :mod:`.backbone` and :mod:`.features`), trained on train, scored on val and test:
  accuracy, macro-F1, balanced accuracy and the accuracy − macro-F1 gap (minority classes already lost);
* **acquisition-cue probes** — the class predicted from something that is not the plant: file metadata
  (EXIF make/model, bytes, dimensions, JPEG encoder settings), a tiny low-frequency thumbnail, the
  border strips and the eight corner pixels; scored against chance (1/K) and the majority-class rate;
* **split-membership probes** — can a classifier tell train images from test images?  Out-of-fold ROC
  AUC (StratifiedGroupKFold over the leakage groups); near 0.5 means the split is coherent.

Every figure carries a percentile-bootstrap 95 % interval over rows (:mod:`cropcop_utils.core.metrics`).
Chapter 4 runs before any training and reads the test rows through ``split.load_frozen`` only to
report these diagnostics; nothing here selects a model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from ..core.config import RunContext
from ..core.evidence import Chapter, FingerprintMismatch, sha256_file
from . import features as feat
from .backbone import BackboneChoice, extract_backbone_features, resolve_backbone
from .cache import FeatureCache
from .classifiers import EVAL_SPLITS, class_probe
from .cues import CUE_DESCRIPTIONS, CUE_SETS, META_CATEGORICAL, metadata_frame
from .errors import ProbeInputError
from .membership import membership_probe
from .report import plot_probe_summary, summary_table

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


def _pixel_settings(ctx: RunContext, params: dict[str, Any]) -> feat.PixelSettings:
    names = ("thumbnail_px", "border_px", "border_segments", "corner_inset", "hog_cells")
    return feat.PixelSettings(size=int(ctx.section("image")["size"]), **{k: int(params[k]) for k in names})


def frozen_features(ctx: RunContext, params: dict[str, Any], cache: FeatureCache, paths: Sequence[Path],
                    row_ids: np.ndarray, handcrafted: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The frozen representation (backbone or fallback) and the evidence record of which one it is."""
    image = ctx.section("image")
    size = int(image["size"])
    choice = resolve_backbone(params["backbone"], params["backbone_weights"],
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
        return {"backbone": extract_backbone_features(
            paths, choice, size, image["mean"], image["std"], int(params["backbone_batch_size"]),
            workers=int(params["workers"]), progress=bool(params["progress"]))}

    values = cache.fetch(["backbone"], settings, row_ids, compute)["backbone"]
    info["feature_dim"] = int(values.shape[1])
    return values, info


def _audit_features(ch: Chapter, choice: BackboneChoice, weights_sha256: str, size: int,
                    image: dict[str, Any], row_ids: np.ndarray) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The audit's pooled features of the same network, weights and contract square, when it made them.

    Why: the audit's embedding pass (chapter 2) already runs this backbone over every admitted image
    through the loading contract; running it again here cost 80-140 s on PlantVillage tomato."""
    from ..audit import embedding

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
    from .. import split as split_mod

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
    from .. import synthetic

    ch.inputs["synthetic/planted.json"] = sha256_file(path)
    return synthetic.load_truth(path)


def chapter_paths(run_dir: str | os.PathLike) -> dict[str, Path]:
    """Where the chapter's evidence lies in a run folder (the notebook reads these)."""
    run_dir = Path(run_dir)
    return {"record": run_dir / "probes" / "probes.json", "summary": run_dir / "probes" / "summary.parquet",
            "plot": run_dir / "probes" / "probe_summary.png"}
