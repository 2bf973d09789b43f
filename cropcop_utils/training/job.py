"""What one model's training is given (:class:`Job`) and what it resolves before the loop: device and AMP.

Kept apart from the loop (:mod:`.trainer`): the chapter and the benches build a :class:`Job`, and the
device / mixed-precision rules are plain functions of the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..core.distributed import DistEnv
from ..core.imaging import ImageSpec


# --------------------------------------------------------------------------- the job
@dataclass
class Job:
    """Everything one model's training needs, resolved by ``chapter.train_model``."""

    kind: str
    config: dict[str, Any]
    spec: ImageSpec
    corpus_root: Path | Mapping[str, Path]   # one folder, or a folder per row ``source`` (core.sources)
    train_rows: pd.DataFrame
    val_rows: pd.DataFrame
    class_names: list[str]
    data_fingerprints: dict[str, str]
    out_dir: Path
    teacher_path: Path | None = None
    teacher_sha256: str | None = None
    progress: bool = True
    env: DistEnv = field(default_factory=DistEnv)
    paste: Any = None   # the background-robust regime's BackgroundPaste (None: the lab photos as they are)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def fingerprinted_config(self, device_type: str, amp: str) -> dict[str, Any]:
        """The configuration that determines the trained weights (runtime-only knobs left out)."""
        # processes: how the run was launched; world_size, below, is what shaped the weights
        runtime_only = {"threads", "workers", "cache_images", "checkpoint_every", "eval_batch_size", "device",
                        "processes"}
        kept = {k: v for k, v in self.config.items() if k not in runtime_only}
        if kept.get("low_res") is None:  # off: the fingerprint of every model trained before the key existed
            kept.pop("low_res", None)
        return {**kept, "device_type": device_type, "amp_resolved": amp, "world_size": self.env.world_size,
                "image": {"size": self.spec.size, "mean": list(self.spec.mean), "std": list(self.spec.std)},
                "class_names": list(self.class_names), "teacher_sha256": self.teacher_sha256,
                "n_train": len(self.train_rows), "n_val": len(self.val_rows)}


def resolve_device(config: dict[str, Any], env: DistEnv) -> torch.device:
    wanted = config.get("device", "auto")
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    if wanted == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("training.device is 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def resolve_amp(config: dict[str, Any], device: torch.device) -> str:
    """'bf16' autocast on CUDA by default, off on CPU (bf16 CPU kernels are slower than fp32 there)."""
    amp = config.get("amp", "auto")
    if amp == "auto":
        return "bf16" if device.type == "cuda" else "off"
    if amp not in ("bf16", "fp16", "off"):
        raise ValueError(f"training.amp must be auto, bf16, fp16 or off, got {amp!r}")
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("training.amp 'fp16' needs CUDA; use 'bf16' or 'off' on CPU")
    return amp
