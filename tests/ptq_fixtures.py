"""A tiny registered run folder for the PTQ (chapter 6) and runtime (chapter 7) tests; chapter 6 run once.

The tiny run is built in the contract's schemas: a 3-class corpus of 32 px JPEGs, a frozen split that
``split.load_frozen`` accepts, a ``test_efficientnet`` trained for a few steps as the compact checkpoint with
its float prediction records.  ``ptq_run`` runs :func:`cropcop_utils.ptq.run_chapter` on it once per
session; ``tests/ptq/test_chapter.py`` and ``tests/runtime/test_chapter.py`` both import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from cropcop_utils import ptq as quant
from cropcop_utils.core import checkpoint, config, evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.core.squares import EvalImages
from cropcop_utils.corpus import taxonomy
from cropcop_utils.nets import predict
from cropcop_utils.ptq import chapter as ptq_chapter
from cropcop_utils.split import frozen as split
from cropcop_utils.split import locked_test

ARCH = "test_efficientnet"
SIZE = 32
CLASSES = ("apple_healthy", "apple_scab", "tomato_mites")
PER_SPLIT = {"train": 10, "val": 4, "test": 4}
OVERRIDES = {
    "image": {"size": SIZE},
    "training": {"regime": "baseline"},  # the tiny run holds one compact model, at the plain paths
    "ptq": {"candidates": [
        {"name": "dynamic_pc", "activations": "dynamic", "per_channel": True, "calibration_rows": 0},
        {"name": "static_pc_full", "activations": "static", "per_channel": True, "calibration_rows": 100},
        {"name": "static_pc_half", "activations": "static", "per_channel": True, "calibration_rows": 8}],
        # max_batch above 16: the lowering's batch >= 16 guard (runtime.lower) is exercised at the bound
        "batch_size": 8, "max_batch": 24, "bootstrap": 50},
    "runtime": {"batch_size": 8, "latency_warmup": 1, "latency_runs": 3},
}


# --------------------------------------------------------------------------- a tiny registered run
@dataclass
class TinyRun:
    ctx: config.RunContext
    rows: pd.DataFrame            # the frozen split
    compact_sha: str

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir


def _jpeg(path: Path, colour: np.ndarray, rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.clip(colour + rng.normal(0, 25, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=90)


TRAIN_STEPS = 60  # full-batch AdamW steps: enough for this colour-coded task to be learned, in seconds


def train_briefly(model: torch.nn.Module, rows: pd.DataFrame, corpus: Path, spec: ImageSpec) -> None:
    """A few full-batch AdamW steps on the training images (loading contract); leaves the model in eval."""
    images = torch.stack([image for image, _ in EvalImages(rows, corpus, spec)])
    labels = torch.as_tensor(rows["label"].to_numpy().copy(), dtype=torch.long)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimiser.step()
    # Batch-norm statistics after so few steps still lean on their initial values: set them to the
    # training set's own (cumulative average over one pass), so eval mode decides as training did.
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    with torch.no_grad():
        model(images)
    for norm in norms:
        norm.momentum = 0.1
    model.eval()


def build_tiny_run(base: Path, overrides: dict | None = None) -> TinyRun:
    """Corpus, audit and split artifacts in the contract's schemas plus the compact training outputs."""
    rng = np.random.default_rng(0)
    corpus = base / "corpus"
    records = []
    for index, name in enumerate(CLASSES):
        colour = np.array([60 + 70 * index, 180 - 50 * index, 90], dtype=float)
        for part, count in PER_SPLIT.items():
            for k in range(count):
                rel = f"{part}/{name}/{name}_{k}.jpg"
                _jpeg(corpus / rel, colour, rng)
                records.append({"rel_path": rel, "class_name": name, "split": part})
    frame = pd.DataFrame(records)
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    frame["group_id"] = np.arange(len(frame))
    ctx = config.open_run(base / "run", profile="smoke", data=str(corpus),
                          overrides=config.deep_merge(OVERRIDES, overrides or {}))
    run_dir = ctx.run_dir
    class_map = taxonomy.build_class_map(frame["class_name"].value_counts().to_dict())
    frame["label"] = frame["class_name"].map({c["name"]: c["index"] for c in class_map["classes"]})

    corpus_ch = Chapter(run_dir, "corpus")
    corpus_ch.write_parquet("corpus/manifest.parquet", frame[["row_id", "rel_path", "class_name"]].assign(
        inherited_split=frame["split"], admitted=True, quarantine_reason=None))
    corpus_ch.write_json("corpus/class_map.json", class_map)
    audit_ch = Chapter(run_dir, "audit")
    audit_ch.write_parquet("audit/groups.parquet", frame[["row_id", "group_id"]].assign(group_size=1))
    audit_ch.write_parquet("audit/relationships.parquet", pd.DataFrame(
        {"row_id_a": pd.Series(dtype=str), "row_id_b": pd.Series(dtype=str), "kind": pd.Series(dtype=str),
         "trusted": pd.Series(dtype=bool)}))
    split_ch = Chapter(run_dir, "split")
    split_ch.write_json("split/class_map.json", class_map)
    split_ch.write_parquet("split/split.parquet",
                           frame[["row_id", "rel_path", "class_name", "label", "group_id", "split"]])
    split_ch.write_parquet("split/quarantine.parquet", pd.DataFrame(
        {c: pd.Series(dtype=str) for c in ("row_id", "rel_path", "class_name", "group_id", "reason")}))
    fingerprints = {r: evidence.sha256_file(run_dir / r) for r in split.FROZEN_FILES}
    split_ch.finish(figures={}, fingerprints=fingerprints)

    # The compact model, trained for a few steps: the chain's mechanics are under test, not its accuracy,
    # but the .pte-vs-graph proof (test_runtime) needs logits with a real spread and real decisions.
    torch.manual_seed(0)
    from cropcop_utils.nets.models import create_model

    model = create_model(ARCH, len(CLASSES))
    spec = ImageSpec.from_section(ctx.section("image"))
    train_briefly(model, frame[frame["split"] == "train"], corpus, spec)
    train_ch = Chapter(run_dir, "training")
    sha = checkpoint.save(run_dir / quant.CHECKPOINT, {"model": model.state_dict(), "arch": ARCH,
                                                       "num_classes": len(CLASSES), "image_size": SIZE})
    assert train_ch.record_output(quant.CHECKPOINT) == sha
    cfg = predict.PredictConfig.from_ctx(ctx, batch_size=8)
    rows = frame.sort_values("row_id").reset_index(drop=True)
    train_ch.write_parquet(quant.FLOAT_VAL, predict.predict(model, rows[rows["split"] == "val"], cfg, sha))
    test_rows = locked_test.read_test_rows(run_dir, sha, reader="training/compact")
    train_ch.write_parquet(quant.FLOAT_TEST, predict.predict(model, test_rows, cfg, sha))
    train_ch.finish(figures={})
    return TinyRun(ctx=ctx, rows=rows, compact_sha=sha)


_BUILT: dict[str, tuple[TinyRun, dict, list[pd.DataFrame]]] = {}


@pytest.fixture(scope="session")
def ptq_run(tmp_path_factory) -> tuple[TinyRun, dict, list[pd.DataFrame]]:
    """The tiny run with chapter 6 executed once: (run, ptq record, every calibration batch's rows).

    ``test_runtime`` imports this fixture, which gives it a second definition; the module-level cache
    keeps the chapter from running twice in one session.
    """
    if "ptq" in _BUILT:
        return _BUILT["ptq"]
    run = build_tiny_run(tmp_path_factory.mktemp("ptq"))
    seen: list[pd.DataFrame] = []
    original = quant.image_batches

    def spy(rows, *args, **kwargs):  # every frame of rows that is turned into calibration images
        seen.append(rows.copy())
        return original(rows, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ptq_chapter, "image_batches", spy)
        record = quant.run_chapter(run.ctx)
    _BUILT["ptq"] = (run, record, seen)
    return _BUILT["ptq"]
