"""A small registered run folder for the analysis, registry and explorer tests.

Built directly in the contract's schemas (no upstream chapter runs): a real image-folder corpus of
tiny JPEGs, corpus/audit/split artifacts that ``split.load_frozen`` accepts, fake checkpoints, and four
prediction files with planted properties:

* compact == reference row for row (a known-zero delta);
* int8 flips a few rows of compact, spread over classes;
* pte adds errors in the fruit classes only (a known loss of the fruit slice).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.corpus import taxonomy
from cropcop_utils.split import frozen as split
from cropcop_utils.split import locked_test

# name -> (train rows, test rows); sorted-name order gives the class index
CLASSES: dict[str, tuple[int, int]] = {
    "apple_fruit_rot": (6, 24),        # fruit, specific
    "apple_fungal_disease": (12, 30),  # broad
    "apple_healthy": (30, 36),
    "apple_scab": (60, 30),
    "tomato_early_blight": (8, 28),
    "tomato_fruit_cracking": (20, 26),  # fruit, specific
    "tomato_healthy": (45, 32),
    "tomato_mites": (26, 8),           # broad pest, few test rows (unstable)
}
PROFILE = "smoke"
VAL_PER_CLASS = 2


@dataclass
class FixtureRun:
    ctx: config.RunContext
    corpus: Path
    class_map: dict
    test: pd.DataFrame            # row_id, rel_path, label (row_id order)
    preds: dict[str, np.ndarray]  # state -> predictions in ``test`` order
    profile: str = PROFILE        # what a notebook opening this run must name (a one-regime smoke YAML)

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir


def _image(path: Path, colour: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (20, 16), colour).save(path, "JPEG", quality=80)


def _probabilities(pred: np.ndarray, n_classes: int, rng: np.random.Generator) -> pd.DataFrame:
    logits = rng.normal(0, 1, (len(pred), n_classes))
    logits[np.arange(len(pred)), pred] += 4.0
    prob = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    order = np.argsort(-prob, axis=1)[:, :5]
    top = np.take_along_axis(prob, order, axis=1)
    return pd.DataFrame({"top5_idx": list(order.astype(int)), "top5_prob": list(top.astype(float)),
                         "margin": top[:, 0] - top[:, 1]})


def plant_predictions(y: np.ndarray, class_map: dict, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = len(y)
    n_classes = len(class_map["classes"])
    fruit = np.array([c["fruit"] for c in class_map["classes"]])
    reference = y.copy()
    wrong = rng.choice(n, size=n // 10, replace=False)
    reference[wrong] = (y[wrong] + 1 + rng.integers(0, n_classes - 1, len(wrong))) % n_classes
    compact = reference.copy()
    int8 = compact.copy()
    flips = rng.choice(n, size=6, replace=False)
    int8[flips] = (int8[flips] + 1) % n_classes
    pte = int8.copy()
    fruit_rows = np.flatnonzero(fruit[y] & (int8 == y))
    lost = rng.choice(fruit_rows, size=int(0.45 * len(fruit_rows)), replace=False)
    pte[lost] = (y[lost] + 3) % n_classes
    return {"reference": reference, "compact": compact, "int8": int8, "pte": pte}


ALL_STATES = ("reference", "compact", "int8", "pte")


def build_run(base: Path, name: str = "run", states: tuple[str, ...] = ALL_STATES,
              overrides: dict | None = None) -> FixtureRun:
    corpus = base / f"{name}_corpus"
    rows = []
    for index, (cls, (n_train, n_test)) in enumerate(sorted(CLASSES.items())):
        colour = (30 * index % 255, 200 - 20 * index, 90)
        for part, count in (("train", n_train), ("val", VAL_PER_CLASS), ("test", n_test)):
            for k in range(count):
                rel = f"{part}/{cls}/{cls}_{k}.jpg"
                if part == "test":
                    _image(corpus / rel, colour)
                rows.append({"rel_path": rel, "class_name": cls, "split": part})
    frame = pd.DataFrame(rows)
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    frame["group_id"] = np.arange(len(frame))

    # the states written below are one regime's (the smoke profile itself trains two)
    profile = base / f"{name}_one_regime.yaml"
    profile.write_text(f"extends: {PROFILE}\ntraining:\n  regime: baseline\n")
    ctx = config.open_run(base / name, profile=str(profile), data=str(corpus), overrides=overrides)
    run_dir = ctx.run_dir
    supports = frame["class_name"].value_counts().to_dict()
    class_map = taxonomy.build_class_map(supports)
    label_of = {c["name"]: c["index"] for c in class_map["classes"]}
    frame["label"] = frame["class_name"].map(label_of).astype("int64")

    corpus_ch = Chapter(run_dir, "corpus")
    manifest = frame[["row_id", "rel_path", "class_name"]].assign(
        inherited_split=frame["split"], bytes=100, sha256="0" * 64, format="JPEG", width=20, height=16,
        mode="RGB", exif_orientation=1, exif_make=None, exif_model=None, decode_status="ok", error=None,
        admitted=True, quarantine_reason=None)
    corpus_ch.write_parquet("corpus/manifest.parquet", manifest)
    corpus_ch.write_json("corpus/class_map.json", class_map)
    corpus_ch.finish(figures={"admitted": len(frame)})

    audit_ch = Chapter(run_dir, "audit")
    audit_ch.write_parquet("audit/groups.parquet", frame[["row_id", "group_id"]].assign(group_size=1))
    audit_ch.write_parquet("audit/relationships.parquet", pd.DataFrame(
        {"row_id_a": pd.Series(dtype=str), "row_id_b": pd.Series(dtype=str), "kind": pd.Series(dtype=str),
         "trusted": pd.Series(dtype=bool)}))
    audit_ch.finish(figures={"near_pairs": 0})

    split_ch = Chapter(run_dir, "split")
    split_ch.write_json("split/class_map.json", class_map)
    split_columns = ["row_id", "rel_path", "class_name", "label", "group_id", "split"]
    split_ch.write_parquet("split/split.parquet", frame[split_columns])
    split_ch.write_parquet("split/quarantine.parquet", pd.DataFrame(
        {c: pd.Series(dtype=str) for c in ("row_id", "rel_path", "class_name", "group_id", "reason")}))
    fingerprints = {rel: evidence.sha256_file(run_dir / rel) for rel in split.FROZEN_FILES}
    totals = frame["split"].value_counts().to_dict()
    split_ch.finish(figures={}, fingerprints=fingerprints, totals=totals, rows_split=len(frame),
                    crossings={"verdict": "zero crossings", "groups_across_splits": 0})

    test = frame[frame["split"] == "test"].sort_values("row_id")[["row_id", "rel_path", "label"]]
    test = test.reset_index(drop=True)
    preds = plant_predictions(test["label"].to_numpy(), class_map)
    write_predictions(run_dir, test, preds, class_map, states)
    return FixtureRun(ctx=ctx, corpus=corpus, class_map=class_map, test=test, preds=preds,
                      profile=str(profile))


STATE_FILES = {"reference": ("training", "training/reference"), "compact": ("training", "training/compact"),
               "int8": ("ptq", "ptq"), "pte": ("runtime", "runtime")}
MODEL_FILES = {"reference": "training/reference/best.pt", "compact": "training/compact/best.pt",
               "int8": "ptq/selected.pt2", "pte": "runtime/model.pte"}


def write_predictions(run_dir: Path, test: pd.DataFrame, preds: dict[str, np.ndarray], class_map: dict,
                      states: tuple[str, ...], log_access: bool = True) -> None:
    rng = np.random.default_rng(0)
    n_classes = len(class_map["classes"])
    chapters: dict[str, Chapter] = {}
    for state in states:
        chapter, folder = STATE_FILES[state]
        ch = chapters.setdefault(chapter, Chapter(run_dir, chapter))
        model = run_dir / MODEL_FILES[state]
        evidence.atomic_write_bytes(model, f"weights of {state}".encode())
        ch.record_output(MODEL_FILES[state])
        frame = pd.concat([test[["row_id", "label"]].reset_index(drop=True),
                           pd.DataFrame({"pred": preds[state]}),
                           _probabilities(preds[state], n_classes, rng)], axis=1)
        frame["model_state"] = evidence.sha256_file(model)
        if log_access:  # as the real chapters do: one logged read of the locked test per state
            locked_test.read_test_rows(run_dir, frame["model_state"].iloc[0], reader=folder)
        ch.write_parquet(f"{folder}/predictions_test.parquet", frame)
    for name, ch in chapters.items():
        ch.finish(figures={"states": len(ch.outputs)})
        assert name


@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[FixtureRun, dict, dict]:
    """The fixture run with chapters 8 and 9 executed once: (run, per_class record, fruit_slice record)."""
    from cropcop_utils import analysis

    run = build_run(tmp_path_factory.mktemp("analysed"))
    return run, analysis.run_per_class(run.ctx), analysis.run_fruit_slice(run.ctx)
