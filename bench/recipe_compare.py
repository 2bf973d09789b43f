"""Two runs of one split with different recipes, compared state by state on validation and on test, paired.

    .venv/bin/python bench/recipe_compare.py RUN_A RUN_B [--regime NAME] [--bootstrap 1000]

For each model state the runs recorded (the reference and compact float models of chapter 5, the selected
INT8 graph of chapter 6, the ``.pte`` of chapter 7), on the rows each split scores: both runs' macro-F1,
B - A with its paired percentile-bootstrap interval (``core.metrics.paired_bootstrap``: one resample-index
matrix for both) and the exact McNemar test on top-1 correctness; then each model's training seconds
(``history.parquet``: the optimiser epochs, validation passes left out).  It reads the prediction records
the chapters wrote, never a photo, so the test rows are not scored again.

Why: a recipe (freezing, epochs, resolution) is chosen on validation.  Where validation and test rank two
recipes differently the bench says so, because picking the recipe by the test figure would turn the test
rows into a second validation set.  The runs must share the split (``split/split.parquet``, by SHA-256) or
the rows are not paired, and the bench refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from cropcop_utils.core import metrics
from cropcop_utils.core.evidence import sha256_file

SPLIT = "split/split.parquet"


def state_files(run: Path, regime: str | None) -> dict[str, dict[str, Path]]:
    """Each state's prediction records by split, for the shipped regime (plain paths) or ``regime``."""
    deeper = (lambda chapter: run / chapter / regime) if regime else (lambda chapter: run / chapter)
    ptq = json.loads((deeper("ptq") / "ptq.json").read_text())
    files = {model: {split: deeper("training") / model / f"predictions_{split}.parquet"
                     for split in ("val", "test")} for model in ("reference", "compact")}
    files["int8"] = {"val": deeper("ptq") / f"predictions_val_{ptq['selected']}.parquet",
                     "test": deeper("ptq") / "predictions_test.parquet"}
    files["pte"] = {"test": deeper("runtime") / "predictions_test.parquet"}
    return {state: {split: path for split, path in by_split.items() if path.exists()}
            for state, by_split in files.items()}


def paired_rows(a: Path, b: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, A's predictions, B's predictions) on the rows both records hold, joined on ``row_id``."""
    left, right = (pd.read_parquet(p, columns=["row_id", "label", "pred"]) for p in (a, b))
    joined = left.merge(right, on="row_id", suffixes=("_a", "_b"), validate="one_to_one")
    if len(joined) != len(left) or len(joined) != len(right):
        raise SystemExit(f"{a.name}: the runs scored different rows ({len(left)} vs {len(right)}, "
                         f"{len(joined)} in common)")
    if not (joined["label_a"] == joined["label_b"]).all():
        raise SystemExit(f"{a.name}: the same rows carry different labels in the two runs")
    return joined["label_a"].to_numpy(), joined["pred_a"].to_numpy(), joined["pred_b"].to_numpy()


def compare_state(a: Path, b: Path, n_classes: int, n_boot: int) -> dict[str, float]:
    y, pred_a, pred_b = paired_rows(a, b)
    paired = metrics.paired_bootstrap(y, pred_a, pred_b, list(range(n_classes)), n_classes, n_boot=n_boot)
    row = paired.table.set_index("metric").loc["macro_f1"]
    test = metrics.mcnemar_exact(pred_a == y, pred_b == y)
    return {"rows": len(y), "a": row["value_a"], "b": row["value_b"], "delta": row["delta"],
            "lo": row["lo"], "hi": row["hi"], "errors_a": int((pred_a != y).sum()),
            "errors_b": int((pred_b != y).sum()), "mcnemar_p": test["p_value"]}


def training_seconds(run: Path, regime: str | None) -> dict[str, float]:
    base = run / "training" / regime if regime else run / "training"
    return {model: float(pd.read_parquet(base / model / "history.parquet")["epoch_seconds"].sum())
            for model in ("reference", "compact") if (base / model / "history.parquet").exists()}


def verdict(by_split: dict[str, dict[str, float]]) -> str:
    """What the two splits say of B against A, in words."""
    def side(split: str) -> int:
        r = by_split[split]
        return 1 if r["lo"] > 0 else -1 if r["hi"] < 0 else 0

    if "val" not in by_split:
        return "test only"
    val, test = side("val"), side("test")
    if val == test:
        return "agree" if val else "neither split tells them apart"
    if val * test < 0:
        return "DISAGREE: each split prefers another recipe"
    return "only test tells them apart: validation, which chooses, does not" if test else \
        "only validation tells them apart"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--regime", default=None, help="a regime other than the shipped one (its folder)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args()
    a, b = args.run_a.resolve(), args.run_b.resolve()
    if sha256_file(a / SPLIT) != sha256_file(b / SPLIT):
        raise SystemExit(f"{a.name} and {b.name} split the corpus differently ({SPLIT}): rows are not paired")
    classes = json.loads((a / "split/class_map.json").read_text())["classes"]
    files_a, files_b = state_files(a, args.regime), state_files(b, args.regime)
    print(f"A = {a.name}, B = {b.name}; macro-F1, B - A with its paired {args.bootstrap}-resample 95 % "
          "interval, exact McNemar p on top-1")
    print(f"{'state':10s} {'split':5s} {'rows':>5s} {'A':>7s} {'B':>7s} {'B - A':>8s} {'interval':>19s} "
          f"{'errors':>9s} {'McNemar':>8s}")
    for state in files_a:
        by_split = {}
        for split in files_a[state]:
            if split not in files_b.get(state, {}):
                continue
            r = by_split[split] = compare_state(files_a[state][split], files_b[state][split], len(classes),
                                                args.bootstrap)
            print(f"{state:10s} {split:5s} {r['rows']:5d} {r['a']:7.4f} {r['b']:7.4f} {r['delta']:+8.4f} "
                  f"[{r['lo']:+.4f}, {r['hi']:+.4f}] {r['errors_a']:4d}/{r['errors_b']:<4d} "
                  f"{r['mcnemar_p']:8.3f}")
        if by_split:
            print(f"{'':10s} validation and test: {verdict(by_split)}")
    seconds_a, seconds_b = training_seconds(a, args.regime), training_seconds(b, args.regime)
    for model in seconds_a:
        if model in seconds_b:
            print(f"training {model}: {seconds_a[model]:.0f} s (A) vs {seconds_b[model]:.0f} s (B), "
                  f"ratio {seconds_b[model] / seconds_a[model]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
