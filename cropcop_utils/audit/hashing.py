"""Per-image fingerprints of the audit: content digests, perceptual hashes and verifier thumbnails."""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import imaging
from ..config import progress_wanted
from ..evidence import sha256_bytes
from . import verifier
from .errors import AuditInputError

HASH_COLUMNS = ["row_id", "phash", "dhash", "pixel_sha256"]
INLINE_BELOW = 256  # smaller corpora are hashed in-process: a pool costs more than it saves
HASH_SIDE_LIMIT = 64  # images are box-reduced to about this short side before hashing


@dataclass
class ImageHashes:
    """Per-image audit fingerprints, in manifest order."""

    phash: np.ndarray        # uint64
    dhash: np.ndarray        # uint64
    pixel_sha256: list[str]
    grey: np.ndarray         # (N, THUMB, THUMB) uint8 thumbnails for the verifier
    weight: np.ndarray       # (N, THUMB, THUMB) uint8 subject weights
    seconds: float = 0.0
    workers: int = 1


def _hash64(image_hash: Any) -> int:
    """The 64 hash bits as an integer, row-major, most significant bit first: ``int(str(h), 16)``,
    without imagehash's slow per-bit string formatting."""
    return int.from_bytes(np.packbits(np.asarray(image_hash.hash, dtype=bool).ravel()).tobytes(), "big")


def pixel_digest(rgb: Any) -> str:
    """SHA-256 of decoded RGB pixels and their size: equal iff two files decode to the same picture."""
    header = f"RGB {rgb.width}x{rgb.height}\n".encode()
    return hashlib.sha256(header + rgb.tobytes()).hexdigest()


def fingerprint_image(
    path: str | os.PathLike,
    expected_sha256: str | None = None,
    max_image_pixels: int | None = None,
) -> tuple[int, int, str, np.ndarray, np.ndarray]:
    """(pHash, dHash, pixel SHA-256, grey thumbnail, subject weight) of one file.

    Decoded by the loading contract (:func:`imaging.open_decoded` + :func:`imaging.to_rgb`, EXIF
    orientation applied) from the same bytes that are checked against ``expected_sha256``, so a file
    changed since the corpus scan is refused instead of silently audited.
    """
    import imagehash

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditInputError(f"{path}: cannot read admitted image ({error}); rerun chapter 'corpus'") \
            from None
    if expected_sha256 is not None and sha256_bytes(data) != expected_sha256:
        raise AuditInputError(f"{path} changed since chapter 'corpus' scanned it (SHA-256 differs from "
                              "corpus/manifest.parquet); rerun chapter 'corpus' and then 'audit'.")
    try:
        rgb = imaging.to_rgb(imaging.open_decoded(data, max_image_pixels, path=path))
    except imaging.ImageLoadError as error:
        raise AuditInputError(f"{path}: admitted by chapter 'corpus' but cannot be decoded now "
                              f"({error.reason}: {error.detail}); rerun chapter 'corpus'.") from None
    digest = pixel_digest(rgb)
    # Hashes and thumbnails need a small image only (pHash resamples to 32x32): an integer box reduction
    # first (as JPEG draft decoding would) makes them ~4x cheaper without changing what they see.
    factor = min(rgb.size) // HASH_SIDE_LIMIT
    small = rgb.reduce(factor) if factor >= 2 else rgb
    grey = small.convert("L")
    phash = _hash64(imagehash.phash(grey, hash_size=8))
    dhash = _hash64(imagehash.dhash(grey, hash_size=8))
    thumb, weight = verifier.thumbnail(small)
    return phash, dhash, digest, thumb, weight


def _hash_chunk(root: str, rel_paths: list[str], shas: list[str | None],
                max_image_pixels: int | None) -> tuple[Any, ...]:
    out = [fingerprint_image(Path(root) / rel, sha, max_image_pixels) for rel, sha in zip(rel_paths, shas,
                                                                                           strict=True)]
    return (np.array([o[0] for o in out], dtype=np.uint64), np.array([o[1] for o in out], dtype=np.uint64),
            [o[2] for o in out], np.stack([o[3] for o in out]), np.stack([o[4] for o in out]))


def hash_images(
    root: str | os.PathLike,
    rel_paths: Sequence[str],
    sha256s: Sequence[str | None] | None = None,
    workers: int | None = None,
    progress: bool = True,
    max_image_pixels: int | None = None,
) -> ImageHashes:
    """Fingerprint every image on a process pool (chunks of files), results in input order."""
    rel_paths = list(rel_paths)
    shas = list(sha256s) if sha256s is not None else [None] * len(rel_paths)
    workers = max(1, int(workers or os.cpu_count() or 1))
    side = verifier.THUMB
    start = time.perf_counter()
    if not rel_paths:
        empty = np.zeros((0, side, side), dtype=np.uint8)
        return ImageHashes(np.zeros(0, np.uint64), np.zeros(0, np.uint64), [], empty, empty.copy(), 0.0, 1)
    size = max(16, min(256, math.ceil(len(rel_paths) / (workers * 8))))
    chunks = [(i, min(len(rel_paths), i + size)) for i in range(0, len(rel_paths), size)]
    results: list[Any] = [None] * len(chunks)
    bar = tqdm(total=len(rel_paths), desc="hashing images", unit="img", disable=not progress_wanted(progress),
               mininterval=1.0)
    with bar:
        if workers == 1 or len(rel_paths) < INLINE_BELOW:
            workers = 1
            for k, (a, b) in enumerate(chunks):
                results[k] = _hash_chunk(str(root), rel_paths[a:b], shas[a:b], max_image_pixels)
                bar.update(b - a)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_hash_chunk, str(root), rel_paths[a:b], shas[a:b], max_image_pixels): k
                           for k, (a, b) in enumerate(chunks)}
                for future in as_completed(futures):
                    k = futures[future]
                    results[k] = future.result()
                    bar.update(chunks[k][1] - chunks[k][0])
    return ImageHashes(
        phash=np.concatenate([r[0] for r in results]), dhash=np.concatenate([r[1] for r in results]),
        pixel_sha256=[d for r in results for d in r[2]], grey=np.concatenate([r[3] for r in results]),
        weight=np.concatenate([r[4] for r in results]), seconds=time.perf_counter() - start, workers=workers)

