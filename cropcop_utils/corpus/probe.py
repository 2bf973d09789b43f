"""The per-file probe: bytes, SHA-256, header fields and decode outcome of every file, in a process
pool for all but small corpora.  It is the only code that opens a corpus file.

A file is decoded exactly as :mod:`cropcop_utils.core.imaging` decodes it for a model (full ``load()``,
truncated files refused, then the RGB conversion), so an admitted file is a loadable file.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..core import imaging
from ..core.config import progress_wanted
from ..core.evidence import sha256_bytes, sha256_file
from .layout import FileEntry
from .quarantine import OUTSIDE_REASON

INLINE_BELOW = 200  # smaller corpora are scanned in-process: a pool costs more than it saves
HASH_STREAM_ABOVE = imaging.IN_MEMORY_BYTES


# --------------------------------------------------------------------------- per-file probe
def _hash_file(path: Path, size: int) -> tuple[str, bytes | None]:
    if size > HASH_STREAM_ABOVE:
        return sha256_file(path), None
    data = path.read_bytes()
    return sha256_bytes(data), data


def probe_file(path: str | os.PathLike, max_image_pixels: int | None = None) -> dict[str, Any]:
    """Bytes, SHA-256, header fields and decode outcome of one file (decoded as the contract does)."""
    path = Path(path)
    row: dict[str, Any] = {"bytes": None, "sha256": None, "format": None, "width": None, "height": None,
                           "mode": None, "exif_orientation": None, "exif_make": None, "exif_model": None,
                           "decode_status": "error", "error": None, "decode_reason": None}
    try:
        row["bytes"] = path.stat().st_size
        row["sha256"], data = _hash_file(path, row["bytes"])
    except OSError as error:
        row.update(error=imaging.describe_error(error), decode_reason="unreadable")
        return row
    header: dict[str, Any] = {}
    try:
        image = imaging.open_decoded(data if data is not None else path, max_image_pixels, path=path,
                                     header=header)
        imaging.to_rgb(image)
        row["decode_status"] = "ok"
    except imaging.ImageLoadError as error:
        row.update(error=error.detail, decode_reason=error.reason)
    except Exception as error:  # a mode the RGB conversion cannot handle
        row.update(error=imaging.describe_error(error), decode_reason="unreadable")
    row.update({k: header[k] for k in header if k in row})
    return row


def _probe_chunk(root: str, rel_paths: list[str], max_image_pixels: int | None) -> list[dict[str, Any]]:
    return [probe_file(Path(root) / rel, max_image_pixels) for rel in rel_paths]


def probe_all(
    root: str | os.PathLike,
    rel_paths: list[str],
    max_image_pixels: int | None,
    workers: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Probe files in parallel (process pool over chunks of files), results in input order."""
    workers = max(1, int(workers or os.cpu_count() or 1))
    bar = tqdm(total=len(rel_paths), desc="scanning corpus", unit="file",
               disable=not progress_wanted(progress), mininterval=1.0)
    with bar:
        if workers == 1 or len(rel_paths) < INLINE_BELOW:
            results = []
            for rel in rel_paths:
                results.append(probe_file(Path(root) / rel, max_image_pixels))
                bar.update(1)
            return results
        size = max(16, min(512, math.ceil(len(rel_paths) / (workers * 16))))
        chunks = [rel_paths[i:i + size] for i in range(0, len(rel_paths), size)]
        out: list[list[dict[str, Any]] | None] = [None] * len(chunks)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_probe_chunk, str(root), chunk, max_image_pixels): i
                       for i, chunk in enumerate(chunks)}
            for future in as_completed(futures):
                index = futures[future]
                out[index] = future.result()
                bar.update(len(chunks[index]))
    return [row for chunk in out for row in chunk or []]


def _probe_inside(root: Path, entries: list[FileEntry], max_image_pixels: int | None, workers: int | None,
                  progress: bool) -> list[dict[str, Any]]:
    """:func:`probe_all` over the entries inside the root; an ``outside_corpus`` entry is never opened."""
    inside = [e.rel_path for e in entries if e.layout_reason != OUTSIDE_REASON]
    probed = iter(probe_all(root, inside, max_image_pixels, workers, progress))
    unopened = {"bytes": None, "sha256": None, "format": None, "width": None, "height": None, "mode": None,
                "exif_orientation": None, "exif_make": None, "exif_model": None, "error": None,
                "decode_status": "not_opened", "decode_reason": None}
    return [dict(unopened) if e.layout_reason == OUTSIDE_REASON else next(probed) for e in entries]
