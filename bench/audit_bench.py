"""Audit benchmark: audit throughput against plain decoding, and pairing a million hashes.

    .venv/bin/python bench/audit_bench.py [--data PATH] [--limit 3000] [--workers 2] [--hashes 1000000]

1. On the same files (default: the PlantVillage tomato folder when present, else a generated synthetic
   corpus), images/s of the whole audit (hashing, candidate search, both verifiers:
   ``audit.audit_corpus``) and of hashing alone (every per-image fingerprint, keypoints and embedding
   included, and the same pass split by stage: read + decode, the hashes proper, the verifiers'
   inputs, the embedding's input), against images/s of plain decoding on the same process pool: full
   decoding under the loading contract (``imaging.open_rgb``) and JPEG draft-mode decoding (one read
   per file, the DCT scaled down to about the audit's working side).  The embedding's images per CPU
   second and its share of the audit's time are printed too.
2. The geometric verifier on (up to ``--geometry-pairs``) pairs the audit asked it about, one process:
   pairs/s of the audit's estimators (USAC screen, classic RANSAC refit from ``geometry.SCREEN_INLIERS``
   inliers) against classic RANSAC on every pair, and how many pairs the two leave with different
   inlier counts at or above the screen level.
3. The time to find every pair within the chosen pHash radius (the profile's ``audit.phash_radius``)
   among ``--hashes`` random 64-bit hashes with ``--planted`` near pairs planted at distances
   1..radius, and a check that every planted pair is found.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cropcop_utils import audit
from cropcop_utils.audit import geometry, hashing, pairs  # noqa: E402
from cropcop_utils.core import config, imaging  # noqa: E402
from cropcop_utils.core.evidence import row_id, sha256_file  # noqa: E402

TOMATO = Path(__file__).resolve().parents[2] / "shared" / "data" / "plantvillage-tomato"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}


def _decode_chunk(paths: list[str]) -> int:
    for path in paths:
        imaging.open_rgb(path)
    return len(paths)


def _draft_chunk(paths: list[str]) -> int:
    """One read per file, then JPEG draft decoding (the DCT scaled to >= the audit's working side)."""
    from PIL import Image

    side = hashing.HASH_SIDE_LIMIT * 2
    for path in paths:
        with Image.open(io.BytesIO(Path(path).read_bytes())) as image:
            image.draft("RGB", (side, side))
            image.convert("RGB")
    return len(paths)


def decode_rate(root: Path, rel_paths: list[str], workers: int, draft: bool = False) -> float:
    """Images/s of plain decoding on the same kind of process pool the audit uses."""
    paths = [str(root / r) for r in rel_paths]
    size = max(16, len(paths) // (workers * 8))
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = sum(pool.map(_draft_chunk if draft else _decode_chunk, chunks))
    return done / (time.perf_counter() - start)


def corpus_files(root: Path, limit: int) -> list[str]:
    """Image files under ``root`` (relative POSIX paths), ``limit`` of them spread evenly over the list."""
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    if limit and len(files) > limit:
        files = [files[i] for i in np.linspace(0, len(files) - 1, limit).round().astype(int)]
    return files


def manifest_rows(root: Path, rel_paths: list[str]) -> pd.DataFrame:
    """The manifest columns the audit reads (the corpus chapter computes these; not timed here)."""
    parts = [r.split("/") for r in rel_paths]
    split = [p[0] if len(p) == 3 and p[0] in ("train", "val", "test") else "none" for p in parts]
    return pd.DataFrame({"row_id": [row_id(r) for r in rel_paths], "rel_path": rel_paths,
                         "class_name": [p[-2] for p in parts], "inherited_split": split,
                         "sha256": [sha256_file(root / r) for r in rel_paths]})


def planted_codes(n: int, planted: int, radius: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random 64-bit hashes; ``planted`` pairs (i, j) rewritten to lie 1..radius bits apart."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    ends = rng.choice(n, size=2 * planted, replace=False).reshape(-1, 2)
    for (i, j), weight in zip(ends, rng.integers(1, radius + 1, planted), strict=True):
        bits = rng.choice(64, size=weight, replace=False).astype(np.uint64)
        codes[j] = codes[i] ^ np.bitwise_or.reduce(np.uint64(1) << bits)
    return codes, np.sort(ends, axis=1)


def geometry_rates(result: audit.AuditResult, limit: int) -> None:
    """Screen + refit against classic RANSAC alone, on the pairs the audit sent to geometry."""
    asked = result.candidates.pairs[result.candidates.geometry_done][:limit]
    points = result.hashes.keypoints
    start = time.perf_counter()
    screened = geometry.verify_pairs(points, asked)
    screened_rate = len(asked) / (time.perf_counter() - start)
    saved = geometry.SCREEN, geometry.SCREEN_INLIERS
    geometry.SCREEN, geometry.SCREEN_INLIERS = geometry.CONFIRM, 2**31  # classic RANSAC on every pair
    try:
        start = time.perf_counter()
        classic = geometry.verify_pairs(points, asked)
        classic_rate = len(asked) / (time.perf_counter() - start)
    finally:
        geometry.SCREEN, geometry.SCREEN_INLIERS = saved
    level = geometry.SCREEN_INLIERS
    differ = int(((screened.inliers >= level) | (classic.inliers >= level)).sum()
                 - ((screened.inliers == classic.inliers) & (classic.inliers >= level)).sum())
    print(f"geometry on {len(asked):,} asked pairs, one process: {screened_rate:,.0f} pairs/s "
          f"({geometry.SCREEN} screen, {geometry.CONFIRM} refit) vs {classic_rate:,.0f} pairs/s "
          f"({geometry.CONFIRM} on every pair): {screened_rate / classic_rate:.1f}x; pairs with "
          f">= {level} inliers under either and not the same count: {differ}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="image folder (default: tomato folder, else synthetic)")
    parser.add_argument("--limit", type=int, default=3000, help="images to audit (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile", default="default", help="profile whose audit section is used")
    parser.add_argument("--hashes", type=int, default=1_000_000)
    parser.add_argument("--planted", type=int, default=2_000)
    parser.add_argument("--geometry-pairs", type=int, default=3_000)
    args = parser.parse_args(argv)
    cfg = {**config.load_profile(args.profile).get("audit", {}), "workers": args.workers}
    radius = int(audit.settings(cfg)["phash_radius"])

    with tempfile.TemporaryDirectory(prefix="audit_bench_") as scratch:
        if args.data:
            root = Path(args.data)
        elif TOMATO.is_dir():
            root = TOMATO
        else:
            from cropcop_utils import synthetic

            print("tomato folder not found: generating the smoke synthetic corpus", flush=True)
            params = config.load_profile("smoke")["synthetic"]
            root = synthetic.generate(Path(scratch) / "synthetic", params).parent / "corpus"
        files = corpus_files(root, args.limit)
        rows = manifest_rows(root, files)
        print(f"corpus: {root} ({len(files):,} images, {args.workers} workers)", flush=True)

        decode = decode_rate(root, files, args.workers)
        draft = decode_rate(root, files, args.workers, draft=True)
        start = time.perf_counter()
        result = audit.audit_corpus(rows, root, cfg, args.workers, progress=False)
        seconds = time.perf_counter() - start
        whole = len(files) / seconds
        hashed = len(files) / result.hashes.seconds
        embed = result.hashes.embed_seconds
        print(f"plain decode (imaging.open_rgb):   {decode:8.1f} images/s")
        print(f"JPEG draft decode, one read:       {draft:8.1f} images/s")
        print(f"audit hashing (all fingerprints):  {hashed:8.1f} images/s  ({hashed / decode:.2f}x full "
              f"decode, {hashed / draft:.2f}x draft decode)")
        # the same pass split by stage (CPU seconds summed over workers, as images/s on that many workers)
        for stage, cpu in result.hashes.stage_seconds.items():
            rate = len(files) * args.workers / cpu if cpu else float("inf")
            print(f"  stage {stage:<16s} {rate:10.1f} images/s  ({rate / decode:.2f}x full decode, "
                  f"{rate / draft:.2f}x draft decode)")
        print(f"whole audit (hash+search+verify):  {whole:8.1f} images/s  ({whole / decode:.2f}x decode; "
              f"{int(result.candidates.scored.sum()):,} candidates verified)")
        if embed:
            print(f"embedding: {len(files) / embed:.1f} images per CPU second; {embed:.1f} CPU s = "
                  f"{embed / (seconds * args.workers):.1%} of the audit's {args.workers}-worker time "
                  f"({seconds:.1f} s wall)")
        print("audit stages (s):", {k: round(v, 1) for k, v in result.candidates.timings.items()})
        geometry_rates(result, args.geometry_pairs)

    codes, planted = planted_codes(args.hashes, args.planted, radius)
    plan = pairs.best_plan(len(codes), radius)
    pairs.mih_pairs(codes[:1000], radius, plan)  # compile the numba passes outside the timing
    start = time.perf_counter()
    found_pairs = pairs.radius_pairs(codes, radius, workers=args.workers)
    seconds = time.perf_counter() - start
    found = set(map(tuple, found_pairs[:, :2].tolist()))
    missing = [tuple(p) for p in planted.tolist() if tuple(p) not in found]
    print(f"pairing {len(codes):,} hashes at pHash radius {radius}: {seconds:.1f} s on {args.workers} "
          f"workers (multi-index hashing, chunks {plan.widths}, flip budgets {plan.budgets}); "
          f"{len(found_pairs):,} pairs, "
          f"planted pairs found: {args.planted - len(missing):,}/{args.planted:,}")
    if missing:
        print(f"MISSING planted pairs, e.g. {missing[:5]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
