"""Chapter 11: calibration, abstention and out-of-scope inputs — a model that can say "I don't know".

For every model state (float reference, float compact, converted INT8 graph, the ``.pte``), from the
logits its prediction records hold:

1. calibration: one temperature fitted on validation only (scipy's bounded scalar minimiser of the
   validation NLL — a one-parameter fit needs no more); NLL, Brier and ECE before and after, on test;
2. selective prediction: risk–coverage curves and AURC on test for three confidence scores, and an
   abstention threshold chosen on validation for the profile's target risk, applied once to test;
3. split conformal prediction sets (``crepes``), calibrated on validation: coverage, set size,
   per-class coverage, marginal and class-conditional (Mondrian by label);
4. the field cohort of chapter 10, when the run has one, and out-of-scope images (not plants, and
   leaves of another crop): the share abstained and the rejection rate at the chosen threshold;
5. the deployment recipe for the ``.pte`` (temperature, score, threshold and what they did), under
   ``deployment`` in ``abstention/abstention.json``, which chapter 10's model card reads.

No model reads the locked test here: the test rows are the recorded predictions of chapters 5–7.
The ``.pte`` has no validation record, so its validation rows are scored here (validation is not the
locked test) and written to ``abstention/predictions_val_pte.parquet``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, special, stats
from sklearn.metrics import brier_score_loss

from . import card, metrics, regimes
from .card import CARD
from .config import RunContext
from .evidence import Chapter, atomic_write_bytes, read_registry, row_id, sha256_bytes
from .model_states import STATE_LABELS, STATE_NAMES, STATES
from .predict import logits_matrix

FOLDER = "abstention"
SCORES = ("msp", "margin", "energy")
SCORE_LABELS = {"msp": "max softmax (calibrated)", "margin": "top-1 − top-2 probability (calibrated)",
                "energy": "negative energy T·logsumexp(z/T)"}
FIELD_RECORD = "field/field.json"
DEFAULTS: dict[str, Any] = {
    "target_risk": 0.02, "score": "msp", "ece_bins": 15, "bootstrap": 1000, "seed": 0, "ci_level": 0.95,
    "conformal_levels": [0.90, 0.95], "min_class_support": 30, "curve_points": 200,
    "noise_images": 6, "out_of_scope_px": 128, "other_crop_data": None, "other_crop_images": 100,
    "batch_size": 32,
}
TEMPERATURE_BOUNDS = (0.05, 20.0)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


class AbstentionInputError(ValueError):
    """Records that cannot be calibrated or compared (rows, labels or class count do not fit)."""


# --------------------------------------------------------------------------- statistics
def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return special.softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=1)


def nll(logits: np.ndarray, y: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true class (natural log)."""
    log_prob = special.log_softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=1)
    return float(-log_prob[np.arange(len(y)), y].mean())


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """The temperature T minimising the NLL of softmax(z / T) on these (validation) rows.

    scipy's bounded scalar minimiser over log T: one parameter, a convex objective in 1/T, so a library
    calibrator (netcal) would add a dependency for the same number.
    """
    if len(y) == 0:
        raise AbstentionInputError("temperature scaling needs validation rows; the record has none")
    low, high = np.log(TEMPERATURE_BOUNDS)
    result = optimize.minimize_scalar(lambda log_t: nll(logits, y, float(np.exp(log_t))),
                                      bounds=(low, high), method="bounded", options={"xatol": 1e-5})
    return float(np.exp(result.x))


def brier(prob: np.ndarray, y: np.ndarray) -> float:
    """Multiclass Brier score: mean over rows of the squared distance to the one-hot label (scikit-learn)."""
    return float(brier_score_loss(y, prob, labels=np.arange(prob.shape[1])))


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    """ECE over ``n_bins`` equal-mass bins of the top-1 confidence: Σ (n_b / N) · |accuracy_b − confidence_b|.

    Written here because netcal (and scikit-learn's ``calibration_curve``) bin by equal width or need
    one class; equal-mass bins over the top-1 confidence are a few lines.  Rows are sorted by
    confidence (stable) and split into bins whose sizes differ by at most one.
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        raise AbstentionInputError("ECE needs rows")
    order = np.argsort(confidence, kind="stable")
    gap = sum(len(b) * abs(correct[b].mean() - confidence[b].mean())
              for b in np.array_split(order, min(n_bins, len(order))))
    return float(gap / len(order))


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> pd.DataFrame:
    """The equal-mass bins of :func:`expected_calibration_error`: rows, mean confidence, accuracy."""
    order = np.argsort(np.asarray(confidence, dtype=np.float64), kind="stable")
    parts = np.array_split(order, min(n_bins, len(order)))
    return pd.DataFrame({"bin": np.arange(len(parts)), "rows": [len(b) for b in parts],
                         "confidence": [float(np.mean(confidence[b])) for b in parts],
                         "accuracy": [float(np.mean(correct[b])) for b in parts]})


def proportion(successes: int, n: int, level: float = 0.95, what: str = "rows") -> dict[str, Any]:
    """A share with its Wilson interval (scipy); ``None`` with a reason when there are no rows."""
    if n == 0:
        return {"value": None, "ci": None, "n": 0, "reason": f"no {what}: the share is undefined"}
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return {"value": successes / n, "ci": [float(ci.low), float(ci.high)], "n": int(n)}


def confidence_scores(logits: np.ndarray, temperature: float) -> dict[str, np.ndarray]:
    """Higher = more confident, for each score of :data:`SCORES` (all on the calibrated logits)."""
    prob = probabilities(logits, temperature)
    top2 = -np.sort(-prob, axis=1)[:, :2] if prob.shape[1] > 1 else np.c_[prob, np.zeros(len(prob))]
    energy = temperature * special.logsumexp(np.asarray(logits, dtype=np.float64) / temperature, axis=1)
    return {"msp": top2[:, 0], "margin": top2[:, 0] - top2[:, 1], "energy": energy}


def risk_coverage(score: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, selective risk) accepting the k most confident rows, k = 1..N (ties in row order)."""
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")
    errors = np.cumsum(~np.asarray(correct, dtype=bool)[order])
    k = np.arange(1, len(order) + 1)
    return k / len(order), errors / k


def aurc(score: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk–coverage curve: the mean selective risk over k = 1..N accepted rows."""
    if len(score) == 0:
        raise AbstentionInputError("AURC needs rows")
    return float(risk_coverage(score, correct)[1].mean())


def choose_threshold(val_score: np.ndarray, val_correct: np.ndarray, target_risk: float) -> dict[str, Any]:
    """The lowest threshold whose accepted validation rows (score ≥ threshold) have risk ≤ target.

    Takes validation rows only: the test split cannot move it.  Thresholds sit at distinct score
    values, so a tie is accepted or rejected as a whole.  When no threshold meets the target, the
    threshold is just above the highest validation score (abstain on everything) and that is said.
    """
    score = np.asarray(val_score, dtype=np.float64)
    if score.size == 0:
        raise AbstentionInputError("the abstention threshold is chosen on validation rows; there are none")
    order = np.argsort(-score, kind="stable")
    ranked = score[order]
    risk = np.cumsum(~np.asarray(val_correct, dtype=bool)[order]) / np.arange(1, len(ranked) + 1)
    ends = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])  # last row of each tie group
    meets = ends[risk[ends] <= target_risk]
    if meets.size == 0:
        return {"threshold": float(np.nextafter(ranked[0], np.inf)), "target_met_on_val": False,
                "val_coverage": 0.0, "val_selective_risk": None,
                "reason": f"no threshold keeps the validation risk at or below {target_risk}: "
                          "the recipe abstains on every input"}
    k = int(meets.max())
    return {"threshold": float(ranked[k]), "target_met_on_val": True,
            "val_coverage": (k + 1) / len(ranked), "val_selective_risk": float(risk[k])}


def apply_threshold(score: np.ndarray, correct: np.ndarray | None, threshold: float,
                    level: float = 0.95) -> dict[str, Any]:
    """Coverage and selective risk (Wilson intervals) of rows accepted at ``score ≥ threshold``."""
    accepted = np.asarray(score, dtype=np.float64) >= threshold
    out = {"n": int(accepted.size), "accepted": int(accepted.sum()),
           "coverage": proportion(int(accepted.sum()), accepted.size, level, "rows")}
    if correct is not None:
        wrong = ~np.asarray(correct, dtype=bool)
        out["selective_risk"] = proportion(int(wrong[accepted].sum()), int(accepted.sum()), level,
                                           "accepted rows")
        out["risk_all"] = proportion(int(wrong.sum()), accepted.size, level, "rows")
    return out


# --------------------------------------------------------------------------- conformal prediction
def conformal_sets(cal_prob: np.ndarray, cal_y: np.ndarray, prob: np.ndarray, confidence: float,
                   seed: int = 0, class_conditional: bool = False) -> np.ndarray:
    """Split conformal prediction sets (rows × classes, bool) with ``crepes``, hinge non-conformity.

    Calibrated on (``cal_prob``, ``cal_y``) — validation rows.  ``class_conditional`` makes it Mondrian
    by label (each candidate class is judged against the calibration rows of that class), which keeps
    the coverage of small classes near nominal where a marginal set under-covers them.
    """
    from crepes import ConformalClassifier
    from crepes.extras import hinge

    classes = np.arange(prob.shape[1])
    cal_alphas = hinge(cal_prob, classes, np.asarray(cal_y))
    alphas = hinge(prob)
    if not class_conditional:
        return ConformalClassifier().fit(cal_alphas).predict_set(alphas, confidence=confidence,
                                                                 seed=seed).astype(bool)
    mondrian = ConformalClassifier().fit(cal_alphas, bins=np.asarray(cal_y))
    # crepes' WrapClassifier(class_cond=True) does the same: one p-value column per candidate class.
    p_values = np.column_stack([mondrian.predict_p(alphas[:, c], bins=np.full(len(prob), c), seed=seed + c)
                                for c in classes]) if len(prob) else np.zeros(prob.shape)
    return p_values >= 1.0 - confidence


def set_summary(sets: np.ndarray, y: np.ndarray, level: float = 0.95) -> dict[str, Any]:
    """Coverage (with Wilson interval), mean set size and the shares of singleton and empty sets."""
    sizes = sets.sum(axis=1)
    if len(y) == 0:
        return {"n": 0, "coverage": proportion(0, 0, level), "mean_set_size": None, "singleton_share": None,
                "empty_share": None, "reason": "no rows"}
    covered = sets[np.arange(len(y)), y]
    return {"n": int(len(y)), "coverage": proportion(int(covered.sum()), len(y), level),
            "mean_set_size": float(sizes.mean()), "singleton_share": float(np.mean(sizes == 1)),
            "empty_share": float(np.mean(sizes == 0))}


def per_class_coverage(sets: np.ndarray, y: np.ndarray, n_classes: int) -> pd.DataFrame:
    covered = sets[np.arange(len(y)), y] if len(y) else np.zeros(0, dtype=bool)
    rows = []
    for label in range(n_classes):
        member = y == label
        n = int(member.sum())
        rows.append({"label": label, "rows": n, "coverage": float(covered[member].mean()) if n else None,
                     "mean_set_size": float(sets[member].sum(axis=1).mean()) if n else None})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- out-of-scope images
# scikit-image's bundled samples that are not plants (grass is left out: it is one).
NON_PLANT_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "clock",
                    "hubble_deep_field", "immunohistochemistry")
NON_PLANT_TEXTURES = ("brick", "gravel", "text", "checkerboard")


def _rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    return image[..., :3].astype(np.uint8)


def out_of_scope_images(noise_images: int, seed: int, side: int) -> list[tuple[str, str, np.ndarray]]:
    """(name, kind, RGB uint8 array) of every non-plant image: sample photos, textures, seeded noise."""
    import skimage.data
    from PIL import Image
    from skimage.filters import gaussian

    def square(image: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(_rgb(image)).resize((side, side), Image.Resampling.BICUBIC))

    images = [(name, "photo", square(getattr(skimage.data, name)())) for name in NON_PLANT_PHOTOS]
    images += [(name, "texture", square(getattr(skimage.data, name)())) for name in NON_PLANT_TEXTURES]
    rng = np.random.default_rng(seed)
    for i in range(noise_images):
        # alternate white noise and smooth (blurred) colour noise: two kinds of input no camera takes
        noise = rng.random((side, side, 3))
        if i % 2:
            noise = gaussian(noise, sigma=side / 16, channel_axis=-1)
            noise = (noise - noise.min()) / max(np.ptp(noise), 1e-9)
        images.append((f"noise_{i:02d}", "noise", (255 * noise).astype(np.uint8)))
    return images


def write_out_of_scope(ch: Chapter, params: dict[str, Any]) -> pd.DataFrame:
    """Write the non-plant images as PNGs under ``abstention/out_of_scope/`` (registered); their rows."""
    from PIL import Image

    rows = []
    for name, kind, array in out_of_scope_images(int(params["noise_images"]), int(params["seed"]),
                                                 int(params["out_of_scope_px"])):
        rel_path = f"{FOLDER}/out_of_scope/{name}.png"
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        atomic_write_bytes(ch.path(rel_path), buffer.getvalue())
        ch.record_output(rel_path)
        rows.append({"row_id": row_id(rel_path), "rel_path": rel_path, "label": -1, "source": kind})
    return pd.DataFrame(rows)


def other_crop_rows(ctx: RunContext, class_map: dict[str, Any], params: dict[str, Any]
                    ) -> tuple[pd.DataFrame, Path | None, str | None]:
    """A deterministic sample of another crop's leaves (rows, folder), or (empty, None, why not)."""
    folder = params.get("other_crop_data")
    if not folder:
        return _no_rows(), None, "no other-crop folder was given (profile abstention.other_crop_data)"
    crops = sorted({str(c.get("crop") or "") for c in class_map["classes"]})
    if len(crops) != 1:
        return _no_rows(), None, (f"the corpus holds {len(crops)} crops; leaves of another crop are "
                                  "out of scope only for a one-crop corpus")
    path = Path(folder).expanduser()
    root = path if path.is_absolute() else Path(__file__).resolve().parents[1] / path
    root = root.resolve()
    if not root.is_dir():
        return _no_rows(), None, f"the other-crop folder {folder} does not exist here"
    if not ctx.is_synthetic and root == Path(ctx.data).resolve():
        return _no_rows(), None, f"the other-crop folder {folder} is this run's own corpus"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    own = crops[0].lower()
    # a folder named after this corpus's crop is not another crop (PlantVillage: Crop___Condition)
    files = [f for f in files if own not in Path(f).parent.name.lower()]
    if not files:
        return _no_rows(), None, f"the other-crop folder {folder} holds no image of another crop"
    chosen = sorted(files, key=lambda f: sha256_bytes(f.encode()))[:int(params["other_crop_images"])]
    rows = pd.DataFrame({"row_id": [row_id(f) for f in chosen], "rel_path": chosen, "label": -1,
                         "source": "other_crop"})
    return rows, root, None


def _no_rows() -> pd.DataFrame:
    return pd.DataFrame({"row_id": pd.Series(dtype=str), "rel_path": pd.Series(dtype=str),
                         "label": pd.Series(dtype=np.int64), "source": pd.Series(dtype=str)})


# --------------------------------------------------------------------------- records
VAL_RECORDS = {"reference": "training/reference/predictions_val.parquet",
               "compact": "training/compact/predictions_val.parquet"}
PTE_VAL = f"{FOLDER}/predictions_val_pte.parquet"
TEST_RECORDS = {s.name: s.path for s in STATES}


def abstention_params(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """The profile's ``abstention`` section over the defaults, checked."""
    params = {**DEFAULTS, **ctx.section("abstention"), **options}
    if params["score"] not in SCORES:
        raise ValueError(f"abstention.score = {params['score']!r}; choose one of {', '.join(SCORES)}")
    if not 0.0 < float(params["target_risk"]) < 1.0:
        raise ValueError(f"abstention.target_risk = {params['target_risk']}; a share in (0, 1)")
    if not all(0.0 < float(level) < 1.0 for level in params["conformal_levels"]):
        raise ValueError(f"abstention.conformal_levels = {params['conformal_levels']}; shares in (0, 1)")
    return params


def aligned(frame: pd.DataFrame, rows: pd.DataFrame, n_classes: int, path: str) -> tuple[np.ndarray, str]:
    """The record's logits in ``rows`` order (row_id), after checking rows, labels and class count."""
    if frame["row_id"].duplicated().any():
        raise AbstentionInputError(f"{path} lists a row_id twice")
    if frame["model_state"].nunique() > 1:
        raise AbstentionInputError(f"{path} mixes {frame['model_state'].nunique()} model states")
    indexed = frame.set_index("row_id")
    missing = set(rows["row_id"]) - set(indexed.index)
    extra = set(indexed.index) - set(rows["row_id"])
    if missing or extra:
        raise AbstentionInputError(f"{path} does not cover the frozen split's rows: {len(missing)} missing, "
                                   f"{len(extra)} not in that split; rerun the chapter that wrote it")
    indexed = indexed.loc[rows["row_id"]]
    if not np.array_equal(indexed["label"].to_numpy(), rows["label"].to_numpy()):
        raise AbstentionInputError(f"{path} disagrees with split/split.parquet on labels (another class "
                                   "order); rerun the chapter that wrote it")
    logits = logits_matrix(indexed.reset_index())
    if len(logits) and logits.shape[1] != n_classes:
        raise AbstentionInputError(f"{path} has {logits.shape[1]} logits per row, the class map {n_classes}")
    return logits, str(indexed["model_state"].iloc[0]) if len(indexed) else ""


def int8_val_path(ch: Chapter) -> str:
    return f"ptq/predictions_val_{ch.read_json('ptq/ptq.json')['selected']}.parquet"


def field_inputs(ch: Chapter, n_classes: int) -> dict[str, Any] | None:
    """Chapter 10's cohort and per-state field predictions, or None when the run has no field cohort
    (no chapter 10, or a chapter 10 that recorded ``status: no_field_cohort``, or an empty cohort)."""
    registry = read_registry(ch.run_dir)
    if FIELD_RECORD not in registry:
        return None
    record = ch.read_json(FIELD_RECORD)
    scored = [f"field/predictions_{state}.parquet" for state in STATE_NAMES]
    if record.get("status") != "measured" or not all(path in registry for path in scored):
        return None
    cohort = ch.read_parquet("field/cohort.parquet").sort_values("row_id").reset_index(drop=True)
    logits = {}
    for state in STATE_NAMES:
        path = f"field/predictions_{state}.parquet"
        logits[state] = aligned(ch.read_parquet(path), cohort, n_classes, path)[0]
    return {"cohort": cohort, "logits": logits}


# --------------------------------------------------------------------------- one state
def calibration_block(logits: np.ndarray, y: np.ndarray, temperature: float, params: dict[str, Any],
                      indices: np.ndarray) -> tuple[dict[str, Any], pd.DataFrame]:
    """NLL, Brier and ECE (bootstrap interval over ``indices``) before (T = 1) and after scaling."""
    out, bins = {}, []
    level, n_bins = float(params["ci_level"]), int(params["ece_bins"])
    for stage, t in (("before", 1.0), ("after", temperature)):
        prob = probabilities(logits, t)
        confidence, correct = prob.max(axis=1), prob.argmax(axis=1) == y
        resampled = np.array([expected_calibration_error(confidence[i], correct[i], n_bins) for i in indices])
        low, high = metrics.interval(resampled, level)
        out[stage] = {"temperature": t, "nll": nll(logits, y, t), "brier": brier(prob, y),
                      "ece": expected_calibration_error(confidence, correct, n_bins), "ece_ci": [low, high],
                      "accuracy": float(correct.mean())}
        bins.append(reliability_bins(confidence, correct, n_bins).assign(stage=stage))
    return out, pd.concat(bins, ignore_index=True)


def selective_block(val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                    temperature: float, params: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """AURC on test and the validation-chosen threshold applied once to test, for every score."""
    level, target = float(params["ci_level"]), float(params["target_risk"])
    val_scores = confidence_scores(val[0], temperature)
    test_scores = confidence_scores(test[0], temperature)
    val_ok, test_ok = val[0].argmax(axis=1) == val[1], test[0].argmax(axis=1) == test[1]
    out, curves = {}, []
    for name in SCORES:
        chosen = choose_threshold(val_scores[name], val_ok, target)
        coverage, risk = risk_coverage(test_scores[name], test_ok)
        keep = np.unique(np.linspace(0, len(coverage) - 1, int(params["curve_points"])).astype(int))
        curves.append(pd.DataFrame({"score": name, "coverage": coverage[keep], "risk": risk[keep]}))
        out[name] = {"aurc": aurc(test_scores[name], test_ok), "choice": chosen,
                     "test": apply_threshold(test_scores[name], test_ok, chosen["threshold"], level)}
    return out, pd.concat(curves, ignore_index=True)


def conformal_block(val_prob: np.ndarray, val_y: np.ndarray, prob: np.ndarray, y: np.ndarray,
                    params: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """Marginal and class-conditional split conformal sets at each nominal level: summary, per class."""
    out, per_class = {}, []
    for level in params["conformal_levels"]:
        key = f"{round(100 * float(level))}"
        out[key] = {}
        for method, conditional in (("marginal", False), ("class_conditional", True)):
            sets = conformal_sets(val_prob, val_y, prob, float(level), int(params["seed"]), conditional)
            out[key][method] = {"nominal": float(level), **set_summary(sets, y, float(params["ci_level"]))}
            per_class.append(per_class_coverage(sets, y, prob.shape[1]).assign(level=float(level),
                                                                                method=method))
    return out, pd.concat(per_class, ignore_index=True)


def field_block(field_logits: np.ndarray, cohort: pd.DataFrame, temperature: float, threshold: float,
                val_prob: np.ndarray, val_y: np.ndarray, params: dict[str, Any]) -> dict[str, Any]:
    """Share abstained, accuracy on accepted vs all field images, conformal coverage on the cohort."""
    level, n_classes = float(params["ci_level"]), val_prob.shape[1]
    y = cohort["label"].to_numpy().astype(np.int64)
    labelled = (y >= 0) & (y < n_classes)
    score = confidence_scores(field_logits, temperature)[params["score"]]
    accepted = score >= threshold
    prob = probabilities(field_logits, temperature)
    correct = prob.argmax(axis=1) == np.where(labelled, y, -1)
    conformal = {}
    for nominal in params["conformal_levels"]:
        sets = conformal_sets(val_prob, val_y, prob[labelled], float(nominal), int(params["seed"]))
        conformal[f"{round(100 * float(nominal))}"] = {"nominal": float(nominal),
                                                       **set_summary(sets, y[labelled], level)}
    out = {"n": int(len(y)), "labelled": int(labelled.sum()),
           **_field_shares(accepted, correct, labelled, level), "conformal": conformal}
    # a source label mapped to a lab class by symptom (frogeye leaf spot -> black rot) is reported apart
    sources = cohort["source_label"].astype(str).to_numpy() if "source_label" in cohort else None
    out["by_source_label"] = {} if sources is None else {
        source: {"n": int((sources == source).sum()),
                 **_field_shares(accepted[sources == source], correct[sources == source],
                                 labelled[sources == source], level)}
        for source in sorted(set(sources))}
    return out


def _field_shares(accepted: np.ndarray, correct: np.ndarray, labelled: np.ndarray,
                  level: float) -> dict[str, Any]:
    return {"abstained_share": proportion(int((~accepted).sum()), len(accepted), level, "field images"),
            "accuracy_accepted": proportion(int((correct & accepted & labelled).sum()),
                                            int((accepted & labelled).sum()), level,
                                            "accepted labelled field images"),
            "accuracy_all": proportion(int((correct & labelled).sum()), int(labelled.sum()), level,
                                       "labelled field images")}


def rejection_block(frame: pd.DataFrame, temperature: float, threshold: float, score: str,
                    level: float) -> dict[str, Any]:
    """Rejection rate at the threshold over all out-of-scope rows and per source."""
    scores = confidence_scores(logits_matrix(frame), temperature)[score] if len(frame) else np.zeros(0)
    rejected = scores < threshold
    by_source = {source: proportion(int(rejected[(frame["source"] == source).to_numpy()].sum()),
                                    int((frame["source"] == source).sum()), level, f"{source} images")
                 for source in sorted(frame["source"].unique())}
    return {"n": int(len(frame)), "rejection_rate": proportion(int(rejected.sum()), len(frame), level,
                                                               "out-of-scope images"),
            "by_source": by_source, "scores": scores}


# --------------------------------------------------------------------------- chapter
def run_chapter(ctx: RunContext, **options: Any) -> dict[str, Any]:
    """Chapter 11 for every model state; writes ``abstention/`` and returns the chapter record."""
    from . import abstention_figures as figures
    from .split import load_frozen
    from .state_models import load_states, score_rows

    params = abstention_params(ctx, **options)
    level = float(params["ci_level"])
    ch = Chapter(ctx.run_dir, "abstention")
    frozen = load_frozen(ch)
    n_classes = len(frozen.class_names)
    val_rows = frozen.rows_for("val").sort_values("row_id").reset_index(drop=True)
    test_rows = frozen.rows_for("test").sort_values("row_id").reset_index(drop=True)
    missing = [p for p in (*VAL_RECORDS.values(), "ptq/ptq.json", *TEST_RECORDS.values())
               if not ch.path(p).exists()]
    if missing:
        raise AbstentionInputError(f"chapter 'abstention' needs the records of chapters 5-7; missing from "
                                   f"{ch.run_dir}: {', '.join(missing)}. Run the chain through 07_runtime.")

    # the .pte has no validation record: score the validation rows here (validation is not the test)
    with ch.native_output():  # ExecuTorch's C++ log lines go to abstention/native.log, not the book
        loaded = load_states(ch, n_classes)
    batch = int(params["batch_size"])
    pte_val = score_rows({"pte": loaded["pte"]}, val_rows, ctx.corpus_root, ctx.section("image"), batch)
    ch.write_parquet(PTE_VAL, pte_val["pte"])
    val_paths = {**VAL_RECORDS, "int8": int8_val_path(ch), "pte": PTE_VAL}
    val_y, test_y = val_rows["label"].to_numpy(), test_rows["label"].to_numpy()
    val = {s: aligned(ch.read_parquet(val_paths[s]), val_rows, n_classes, val_paths[s]) for s in STATE_NAMES}
    test = {s: aligned(ch.read_parquet(TEST_RECORDS[s]), test_rows, n_classes, TEST_RECORDS[s])
            for s in STATE_NAMES}
    for state in STATE_NAMES:
        if val[state][1] != test[state][1]:
            raise AbstentionInputError(f"state {state}: the validation record ({val_paths[state]}) and the "
                                       f"test record ({TEST_RECORDS[state]}) come from different model files")

    out_of_scope, other_crop_note = out_of_scope_records(ctx, ch, frozen.class_map, loaded, params)
    field = field_inputs(ch, n_classes)
    indices = metrics.bootstrap_indices(len(test_y), int(params["bootstrap"]), int(params["seed"]))
    states, tables = {}, {k: [] for k in ("calibration", "reliability", "risk_coverage", "conformal_classes")}
    oos_scores, lab_scores = [], {}
    for state in STATE_NAMES:
        t = fit_temperature(val[state][0], val_y)
        calibration, bins = calibration_block(test[state][0], test_y, t, params, indices)
        selective, curves = selective_block((val[state][0], val_y), (test[state][0], test_y), t, params)
        val_prob, test_prob = probabilities(val[state][0], t), probabilities(test[state][0], t)
        conformal, per_class = conformal_block(val_prob, val_y, test_prob, test_y, params)
        threshold = selective[params["score"]]["choice"]["threshold"]
        lab_scores[state] = confidence_scores(test[state][0], t)[params["score"]]
        rejection = rejection_block(out_of_scope[state], t, threshold, params["score"], level)
        oos_scores.append(out_of_scope[state][["row_id", "rel_path", "source"]].assign(
            state=state, score=rejection.pop("scores"), threshold=threshold))
        states[state] = {
            "label": STATE_LABELS[state], "model_state": test[state][1], "temperature": t,
            "val_nll": {"before": nll(val[state][0], val_y), "after": nll(val[state][0], val_y, t)},
            "calibration": calibration, "selective": selective, "conformal": conformal,
            "field": (field_block(field["logits"][state], field["cohort"], t, threshold, val_prob, val_y,
                                  params) if field else None),
            "out_of_scope": rejection}
        tables["calibration"] += [{"state": state, "stage": stage, "ece_lo": c["ece_ci"][0],
                                   "ece_hi": c["ece_ci"][1], **{k: v for k, v in c.items() if k != "ece_ci"}}
                                  for stage, c in calibration.items()]
        tables["reliability"].append(bins.assign(state=state))
        tables["risk_coverage"].append(curves.assign(state=state))
        tables["conformal_classes"].append(per_class.assign(state=state))

    classes = pd.DataFrame({"label": range(n_classes), "class_name": frozen.class_names})
    frames = {"calibration": pd.DataFrame(tables["calibration"]),
              "reliability": pd.concat(tables["reliability"], ignore_index=True),
              "risk_coverage": pd.concat(tables["risk_coverage"], ignore_index=True),
              "conformal_classes": pd.concat(tables["conformal_classes"], ignore_index=True).merge(
                  classes, on="label").assign(small=lambda f: f["rows"] < int(params["min_class_support"])),
              "out_of_scope_scores": pd.concat(oos_scores, ignore_index=True)}
    for name, frame in frames.items():
        ch.write_parquet(f"{FOLDER}/{name}.parquet", frame)
    plots = figures.save_all(ch, frames, states, params, lab_scores)
    recipe = deployment(states["pte"], params)
    others = _other_regimes(ctx, ch, params, val_rows, test_rows, n_classes, indices, field)
    record = ch.finish(
        figures={"n_val": len(val_y), "n_test": len(test_y), "n_classes": n_classes,
                 "temperature_fit": "scipy.optimize.minimize_scalar (bounded) on the validation NLL",
                 "conformal_library": "crepes (split conformal, hinge non-conformity)",
                 "field_given": field is not None,
                 "field_note": None if field else "No field cohort was given to this run",
                 "out_of_scope_sources": out_of_scope["pte"]["source"].value_counts().sort_index().to_dict(),
                 "other_crop_note": other_crop_note,
                 "states": states},
        plots=plots, params=params, deployment=recipe,
        regime=regimes.shipped(regimes.of_run(ctx)).name, regimes=others,
        test_rows_read={"count": len(test_y), "via": "prediction records of chapters 5-7 (logits)",
                        "purpose": "calibration, selective risk and conformal coverage of every state"})
    if CARD in read_registry(ctx.run_dir):
        # The model card of chapter 10 gains the deployment recipe: rendered again from the run's JSON,
        # now with abstention/abstention.json in it (the registry names this chapter as its writer).
        card.write_card(ctx.run_dir, chapter="abstention")
    return record


def _other_regimes(ctx: RunContext, ch: Chapter, params: dict[str, Any], val_rows: pd.DataFrame,
                   test_rows: pd.DataFrame, n_classes: int, indices: np.ndarray,
                   field: dict[str, Any] | None) -> dict[str, Any]:
    """The regimes that do not ship, measured the same way (:mod:`.abstention_regimes`)."""
    from .abstention_regimes import regime_states

    cohort = None if field is None else field["cohort"]
    return {r.name: {"states": regime_states(ctx, ch, r, params, val_rows, test_rows, n_classes, indices,
                                             cohort)}
            for r in regimes.of_run(ctx) if not r.shipped}


def out_of_scope_records(ctx: RunContext, ch: Chapter, class_map: dict[str, Any], loaded: dict[str, Any],
                         params: dict[str, Any]) -> tuple[dict[str, pd.DataFrame], str | None]:
    """Each state's prediction records (with ``source``) of every out-of-scope image, and why no
    other-crop images were scored (None when they were)."""
    from .state_models import score_rows

    parts = [(write_out_of_scope(ch, params), ch.run_dir)]
    other, root, note = other_crop_rows(ctx, class_map, params)
    if root is not None:
        parts.append((other, root))
    frames = []
    for rows, corpus_root in parts:
        records = score_rows(loaded, rows, corpus_root, ctx.section("image"), int(params["batch_size"]))
        for state, record in records.items():
            frames.append(record.assign(state=state, source=rows["source"].to_numpy(),
                                        rel_path=rows["rel_path"].to_numpy()))
    frame = pd.concat(frames, ignore_index=True)
    ch.write_parquet(f"{FOLDER}/predictions_out_of_scope.parquet", frame)
    return {state: frame[frame["state"] == state].reset_index(drop=True) for state in STATE_NAMES}, note


def _share(name: str, share: dict[str, Any]) -> dict[str, Any]:
    out = {name: share["value"], f"{name}_ci": share["ci"]}
    return {**out, "reasons": {name: share["reason"]}} if share["value"] is None else out


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        reasons = {**merged.pop("reasons", {}), **part.get("reasons", {})}
        merged.update({k: v for k, v in part.items() if k != "reasons"})
        if reasons:
            merged["reasons"] = reasons
    return merged


def deployment(pte: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The recipe the .pte ships with, and what it did on lab test, field and out-of-scope inputs.

    Every number is computed from the .pte's own outputs.  A statistic without rows is null, and the
    block carrying it gains ``reasons`` (statistic → why).
    """
    selective = pte["selective"][params["score"]]
    test = selective["test"]
    field = pte["field"]
    oos = pte["out_of_scope"]
    return {
        "state": "pte", "model_state": pte["model_state"], "temperature": float(pte["temperature"]),
        "score": params["score"], "threshold": float(selective["choice"]["threshold"]),
        "target_risk": float(params["target_risk"]),
        "lab_test": _merge({"n": test["n"]}, _share("coverage", test["coverage"]),
                           _share("selective_risk", test["selective_risk"])),
        "field": None if field is None else _merge(
            {"n": field["n"]}, *(_share(k, field[k]) for k in ("abstained_share", "accuracy_accepted",
                                                               "accuracy_all"))),
        "out_of_scope": _merge({"n": oos["n"]}, _share("rejection_rate", oos["rejection_rate"])),
    }


# --------------------------------------------------------------------------- tables and prose
def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f} %"


def _pct_ci(share: dict[str, Any]) -> str:
    if share["value"] is None:
        return f"n/a ({share['reason']})"
    return f"{_pct(share['value'])} [{_pct(share['ci'][0])}, {_pct(share['ci'][1])}]"


def summary_table(record: dict[str, Any]) -> pd.DataFrame:
    """One row per state: temperature, ECE, AURC and what the threshold did (lab, field, out of scope)."""
    score = record["params"]["score"]
    rows = []
    for s in record["figures"]["states"].values():
        chosen = s["selective"][score]
        conformal = s["conformal"]
        row = {"state": s["label"], "temperature": s["temperature"],
               "ece_before": s["calibration"]["before"]["ece"], "ece_after": s["calibration"]["after"]["ece"],
               "nll_before": s["calibration"]["before"]["nll"], "nll_after": s["calibration"]["after"]["nll"],
               **{f"aurc_{name}": s["selective"][name]["aurc"] for name in SCORES},
               "threshold": chosen["choice"]["threshold"], "coverage": chosen["test"]["coverage"]["value"],
               "selective_risk": chosen["test"]["selective_risk"]["value"],
               **{f"conformal_{k}": v["marginal"]["coverage"]["value"] for k, v in conformal.items()},
               "out_of_scope_rejected": s["out_of_scope"]["rejection_rate"]["value"]}
        if s["field"]:
            row.update({"field_abstained": s["field"]["abstained_share"]["value"],
                        "field_accuracy_accepted": s["field"]["accuracy_accepted"]["value"],
                        "field_accuracy_all": s["field"]["accuracy_all"]["value"]})
        rows.append(row)
    return pd.DataFrame(rows)


def closing_note(record: dict[str, Any]) -> str:
    """Markdown: per state, every headline number of the chapter, read from ``abstention.json``."""
    f, p = record["figures"], record["params"]
    score, level = p["score"], round(100 * float(p["ci_level"]))
    lines = [f"Temperatures were fitted on the {f['n_val']} validation rows; everything below is measured "
             f"on the {f['n_test']} locked test rows (recorded predictions) unless it says field or "
             f"out-of-scope. The threshold on the **{SCORE_LABELS[score]}** was chosen on validation for "
             f"a target risk of {_pct(float(p['target_risk']))}; intervals are {level} % (Wilson for shares, "
             "bootstrap for ECE).", ""]
    for s in f["states"].values():
        cal, chosen = s["calibration"], s["selective"][score]
        conformal = ", ".join(f"{k} % → {_pct(v['marginal']['coverage']['value'])} (mean set size "
                              f"{v['marginal']['mean_set_size']:.2f})" for k, v in s["conformal"].items())
        text = (f"- **{s['label']}** (T = {s['temperature']:.2f}): ECE {_pct(cal['before']['ece'])} → "
                f"{_pct(cal['after']['ece'])} [{_pct(cal['after']['ece_ci'][0])}, "
                f"{_pct(cal['after']['ece_ci'][1])}]; at the threshold, lab coverage "
                f"{_pct_ci(chosen['test']['coverage'])} with selective risk "
                f"{_pct_ci(chosen['test']['selective_risk'])}")
        if not chosen["choice"]["target_met_on_val"]:
            text += f" ({chosen['choice']['reason']})"
        text += f"; conformal coverage (lab, nominal → observed) {conformal}"
        if s["field"]:
            fc = ", ".join(f"{k} % → {_pct(v['coverage']['value'])}"
                           for k, v in s["field"]["conformal"].items())
            text += (f"; field: abstains on {_pct_ci(s['field']['abstained_share'])}, accuracy on the rest "
                     f"{_pct_ci(s['field']['accuracy_accepted'])} vs {_pct_ci(s['field']['accuracy_all'])} "
                     f"on all, conformal coverage {fc}")
        text += f"; out-of-scope images rejected: {_pct_ci(s['out_of_scope']['rejection_rate'])}."
        lines.append(text)
    lines.append("")
    lines.append(f["field_note"] + "." if f["field_note"] else
                 "The field cohort is chapter 10's; its labels map field conditions to lab classes.")
    if f["other_crop_note"]:
        lines.append(f"No leaves of another crop were scored: {f['other_crop_note']}.")
    return "\n".join(lines)
