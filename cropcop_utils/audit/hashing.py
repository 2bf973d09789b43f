"""Per-image fingerprints of the audit: content digests, perceptual hashes, verifier inputs, embeddings.

Every file is read once; its bytes are checked against the manifest's SHA-256 and decoded by the loading
contract (EXIF orientation applied).  From the decoded picture:

* the pixel SHA-256 (identical pixels, whatever the file's metadata);
* 64-bit pHash (``imagehash``'s definition) and dHash, and the pHash of each of the eight dihedral
  transforms (quarter turns, with and without a mirror) of the same 32×32 grey image — a flipped or
  quarter-turned copy has, as one of its eight, nearly the original's pHash;
* a ring spectrum (:func:`ring_spectrum`): mean and angular Fourier magnitudes of concentric rings
  about the centre, which a turn by any angle about the centre (or a mirror) leaves unchanged;
* the SSIM verifier's thumbnail and subject weight (:mod:`.verifier`);
* ORB keypoints of a small grey square, plain and mirrored (:mod:`.geometry`);
* the leaf-alignment verifier's thumbnail and leaf weight (:mod:`.leaf_align`);
* optionally the global-pooled features of the ImageNet EfficientNet-Lite0 (:mod:`.embedding`),
  computed in the same worker on the chunk's squares so the decoded pixels never travel.

Chunks of files run on a process pool; results come back in input order.  Within a chunk each image is
resampled for the hashes (:func:`hash_samples`) and the hashes' arithmetic (DCTs, ring sampling, bit
packing) runs once on the whole chunk (:func:`batch_hashes`): per image that arithmetic cost more
Python overhead than work.  The pass records the CPU seconds of each stage (:data:`STAGES`).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from scipy.fft import dct  # imported with the module: a worker pays it once, not inside the first image
from tqdm import tqdm

from ..core import imaging
from ..core.config import progress_wanted
from ..core.evidence import sha256_bytes
from . import embedding, geometry, leaf_align, verifier
from .errors import AuditInputError
from .pools import clean_pool

HASH_COLUMNS = ["row_id", "phash", "dhash", "pixel_sha256"]
# CPU seconds of each image's work, summed over workers: reading, checking and decoding the file and the
# pixel digest; the hashes proper (pHash, dHash, 8 dihedral pHashes, ring spectrum); the verifiers'
# inputs (SSIM and leaf thumbnails, ORB keypoints); the embedding's input square
STAGES = ("read_decode", "hashes", "verifier_inputs", "embedding_input")
RING_SIDE = 64                     # the ring spectrum samples a grey square of this side
RING_RADII = np.arange(2, 31, 2)   # ring radii in px of that square (the inscribed disc, corners left out)
RING_ANGLES = 64                   # samples around each ring
RING_HARMONICS = 6                 # angular Fourier magnitudes kept per ring (low orders: robust to noise)
RING_FEATURES = len(RING_RADII) * (1 + RING_HARMONICS)
INLINE_BELOW = 256  # smaller corpora are hashed in-process: a pool costs more than it saves
HASH_SIDE_LIMIT = 64  # images are box-reduced to about this short side before hashing
DIHEDRAL = ("identity", "rot90", "rot180", "rot270", "mirror", "mirror_rot90", "mirror_rot180",
            "mirror_rot270")  # the eight symmetries of a square, as :func:`dihedral_apply` numbers them


def _no_leaf_thumbnails() -> np.ndarray:
    return np.zeros((0, leaf_align.SIDE, leaf_align.SIDE), np.uint8)


@dataclass
class ImageHashes:
    """Per-image audit fingerprints, in manifest order."""

    phash: np.ndarray        # uint64
    dhash: np.ndarray        # uint64
    pixel_sha256: list[str]
    grey: np.ndarray         # (N, THUMB, THUMB) uint8 thumbnails for the verifier
    weight: np.ndarray       # (N, THUMB, THUMB) uint8 subject weights
    dihedral: np.ndarray = field(default_factory=lambda: np.zeros((0, 8), np.uint64))  # (N, 8) pHashes
    rings: np.ndarray = field(default_factory=lambda: np.zeros((0, RING_FEATURES), np.float32))
    keypoints: list[geometry.Keypoints] = field(default_factory=list)
    leaf_grey: np.ndarray = field(default_factory=_no_leaf_thumbnails)    # (N, SIDE, SIDE) uint8
    leaf_weight: np.ndarray = field(default_factory=_no_leaf_thumbnails)  # leaf weight, same shape
    embedding: np.ndarray | None = None  # (N, D) float32, unit length; None when not computed
    features: np.ndarray | None = None   # (N, D) float32 pooled features before scaling (chapter 4 reuses)
    seconds: float = 0.0
    embed_seconds: float = 0.0  # CPU seconds of the embedding forward passes (summed over workers)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # CPU seconds per :data:`STAGES`
    workers: int = 1


def dihedral_apply(array: np.ndarray, g: int) -> np.ndarray:
    """Symmetry ``g`` (0-7, see :data:`DIHEDRAL`) of a square array's last two axes: ``g % 4``
    counter-clockwise quarter turns, after a left-right mirror when ``g >= 4``."""
    if g >= 4:
        array = np.flip(array, axis=-1)
    return np.rot90(array, g % 4, axes=(-2, -1))


def dihedral_inverse(g: int) -> int:
    """The symmetry that undoes ``g``: turns go back, mirrored ones are their own inverse."""
    return (4 - g) % 4 if g < 4 else g


def _pack_bits(bits: np.ndarray) -> np.ndarray:
    """(M, 64) booleans → (M,) uint64, row-major, most significant bit first (``int(str(imagehash), 16)``)."""
    packed = np.packbits(bits.reshape(-1, 64), axis=-1)
    return np.ascontiguousarray(packed).view(">u8")[:, 0].astype(np.uint64)


def _coefficient_symmetry(low: np.ndarray, g: int) -> np.ndarray:
    """The low DCT-II block of symmetry ``g`` of a picture, from the picture's own block: mirroring an
    axis flips the sign of that axis's odd coefficients, a transpose transposes them, so
    :func:`dihedral_apply`'s steps carry over exactly without transforming the pixels again."""
    sign = np.where(np.arange(low.shape[-1]) % 2, -1.0, 1.0)
    if g >= 4:
        low = low * sign[None, :]                 # mirror left-right
    for _ in range(g % 4):
        low = low.T * sign[:, None]               # np.rot90 = transpose, then mirror top-bottom
    return low


# Each symmetry's block is the picture's block (transposed after an odd number of quarter turns) times
# a fixed sign pattern: both precomputed, so the eight blocks cost one multiply.
_SYMMETRY_SIGNS = np.stack([_coefficient_symmetry(np.ones((8, 8)), g) for g in range(8)])
_SYMMETRY_TRANSPOSED = np.array([g % 2 == 1 for g in range(8)])


def hash_samples(grey: Image.Image) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three resamples of a grey picture that the hashes read: 32×32 Lanczos (pHash), 9×8 Lanczos
    (dHash) and ``RING_SIDE``² bilinear (ring spectrum).  The arithmetic on them runs on a whole chunk
    at once (:func:`batch_hashes`): per image, only the resampling is left."""
    grey = grey.convert("L")
    return (np.asarray(grey.resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64),
            np.asarray(grey.resize((9, 8), Image.Resampling.LANCZOS), dtype=np.int16),
            np.asarray(grey.resize((RING_SIDE, RING_SIDE), Image.Resampling.BILINEAR), dtype=np.float64))


def _dihedral_batch(pixels: np.ndarray) -> np.ndarray:
    """(N, 32, 32) Lanczos samples → (N, 8) pHashes of the eight symmetries (see :func:`dihedral_phashes`)."""
    low = dct(dct(pixels, axis=1), axis=2)[:, :8, :8]
    flipped = low.transpose(0, 2, 1)[:, None]
    turned = np.where(_SYMMETRY_TRANSPOSED[None, :, None, None], flipped, low[:, None])
    stack = (turned * _SYMMETRY_SIGNS[None]).reshape(-1, 64)
    ordered = np.sort(stack, axis=1)
    median = (ordered[:, 31:32] + ordered[:, 32:33]) / 2  # numpy's median of 64 values, without its overhead
    return _pack_bits(stack > median).reshape(len(pixels), 8)


def _dhash_batch(pixels: np.ndarray) -> np.ndarray:
    """(N, 8, 9) Lanczos samples → (N,) dHashes."""
    return _pack_bits(pixels[:, :, 1:] > pixels[:, :, :-1])


def _rings_batch(pixels: np.ndarray) -> np.ndarray:
    """(N, RING_SIDE, RING_SIDE) bilinear samples → (N, RING_FEATURES) ring spectra."""
    rings = (_ring_sampler() @ pixels.reshape(len(pixels), -1).T).T.reshape(-1, len(RING_RADII), RING_ANGLES)
    spectrum = np.abs(np.fft.rfft(rings, axis=2))[:, :, 1:RING_HARMONICS + 1] / RING_ANGLES
    return np.concatenate([rings.mean(axis=2), spectrum.reshape(len(pixels), -1)], axis=1).astype(np.float32)


def batch_hashes(samples: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """``phash``, ``dhash``, ``dihedral`` (N, 8) and ``rings`` of a chunk of :func:`hash_samples`."""
    if not samples:
        return {"phash": np.zeros(0, np.uint64), "dhash": np.zeros(0, np.uint64),
                "dihedral": np.zeros((0, 8), np.uint64), "rings": np.zeros((0, RING_FEATURES), np.float32)}
    p32, d98, r64 = (np.stack(part) for part in zip(*samples, strict=True))
    dihedral = _dihedral_batch(p32)
    return {"phash": dihedral[:, 0].copy(), "dhash": _dhash_batch(d98), "dihedral": dihedral,
            "rings": _rings_batch(r64)}


def dihedral_phashes(grey: Image.Image) -> np.ndarray:
    """pHash (``imagehash.phash``'s definition) of the eight dihedral transforms of ``grey``; entry 0 is
    ``imagehash.phash(grey)`` itself.  The 32×32 resample and its DCT are done once: a symmetry of the
    picture is a sign and transpose pattern of its DCT coefficients (:func:`_coefficient_symmetry`), and
    the resample filter is symmetric, so this is the pHash of each transformed picture."""
    return _dihedral_batch(hash_samples(grey)[0][None])[0]


@lru_cache(maxsize=1)
def _ring_sampler():
    """Bilinear sampling of the rings as one sparse (rings × angles, side²) matrix, built once per
    process: the same values as ``scipy.ndimage.map_coordinates(order=1)`` at these points (all lie
    inside the square), ~10x cheaper per image than calling it."""
    from scipy.sparse import csr_matrix

    theta = np.linspace(0, 2 * np.pi, RING_ANGLES, endpoint=False)
    centre = (RING_SIDE - 1) / 2
    ys = (centre + RING_RADII[:, None] * np.sin(theta)[None]).ravel()
    xs = (centre + RING_RADII[:, None] * np.cos(theta)[None]).ravel()
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    fy, fx = ys - y0, xs - x0
    rows = np.repeat(np.arange(len(ys)), 4)
    cols = np.stack([y0 * RING_SIDE + x0, y0 * RING_SIDE + x0 + 1, (y0 + 1) * RING_SIDE + x0,
                     (y0 + 1) * RING_SIDE + x0 + 1], axis=1).ravel()
    weights = np.stack([(1 - fy) * (1 - fx), (1 - fy) * fx, fy * (1 - fx), fy * fx], axis=1).ravel()
    return csr_matrix((weights, (rows, cols)), shape=(len(ys), RING_SIDE * RING_SIDE))


def ring_spectrum(grey: Image.Image) -> np.ndarray:
    """Rotation- and mirror-invariant descriptor of a picture's centre disc: per ring, its mean and the
    magnitudes of its first angular Fourier harmonics (a turn shifts each ring's samples, a mirror
    reverses them; neither changes the magnitudes).  Hand-written: no library ships this small
    descriptor; the rings are sampled bilinearly (:func:`_ring_sampler`)."""
    return _rings_batch(hash_samples(grey)[2][None])[0]


def dhash64(grey: Image.Image) -> int:
    """dHash (``imagehash.dhash``'s definition, 8×8 row gradients) as a 64-bit integer."""
    return int(_dhash_batch(hash_samples(grey)[1][None])[0])


def pixel_digest(rgb: Any) -> str:
    """SHA-256 of decoded RGB pixels and their size: equal iff two files decode to the same picture."""
    header = f"RGB {rgb.width}x{rgb.height}\n".encode()
    return hashlib.sha256(header + rgb.tobytes()).hexdigest()


def fingerprint_image(
    path: str | os.PathLike,
    expected_sha256: str | None = None,
    max_image_pixels: int | None = None,
    embed_side: int = 0,
    defer_hashes: bool = False,
) -> dict[str, Any]:
    """Fingerprints of one file: ``phash``, ``dhash``, ``dihedral`` (8 pHashes), ``digest``, ``thumb``,
    ``weight``, ``keypoints``, ``leaf_grey``, ``leaf_weight`` and, when ``embed_side`` > 0, ``square``
    (the RGB input of the embedding).

    Decoded by the loading contract (:func:`imaging.open_decoded` + :func:`imaging.to_rgb`, EXIF
    orientation applied) from the same bytes that are checked against ``expected_sha256``, so a file
    changed since the corpus scan is refused instead of silently audited.  ``defer_hashes`` returns the
    hashes' resamples (``hash_samples``) instead of the hashes, for :func:`batch_hashes` on a chunk.
    """
    path = Path(path)
    clock = time.process_time()
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
    stages = {"read_decode": time.process_time() - clock}
    clock = time.process_time()
    # Hashes and thumbnails need a small image only (pHash resamples to 32x32): an integer box reduction
    # first (as JPEG draft decoding would) makes them ~4x cheaper without changing what they see.
    # Keypoints get a larger reduction of the same picture.
    factor = min(rgb.size) // max(HASH_SIDE_LIMIT, geometry.SIDE)
    small = rgb.reduce(factor) if factor >= 2 else rgb
    hash_factor = min(rgb.size) // HASH_SIDE_LIMIT
    hash_input = rgb.reduce(hash_factor) if hash_factor >= 2 else rgb
    out: dict[str, Any] = {"digest": digest, "hash_samples": hash_samples(hash_input)}
    if not defer_hashes:
        hashes = batch_hashes([out.pop("hash_samples")])
        out.update({"phash": int(hashes["phash"][0]), "dhash": int(hashes["dhash"][0]),
                    "dihedral": hashes["dihedral"][0], "rings": hashes["rings"][0]})
    stages["hashes"] = time.process_time() - clock
    clock = time.process_time()
    out["thumb"], out["weight"] = verifier.thumbnail(hash_input)
    out["leaf_grey"], out["leaf_weight"] = leaf_align.leaf_thumbnail(hash_input)
    out["keypoints"] = geometry.keypoints(small)
    stages["verifier_inputs"] = time.process_time() - clock
    if embed_side:
        clock = time.process_time()
        # the loading contract's square (edge-mean padding, bicubic from the full picture): the embedding
        # sees what the probes' frozen backbone and the models see, so chapter 4 can reuse its features
        out["square"] = np.asarray(imaging.square_resize(rgb, embed_side), dtype=np.uint8)
        stages["embedding_input"] = time.process_time() - clock
    out["stage_seconds"] = stages
    return out


def _hash_chunk(root: str, rel_paths: list[str], shas: list[str | None], max_image_pixels: int | None,
                embed_side: int) -> dict[str, Any]:
    out = [fingerprint_image(Path(root) / rel, sha, max_image_pixels, embed_side, defer_hashes=True)
           for rel, sha in zip(rel_paths, shas, strict=True)]
    start = time.process_time()
    hashes = batch_hashes([o.pop("hash_samples") for o in out])
    hash_seconds = time.process_time() - start
    chunk: dict[str, Any] = {
        **hashes,
        "digest": [o["digest"] for o in out], "thumb": np.stack([o["thumb"] for o in out]),
        "weight": np.stack([o["weight"] for o in out]), "keypoints": [o["keypoints"] for o in out],
        "leaf_grey": np.stack([o["leaf_grey"] for o in out]),
        "leaf_weight": np.stack([o["leaf_weight"] for o in out]),
        "embedding": None, "features": None, "embed_seconds": 0.0,
        "stage_seconds": {k: sum(o["stage_seconds"].get(k, 0.0) for o in out) for k in STAGES},
    }
    chunk["stage_seconds"]["hashes"] += hash_seconds
    if embed_side:
        start = time.process_time()
        chunk["features"] = embedding.pooled_features(np.stack([o["square"] for o in out]))
        chunk["embedding"] = embedding.unit(chunk["features"])
        chunk["embed_seconds"] = time.process_time() - start
    return chunk


def hash_images(
    root: str | os.PathLike,
    rel_paths: Sequence[str],
    sha256s: Sequence[str | None] | None = None,
    workers: int | None = None,
    progress: bool = True,
    max_image_pixels: int | None = None,
    embed_side: int = 0,
) -> ImageHashes:
    """Fingerprint every image on a process pool (chunks of files), results in input order.

    ``embed_side`` > 0 also computes the EfficientNet-Lite0 embedding of every image at that side."""
    rel_paths = list(rel_paths)
    shas = list(sha256s) if sha256s is not None else [None] * len(rel_paths)
    workers = max(1, int(workers or os.cpu_count() or 1))
    side = verifier.THUMB
    start = time.perf_counter()
    if not rel_paths:
        empty = np.zeros((0, side, side), dtype=np.uint8)
        return ImageHashes(np.zeros(0, np.uint64), np.zeros(0, np.uint64), [], empty, empty.copy(),
                           embedding=np.zeros((0, embedding.DIM), np.float32) if embed_side else None,
                           features=np.zeros((0, embedding.DIM), np.float32) if embed_side else None)
    size = max(16, min(256, math.ceil(len(rel_paths) / (workers * 8))))
    chunks = [(i, min(len(rel_paths), i + size)) for i in range(0, len(rel_paths), size)]
    results: list[Any] = [None] * len(chunks)
    bar = tqdm(total=len(rel_paths), desc="hashing images", unit="img", disable=not progress_wanted(progress),
               mininterval=1.0)
    with bar:
        if workers == 1 or len(rel_paths) < INLINE_BELOW:
            workers = 1
            for k, (a, b) in enumerate(chunks):
                results[k] = _hash_chunk(str(root), rel_paths[a:b], shas[a:b], max_image_pixels, embed_side)
                bar.update(b - a)
        else:
            with clean_pool(workers, embedding.single_threaded) as pool:
                futures = {pool.submit(_hash_chunk, str(root), rel_paths[a:b], shas[a:b], max_image_pixels,
                                       embed_side): k for k, (a, b) in enumerate(chunks)}
                for future in as_completed(futures):
                    k = futures[future]
                    results[k] = future.result()
                    bar.update(chunks[k][1] - chunks[k][0])
    return ImageHashes(
        phash=np.concatenate([r["phash"] for r in results]),
        dhash=np.concatenate([r["dhash"] for r in results]),
        pixel_sha256=[d for r in results for d in r["digest"]],
        grey=np.concatenate([r["thumb"] for r in results]),
        weight=np.concatenate([r["weight"] for r in results]),
        dihedral=np.concatenate([r["dihedral"] for r in results]),
        rings=np.concatenate([r["rings"] for r in results]),
        keypoints=[kp for r in results for kp in r["keypoints"]],
        leaf_grey=np.concatenate([r["leaf_grey"] for r in results]),
        leaf_weight=np.concatenate([r["leaf_weight"] for r in results]),
        embedding=np.concatenate([r["embedding"] for r in results]) if embed_side else None,
        features=np.concatenate([r["features"] for r in results]) if embed_side else None,
        seconds=time.perf_counter() - start, embed_seconds=sum(r["embed_seconds"] for r in results),
        stage_seconds={k: sum(r["stage_seconds"][k] for r in results) for k in STAGES},
        workers=workers)


def concat_hashes(parts: Sequence[ImageHashes]) -> ImageHashes:
    """Fingerprints of several image lists as one, in order (each image's depend on that image alone,
    so this equals hashing the lists together); seconds and CPU seconds add up."""
    if not parts:
        raise AuditInputError("concat_hashes needs at least one set of fingerprints")
    embedded = [p.embedding is not None for p in parts]
    if any(embedded) and not all(embedded):
        raise AuditInputError("fingerprints to join were computed with and without the embedding")

    def joined(name: str) -> np.ndarray | None:
        return np.concatenate([getattr(p, name) for p in parts]) if all(embedded) else None

    return ImageHashes(
        phash=np.concatenate([p.phash for p in parts]), dhash=np.concatenate([p.dhash for p in parts]),
        pixel_sha256=[d for p in parts for d in p.pixel_sha256],
        grey=np.concatenate([p.grey for p in parts]), weight=np.concatenate([p.weight for p in parts]),
        dihedral=np.concatenate([p.dihedral for p in parts]), rings=np.concatenate([p.rings for p in parts]),
        keypoints=[kp for p in parts for kp in p.keypoints],
        leaf_grey=np.concatenate([p.leaf_grey for p in parts]),
        leaf_weight=np.concatenate([p.leaf_weight for p in parts]),
        embedding=joined("embedding"), features=joined("features"),
        seconds=sum(p.seconds for p in parts), embed_seconds=sum(p.embed_seconds for p in parts),
        stage_seconds={k: sum(p.stage_seconds.get(k, 0.0) for p in parts) for k in STAGES},
        workers=max(p.workers for p in parts))
