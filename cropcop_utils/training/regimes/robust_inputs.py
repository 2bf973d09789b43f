"""What the background-robust regime needs before it trains, written once into the run folder.

* ``training/leaf_masks.npz`` — the leaf mask of every *train* photo, estimated on the square the
  training loop sees (``image.size``) by chapter 10's classical method (:func:`.field.masks.leaf_mask`);
  reused while the train rows and the image size stay the same.
* ``training/background_pool.npz`` — the backgrounds (:func:`.backgrounds.build_pool`); its SHA-256
  and the pool's counts per kind go into ``training.json`` and into the models' configuration
  fingerprint, so a checkpoint names the pool it saw.
* ``training/background_examples.png`` — the pool and pasted training samples, for the reader.

Every file is registered by chapter ``training``; a rerun verifies and reuses them.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...core.evidence import Chapter, atomic_write_bytes, read_registry, sha256_json
from . import backgrounds as bg

MASKS = "training/leaf_masks.npz"
POOL = "training/background_pool.npz"
EXAMPLES = "training/background_examples.png"
MASK_METHOD = "cropcop_utils.field.masks.leaf_mask on the training square"


@dataclass
class RobustInputs:
    paste: bg.BackgroundPaste
    record: dict[str, Any]


def _reusable(ch: Chapter, rel_path: str) -> bool:
    return rel_path in read_registry(ch.run_dir) and ch.path(rel_path).exists()


def wait_for(run_dir: Any, rel_path: str, timeout_s: float = 1800.0, poll_s: float = 1.0) -> None:
    """Block until ``rel_path`` is registered (another process is writing it); a clear error on timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while rel_path not in read_registry(run_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rel_path} was not registered in {run_dir} within {timeout_s:.0f} s; "
                               "rank 0 prepares the background-robust regime's inputs")
        time.sleep(poll_s)


def train_masks(ch: Chapter, rows: pd.DataFrame, squares: Any) -> tuple[list[np.ndarray], str]:
    """Leaf masks of the train rows (row order), loaded when the registered file matches, else made."""
    from ...core.masks import leaf_mask

    ids = np.asarray(rows["row_id"].astype(str).tolist(), dtype=str)  # unicode, not object: no pickle
    side = int(squares.size)
    if _reusable(ch, MASKS):
        with np.load(ch.verify(MASKS)) as cached:
            if cached["row_ids"].tolist() == ids.tolist() and int(cached["side"]) == side:
                packed = cached["packed"]
                return [np.unpackbits(p)[: side * side].reshape(side, side).astype(bool) for p in packed], \
                    ch.inputs[MASKS]
    masks = [np.asarray(leaf_mask(squares.get(i)), dtype=bool) for i in range(len(ids))]
    buffer = io.BytesIO()
    np.savez(buffer, row_ids=ids, side=np.int64(side), method=np.asarray(MASK_METHOD),
             packed=np.stack([np.packbits(m.ravel()) for m in masks]) if masks
             else np.zeros((0, 0), np.uint8))
    atomic_write_bytes(ch.path(MASKS), buffer.getvalue())
    return masks, ch.record_output(MASKS)


def prepare(ch: Chapter, rows: pd.DataFrame, squares: Any, section: dict[str, Any]) -> RobustInputs:
    """Masks and pool of the regime (made or reused), the paste step, and their record for training.json."""
    params = bg.RobustParams.from_dict(section)
    masks, masks_sha = train_masks(ch, rows, squares)
    side = int(squares.size)
    spec_sha = sha256_json({"params": params.to_dict(), "side": side, "masks_sha256": masks_sha})
    pool = None
    if _reusable(ch, POOL):
        data = ch.verify(POOL).read_bytes()
        images, kinds = bg.load_pool(data)
        with np.load(io.BytesIO(data)) as loaded:
            same = str(loaded["spec_sha256"]) == spec_sha if "spec_sha256" in loaded else False
        if same:
            pool, pool_sha = (images, kinds), ch.inputs[POOL]
    if pool is None:
        ids = rows["row_id"].astype(str).tolist()
        images, kinds, origins = bg.build_pool(params, side, [(ids[i], squares.get(i), masks[i])
                                                               for i in range(len(ids))])
        atomic_write_bytes(ch.path(POOL), bg.pool_bytes(images, kinds, origins, spec_sha256=spec_sha))
        pool, pool_sha = (images, kinds), ch.record_output(POOL)
    images, kinds = pool
    paste = bg.BackgroundPaste(params, images, masks)
    shares = np.array([m.mean() for m in masks]) if masks else np.zeros(0)
    usable = shares >= params.min_leaf_share
    record = {
        "params": params.to_dict(),
        "pool": {"path": POOL, "sha256": pool_sha, "n": len(images), "side": side,
                 "per_kind": {k: int(kinds.count(k)) for k in bg.KINDS},
                 "sources": "procedural (OpenCV), scikit-image grass/gravel, train photos only; never a "
                            "validation, test or field photo"},
        "masks": {"path": MASKS, "sha256": masks_sha, "method": MASK_METHOD, "rows": len(masks),
                  "usable": int(usable.sum()),
                  "mean_leaf_share": float(shares.mean()) if len(shares) else None,
                  "reason": None if len(shares) else "no train rows"},
    }
    return RobustInputs(paste, record)


def save_examples(ch: Chapter, inputs: RobustInputs, squares: Any, seed: int, n: int = 12) -> str:
    """A figure: a row of pool backgrounds, then lab photos and the same photos pasted (before the
    ordinary augmentation)."""
    import matplotlib.pyplot as plt
    import torch

    pool = inputs.paste.pool
    count = min(n, len(inputs.paste.masks))
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(inputs.paste.masks), size=count, replace=False) if count else []
    shown = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
    # every example shows a pasted leaf (paste_p 1), as the regime pastes most samples
    forced = bg.BackgroundPaste(dataclasses.replace(inputs.paste.params, paste_p=1.0), pool,
                                inputs.paste.masks)
    fig, axes = plt.subplots(3, max(1, n), figsize=(1.3 * max(1, n), 4.2), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, index in zip(axes[0], shown, strict=False):
        ax.imshow(pool[index])
    for column, row in enumerate(picks):
        square = squares.get(int(row))
        generator = torch.Generator().manual_seed(int(seed) + column)
        axes[1, column].imshow(square)
        axes[2, column].imshow(forced(square, int(row), generator))
    axes[0, 0].set_title("pool", fontsize=8, loc="left")
    axes[1, 0].set_title("lab photo", fontsize=8, loc="left")
    axes[2, 0].set_title("pasted + field look", fontsize=8, loc="left")
    fig.tight_layout()
    sha = ch.save_figure(fig, EXAMPLES, dpi=90)
    plt.close(fig)
    return sha

