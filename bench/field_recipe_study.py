"""Field-adapted recipe study: the shipped regime's models retrained with changed hyper-parameters on a copy
of a finished run, each scored on field val — the evidence behind the ``field`` profile's comments.

    .venv/bin/python bench/field_recipe_study.py RUN_DIR VARIANT [VARIANT ...] [--out runs/study]
                                                  [--montage hard_core.png]

A VARIANT is comma-separated ``key=value`` pairs on the shipped regime's training settings: ``c.`` the
compact model (only it retrains, distilled from the run's reference), ``r.`` the reference (it and the
compact retrain), ``i.`` the run's ``image`` section; dotted keys reach nested settings.  Examples:
``c.epochs=10``, ``r.arch=tf_efficientnet_lite2``, ``i.size=192,c.distill.enabled=false``.

Each variant is a copy of RUN_DIR's chapters 1-5 (``--out``/<name>) with the changed parameters and a new
fingerprint, trained by ``python -m cropcop_utils.training``, so the split, the audit's groups and every
other setting are the run's own.  Printed per model (the run's own reference and compact first, then each
variant's retrained ones): accuracy and macro-F1 on field val and lab val with 95 % Wilson intervals, and
the training wall time.  Then the *hard core*: the field val photos every scored model gets wrong, by
class — errors no recipe in the study moved, which is where a recipe change stops helping.

Only validation rows are read (field val: the field-train photos the split put in val); the scored
cohort and the locked lab test are never opened, so a recipe chosen here is still scored fresh by the
book.  Not a test: each variant trains for minutes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from scipy.stats import binomtest
from sklearn.metrics import f1_score

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cropcop_utils.core import checkpoint  # noqa: E402
from cropcop_utils.core.config import reopen_run  # noqa: E402
from cropcop_utils.core.evidence import Chapter, sha256_json  # noqa: E402
from cropcop_utils.nets import models, predict  # noqa: E402
from cropcop_utils.split import load_frozen  # noqa: E402
from cropcop_utils.training import regimes  # noqa: E402

COPIED = ("params.yaml", "registry.json", "chain.json", "corpus", "audit", "split", "probes", "training")
SECTIONS = {"c": "compact", "r": "reference"}


def apply_variant(params: dict, variant: str, regime: str) -> list[str]:
    """Set the variant's values in ``params`` (in place); returns the models it retrains."""
    retrain, scopes = {"compact"}, set()
    settings = params["training"].setdefault(regime, {}) if regime != "baseline" else params["training"]
    for pair in variant.split(","):
        key, _, value = pair.partition("=")
        scope, _, path = key.partition(".")
        if not value or not path or scope not in (*SECTIONS, "i"):
            raise SystemExit(f"variant {variant!r}: expected c.|r.|i.<key>=<value>, got {pair!r}")
        section = params["image"] if scope == "i" else settings.setdefault(SECTIONS[scope], {})
        *parents, last = path.split(".")
        for part in parents:
            section = section.setdefault(part, {})
        section[last] = yaml.safe_load(value)
        scopes.add(scope)
    if "r" in scopes or ("i" in scopes and distils(params, settings)):
        retrain.add("reference")  # a teacher must see the pixels its student sees
    return [m for m in ("reference", "compact") if m in retrain]


def distils(params: dict, settings: dict) -> bool:
    """Whether the regime's compact model learns from the reference (its own setting over the shared one)."""
    shared = (params["training"].get("compact") or {}).get("distill") or {}
    own = (settings.get("compact") or {}).get("distill") or {}
    return bool({**shared, **own}.get("enabled", False))


def prepare(run_dir: Path, out: Path, variant: str) -> tuple[Path, list[str]]:
    """A copy of the run's chapters 1-5 with the variant's parameters and without the models it retrains."""
    target = out / re.sub(r"[^A-Za-z0-9]+", "_", variant).strip("_")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in COPIED:
        source = run_dir / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        elif source.exists():
            shutil.copy2(source, target / name)
    record = yaml.safe_load((target / "params.yaml").read_text())
    regime = regimes.shipped(regimes.regimes(record["params"]["training"])).name
    retrain = apply_variant(record["params"], variant, regime)
    record["fingerprint"] = sha256_json(record["params"])
    (target / "params.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    for name in retrain:
        shutil.rmtree(target / "training" / name, ignore_errors=True)
    return target, retrain


def train(run: Path, model: str) -> float:
    start = time.monotonic()
    log = run.parent / f"{run.name}-{model}.log"
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "cropcop_utils.training", "--run-dir", str(run),
                               "--model", model, "--no-progress"], cwd=REPO, stdout=handle,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"training {model} in {run} failed: see {log}")
    return time.monotonic() - start


def score(run: Path, model: str, label: str) -> pd.DataFrame:
    """The model's predictions on the run's validation rows (lab val and field val)."""
    ctx = reopen_run(run)
    frozen = load_frozen(Chapter(ctx.run_dir, "training"))
    val = frozen.rows_for("val", field_train=True)
    # not nets.states.load_float: it verifies the file against the run's registry, and a study's retrained
    # checkpoints are deliberately left unregistered (no chapter of the copy ran)
    state = checkpoint.load(run / "training" / model / "best.pt")
    net = models.create_model(state["arch"], len(frozen.class_names))
    net.load_state_dict(state["model"])
    net.eval()
    config = predict.PredictConfig.from_ctx(ctx, batch_size=64, progress=False)
    record = predict.predict(net, val, config, label, desc=label)
    return record[["row_id", "label", "pred"]].merge(val[["row_id", "source", "rel_path"]], on="row_id") \
        .assign(model=label)


def summary_line(label: str, rows: pd.DataFrame, seconds: float | None) -> str:
    parts = [f"{label:<44}"]
    for source in ("field_train", "lab"):
        part = rows[rows["source"] == source]
        right = int((part["label"] == part["pred"]).sum())
        ci = binomtest(right, len(part)).proportion_ci(confidence_level=0.95, method="wilson")
        lo, hi = ci.low, ci.high
        f1 = f1_score(part["label"], part["pred"], average="macro")
        name = "field val" if source == "field_train" else "lab val"
        parts.append(f"{name} acc {right / len(part):.3f} [{lo:.3f}, {hi:.3f}] mF1 {f1:.3f} (n={len(part)})")
    parts.append("" if seconds is None else f"trained in {seconds:.0f} s")
    return "  ".join(parts)


def hard_core(scored: pd.DataFrame, class_names: list[str]) -> pd.DataFrame:
    field = scored[scored["source"] == "field_train"]
    wrong = field.assign(wrong=field["label"] != field["pred"]).groupby("row_id")
    every = wrong["wrong"].all()
    rows = field.drop_duplicates("row_id").set_index("row_id").loc[every[every].index]
    n_models = field["model"].nunique()
    counts = rows["label"].map(dict(enumerate(class_names))).value_counts()
    print(f"\nhard core: {len(rows)} of {field['row_id'].nunique()} field val photos wrong for all "
          f"{n_models} models: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for rel in rows["rel_path"]:
        print(f"  {rel}")  # the montage's order, left to right, row by row; the folder is the label
    return rows


def montage(rows: pd.DataFrame, root: Path, path: Path, side: int = 256) -> None:
    from PIL import Image

    tiles = [Image.open(root / rel).convert("RGB").resize((side, side)) for rel in rows["rel_path"]]
    per_row = 6
    canvas = Image.new("RGB", (side * per_row, side * max(1, -(-len(tiles) // per_row))), "white")
    for i, tile in enumerate(tiles):
        canvas.paste(tile, ((i % per_row) * side, (i // per_row) * side))
    canvas.save(path)
    print(f"montage of the hard core (the order of the list above): {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "field-recipe-study")
    parser.add_argument("--montage", type=Path, default=None)
    args = parser.parse_args()
    run_dir = args.run_dir.resolve()
    scored, lines = [], []
    for model in ("reference", "compact"):
        rows = score(run_dir, model, f"{run_dir.name} {model} (as run)")
        scored.append(rows)
        lines.append(summary_line(rows["model"].iloc[0], rows, None))
        print(lines[-1], flush=True)
    for variant in args.variants:
        target, retrain = prepare(run_dir, args.out, variant)
        for model in retrain:
            seconds = train(target, model)
            rows = score(target, model, f"{variant} {model}")
            scored.append(rows)
            lines.append(summary_line(rows["model"].iloc[0], rows, seconds))
            print(lines[-1], flush=True)
    table = pd.concat(scored, ignore_index=True)
    ctx = reopen_run(run_dir)
    names = load_frozen(Chapter(ctx.run_dir, "training")).class_names
    core = hard_core(table, names)
    if args.montage is not None and len(core):
        montage(core, Path(ctx.field_train_root), args.montage)
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
