"""Decoded squares under the loading contract: cached once per process, and the evaluation dataset.

Every chapter that scores images (training's validation, PTQ's calibration, the runtime and the later
chapters' predictions) reads them through :class:`EvalImages`; training's augmented samples start from
the same :class:`SquareCache`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from . import imaging
from .config import progress_wanted
from .imaging import ImageSpec
from .sources import LAB

Roots = str | os.PathLike | Mapping[str, str | os.PathLike]


class SquareCache:
    """The loading contract's square uint8 images of a set of rows, decoded once and kept in memory.

    ``load_square`` is deterministic, so a cached array is exactly what a fresh decode would give.  Every
    cache of a process shares its decoded squares file by file (at most :data:`SHARED_BYTES`, the oldest
    dropped first): the compact model's trainer, built after the reference's on the same split, decodes
    nothing; every model state scoring the same photos decodes them once; the learning curve's points,
    whose training rows grow by nested draws, decode each photo once.  A file is the same when its path,
    size and modification time are: one rewritten in place (a chapter run again in the same process) is
    decoded again.
    """

    SHARED_BYTES = 2 * 2**30
    _shared: OrderedDict[tuple[tuple[str, int, int], int], np.ndarray] = OrderedDict()
    _shared_bytes = 0
    _lock = threading.Lock()

    def __init__(self, paths: Sequence[Path], size: int, enabled: bool = True) -> None:
        self.paths = list(paths)
        self.size = size
        self.enabled = enabled
        self.arrays: list[np.ndarray | None] = [None] * len(self.paths)
        self.keys = [(_identity(p), int(size)) for p in self.paths] if enabled else []

    def fill(self, progress: bool = False, desc: str = "decode", threads: int = 2) -> None:
        """Decode every image not yet cached; ``threads`` decode side by side (Pillow releases the GIL
        while it decodes and resizes), each writing its own slots, so the result does not depend on it."""
        if not self.enabled:
            return
        from concurrent.futures import ThreadPoolExecutor

        missing = [i for i, a in enumerate(self.arrays) if a is None]
        bar = tqdm(total=len(missing), desc=desc, disable=not progress_wanted(progress), leave=False)
        with bar, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for _ in pool.map(self.get, missing):
                bar.update()

    def get(self, index: int) -> np.ndarray:
        cached = self.arrays[index]
        if cached is not None:
            return cached
        if not self.enabled:
            return imaging.load_array(self.paths[index], self.size)
        key = self.keys[index]
        with SquareCache._lock:
            array = SquareCache._shared.get(key)
        if array is None:
            array = imaging.load_array(self.paths[index], self.size)
            _share(key, array)
        self.arrays[index] = array
        return array


def _share(key: tuple[tuple[str, int, int], int], array: np.ndarray) -> None:
    """Keep a decoded square for the other caches of this process, within the byte budget."""
    with SquareCache._lock:
        shared = SquareCache._shared
        if key in shared:
            return
        shared[key] = array
        SquareCache._shared_bytes += array.nbytes
        while SquareCache._shared_bytes > SquareCache.SHARED_BYTES and shared:
            _, dropped = shared.popitem(last=False)
            SquareCache._shared_bytes -= dropped.nbytes


def _identity(path: Path) -> tuple[str, int, int]:
    """(path, size, modification time): a missing file gets (-1, -1), and its decode says it is missing."""
    try:
        stat = os.stat(path)
    except OSError:
        return str(path), -1, -1
    return str(path), stat.st_size, stat.st_mtime_ns


def row_paths(rows: pd.DataFrame, roots: Roots) -> list[Path]:
    """Each row's image file: ``rel_path`` under one root, or, given ``{source: root}``
    (``RunContext.source_roots``), under the root of the row's ``source`` column (rows without that column
    are lab rows, :data:`cropcop_utils.core.sources.LAB`)."""
    if not isinstance(roots, Mapping):
        root = Path(roots)
        return [root / rel for rel in rows["rel_path"]]
    sources = rows["source"] if "source" in rows.columns else pd.Series(LAB, index=rows.index)
    missing = sorted(set(sources.dropna()) - set(roots)) + (["<none>"] if sources.isna().any() else [])
    if missing:
        raise ValueError(
            f"rows of source(s) {missing} have no image folder: the run's source roots are "
            f"{sorted(roots)} (a 'field_train' row needs a run opened with --field-train)")
    base = {name: Path(root) for name, root in roots.items()}
    return [base[source] / rel for source, rel in zip(sources, rows["rel_path"], strict=True)]


class EvalImages(Dataset):
    """Evaluation samples under the loading contract exactly (``imaging.load_tensor``); yields the index."""

    def __init__(self, rows: pd.DataFrame, corpus_root: Roots, spec: ImageSpec,
                 cache: bool = False) -> None:
        self.spec = spec
        self.squares = SquareCache(row_paths(rows, corpus_root), spec.size, enabled=cache)

    def __len__(self) -> int:
        return len(self.squares.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        # to_tensor(load_array(p)) is load_tensor(p): the same contract, cached or not.
        return imaging.to_tensor(self.squares.get(index), self.spec.mean, self.spec.std), index
