"""A tiny registered run folder for the training tests, built directly in the contract's schemas.

No upstream chapter runs: a real image-folder corpus of small PNG / JPEG files whose class is visible
(colour and stripe direction), and corpus / audit / split artifacts that ``split.load_frozen`` accepts.
The training section is shrunk to tiny timm models at 32 px on one thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from cropcop_utils import split
from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.corpus import taxonomy

CLASSES = ("apple_healthy", "apple_scab", "tomato_late_blight")
COUNTS = {"train": 10, "val": 4, "test": 4}  # per class
COLOURS = ((60, 160, 60), (150, 120, 40), (90, 60, 140))

TINY_TRAINING = {
    "threads": 1, "workers": 0, "checkpoint_every": 2, "eval_batch_size": 16, "cache_images": True,
    "ema": {"enabled": True, "decay": 0.9, "warmup": True},
    # each model pins one thread: the profile this extends may set its own (a teacher's logits computed on
    # one thread in a DataLoader worker and on two in the step differ in the last bits)
    "reference": {"arch": "test_resnet", "threads": 1, "epochs": 2, "batch_size": 8, "lr": 3e-3,
                  "warmup_epochs": 0.5, "drop_path_rate": 0.1},
    "compact": {"arch": "mobilenetv4_conv_small_050", "threads": 1, "epochs": 1, "batch_size": 8, "lr": 3e-3,
                "warmup_epochs": 0.5, "distill": {"enabled": True, "temperature": 2.0, "alpha": 0.5}},
}


def _image(path: Path, label: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pixels = np.empty((36, 32, 3), dtype=np.float64)
    pixels[:] = COLOURS[label]
    stripes = np.indices((36, 32))[label % 2] % 6 < 3  # class 1 striped the other way
    pixels[stripes] *= 0.7
    pixels += rng.normal(0, 12, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "PNG" if path.suffix == ".png" else "JPEG", quality=90)


def corpus_frame(corpus: Path) -> pd.DataFrame:
    rows = []
    for label, cls in enumerate(CLASSES):
        for part, count in COUNTS.items():
            for k in range(count):
                rel = f"{part}/{cls}/{cls}_{k}.{'png' if k % 2 else 'jpg'}"
                _image(corpus / rel, label, zlib.crc32(rel.encode()))
                rows.append({"rel_path": rel, "class_name": cls, "split": part})
    frame = pd.DataFrame(rows)
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    frame["group_id"] = np.arange(len(frame))
    return frame


def write_split(run_dir: Path, frame: pd.DataFrame, class_map: dict) -> None:
    """The split chapter's artifacts (registered, with the fingerprints ``load_frozen`` checks)."""
    split_ch = Chapter(run_dir, "split")
    split_ch.write_json("split/class_map.json", class_map)
    split_ch.write_parquet("split/split.parquet", frame[split.SPLIT_COLUMNS])
    split_ch.write_parquet("split/quarantine.parquet", pd.DataFrame(
        {c: pd.Series(dtype=str) for c in split.QUARANTINE_COLUMNS}))
    fingerprints = {rel: evidence.sha256_file(run_dir / rel) for rel in split.FROZEN_FILES}
    split_ch.finish(figures={}, fingerprints=fingerprints, totals=frame["split"].value_counts().to_dict())


def build_run(base: Path, name: str = "run", training: dict | None = None) -> config.RunContext:
    corpus = base / f"{name}_corpus"
    frame = corpus_frame(corpus)
    overrides = {"image": {"size": 32}, "training": training or TINY_TRAINING}
    ctx = config.open_run(base / name, profile="smoke", data=str(corpus), overrides=overrides)
    run_dir = ctx.run_dir
    class_map = taxonomy.build_class_map(frame["class_name"].value_counts().to_dict())
    label_of = {c["name"]: c["index"] for c in class_map["classes"]}
    frame["label"] = frame["class_name"].map(label_of).astype("int64")

    corpus_ch = Chapter(run_dir, "corpus")
    manifest = frame[["row_id", "rel_path", "class_name"]].assign(
        inherited_split=frame["split"], admitted=True, decode_status="ok", quarantine_reason=None)
    corpus_ch.write_parquet("corpus/manifest.parquet", manifest)
    corpus_ch.write_json("corpus/class_map.json", class_map)
    corpus_ch.finish(figures={})

    audit_ch = Chapter(run_dir, "audit")
    audit_ch.write_parquet("audit/groups.parquet", frame[["row_id", "group_id"]].assign(group_size=1))
    audit_ch.write_parquet("audit/relationships.parquet", pd.DataFrame(
        {"row_id_a": pd.Series(dtype=str), "row_id_b": pd.Series(dtype=str), "kind": pd.Series(dtype=str),
         "trusted": pd.Series(dtype=bool)}))
    audit_ch.finish(figures={})
    write_split(run_dir, frame, class_map)
    return ctx


def subprocess_env() -> dict[str, str]:
    """Environment for a child Python: one thread, no hub access, the repo importable."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONHASHSEED="0",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return env


def run_cli(run_dir, model: str, extra_env: dict | None = None,
            ranks: int = 1) -> subprocess.CompletedProcess:
    """``python -m cropcop_utils.training`` in a child process (under torchrun when ``ranks > 1``)."""
    env = {**subprocess_env(), **(extra_env or {})}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    command = [*launcher, "-m", "cropcop_utils.training", "--run-dir", str(run_dir), "--model", model,
               "--no-progress"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
