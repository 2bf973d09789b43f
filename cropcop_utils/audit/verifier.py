"""The audit's second opinion: is a hash-close pair really the same picture (or the same specimen)?

Perceptual hashes propose pairs; this module confirms or refutes them with a registered, subject-weighted
SSIM on small greyscale thumbnails:

1. :func:`thumbnail` — each image becomes a ``THUMB``×``THUMB`` greyscale thumbnail (squashed, so a crop
   that was resized back and one that was not look alike) plus a *subject weight* map: how far each
   pixel's colour is from the backdrop colour (the median of a band just inside the image edge), zero
   on an outer ring.  Why: unrelated photos from one bench share backdrop, frame and vignette; SSIM over
   the whole frame rates two different leaves on one backdrop as "similar" (0.85-0.9 in our synthetic
   calibration), SSIM over the subject does not.
2. Registration — re-shots and crops are the same subject rotated a few degrees, scaled a few percent
   and shifted.  For each pair, the second thumbnail is warped by each rotation in ``ANGLES`` and each
   scale in ``SCALES`` (a cross, not a full grid: re-shots rotate, crops zoom), and phase correlation
   (the cross-power spectrum peak, as in ``skimage.registration.phase_cross_correlation``) gives the
   best translation for each; the warp with the highest correlation peak wins.
3. Score — SSIM (Wang et al. 2004; 7×7 uniform window, K1=0.01, K2=0.03, sample covariance: the same
   definition as ``skimage.metrics.structural_similarity``) between the first thumbnail and the
   registered second one, averaged with the subject weights of both; the unregistered score is
   computed too and the higher one is kept (registration can only help a true match).

Why not skimage per pair: the search needs 7 warps and FFTs per pair; batching thousands of pairs
through ``torch.nn.functional.grid_sample`` and ``torch.fft`` is ~50x faster than a Python loop over
``phase_cross_correlation`` + ``structural_similarity``, and a test checks the SSIM against skimage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..core.config import progress_wanted

THUMB = 32                      # thumbnail side: small enough that sensor noise averages out
EDGE_RING = 0.08                # outer ring without weight (frames, vignettes, scanner edges)
BACKDROP_BAND = 0.25            # backdrop colour: median of the band between EDGE_RING and this
SUBJECT_RAMP = (20.0, 50.0)     # colour distance (0-441) mapped linearly to subject weight 0..1
SUBJECT_FLOOR = 0.05            # backdrop keeps a little weight: a blank pair still gets a score
ANGLES = (-8.0, -4.0, 0.0, 4.0, 8.0)  # tried at scale 1 (re-shots turn the leaf a few degrees)
SCALES = (0.94, 1.0, 1.06)            # tried at angle 0 (crops and resizes zoom a few percent)
SSIM_WINDOW = 7
DEFAULT_BATCH = 512


class VerifierInputError(ValueError):
    """Thumbnail arrays or pair indices have the wrong shape or refer to missing rows."""


# --------------------------------------------------------------------------- per image
def thumbnail(rgb: Image.Image, side: int = THUMB) -> tuple[np.ndarray, np.ndarray]:
    """Greyscale thumbnail and subject-weight map (both ``uint8`` side×side) of an upright RGB image."""
    small = rgb.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
    colour = np.asarray(small, dtype=np.float32)
    grey = np.asarray(small.convert("L"), dtype=np.uint8)
    return grey, subject_weight(colour)


def _ring_masks(side: int) -> tuple[np.ndarray, np.ndarray]:
    ring = max(1, round(EDGE_RING * side))
    band = max(ring + 1, round(BACKDROP_BAND * side))
    inner = np.zeros((side, side), dtype=bool)
    inner[ring:side - ring, ring:side - ring] = True
    core = np.zeros((side, side), dtype=bool)
    core[band:side - band, band:side - band] = True
    return inner, inner & ~core


def subject_weight(colour: np.ndarray) -> np.ndarray:
    """Per-pixel subject weight (``uint8``, 255 = surely subject) of an (H, W, 3) float RGB array."""
    side = colour.shape[0]
    inner, band = _ring_masks(side)
    backdrop = np.median(colour[band], axis=0)
    distance = np.sqrt(((colour - backdrop) ** 2).sum(axis=-1))
    low, high = SUBJECT_RAMP
    weight = np.clip((distance - low) / (high - low), 0.0, 1.0)
    weight = np.maximum(weight, SUBJECT_FLOOR) * inner
    return np.round(weight * 255).astype(np.uint8)


# --------------------------------------------------------------------------- per pair
def _box(x, win: int):
    """Mean over every win×win window (valid positions only) via cumulative sums: O(1) per pixel."""
    import torch.nn.functional as F

    c = F.pad(x.cumsum(-1), (1, 0))
    x = c[..., win:] - c[..., :-win]
    c = F.pad(x.cumsum(-2), (0, 0, 1, 0))
    return (c[..., win:, :] - c[..., :-win, :]) / (win * win)


def ssim_map(a, b, win: int = SSIM_WINDOW, data_range: float = 255.0):
    """SSIM map over valid window positions for batches of images (…, H, W), skimage's definition."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    n = win * win
    cov = n / (n - 1)  # sample covariance, as skimage's default
    ua, ub = _box(a, win), _box(b, win)
    va = cov * (_box(a * a, win) - ua * ua)
    vb = cov * (_box(b * b, win) - ub * ub)
    vab = cov * (_box(a * b, win) - ua * ub)
    return ((2 * ua * ub + c1) * (2 * vab + c2)) / ((ua * ua + ub * ub + c1) * (va + vb + c2))


def _theta(angle_deg, scale, tx, ty):
    """Affine matrices (output → input, normalised coordinates) for ``F.affine_grid``."""
    import torch

    rad = torch.deg2rad(angle_deg)
    c, s = torch.cos(rad) / scale, torch.sin(rad) / scale
    return torch.stack([torch.stack([c, -s, tx], -1), torch.stack([s, c, ty], -1)], -2)


@dataclass
class PairScores:
    """Verifier output for a batch of pairs (arrays of equal length)."""

    score: np.ndarray       # max(registered, unregistered) subject-weighted SSIM, in [-1, 1]
    registered: np.ndarray
    plain: np.ndarray
    angle: np.ndarray       # degrees of the winning warp
    scale: np.ndarray
    shift_y: np.ndarray     # pixels of the thumbnail
    shift_x: np.ndarray


class Verifier:
    """Registered subject-weighted SSIM for batches of thumbnail pairs (see module docstring)."""

    def __init__(self, angles: Sequence[float] = ANGLES, scales: Sequence[float] = SCALES,
                 side: int = THUMB, window: int = SSIM_WINDOW) -> None:
        import torch
        import torch.nn.functional as F

        self.side, self.window = side, window
        grid = [(float(a), 1.0) for a in angles] + [(0.0, float(s)) for s in scales if s != 1.0]
        if (0.0, 1.0) not in grid:
            grid.append((0.0, 1.0))
        self.angles = torch.tensor([g[0] for g in grid], dtype=torch.float32)
        self.scales = torch.tensor([g[1] for g in grid], dtype=torch.float32)
        zeros = torch.zeros(len(grid))
        self.grid = F.affine_grid(_theta(self.angles, self.scales, zeros, zeros),
                                  (len(grid), 1, side, side), align_corners=False)
        w = torch.hann_window(side, periodic=False)
        self.hann = w[:, None] * w[None, :]

    def _whiten(self, x):
        x = x - (x * self.hann).sum((-1, -2), keepdim=True) / self.hann.sum()
        return x * self.hann

    def score(self, grey_a: np.ndarray, grey_b: np.ndarray, weight_a: np.ndarray,
              weight_b: np.ndarray) -> PairScores:
        """Score pairs (a[k], b[k]): grey and weight arrays of shape (B, side, side), uint8."""
        import torch
        import torch.nn.functional as F

        n, side, t = len(grey_a), self.side, len(self.angles)
        if n == 0:
            empty = np.zeros(0, dtype=np.float32)
            return PairScores(empty, empty, empty, empty, empty, empty, empty)
        a = torch.from_numpy(np.asarray(grey_a, dtype=np.float32))
        b = torch.from_numpy(np.asarray(grey_b, dtype=np.float32))
        wa = torch.from_numpy(np.asarray(weight_a, dtype=np.float32) / 255.0)
        wb = torch.from_numpy(np.asarray(weight_b, dtype=np.float32) / 255.0)

        # Every warp of every b at once: the pairs ride in the channel axis, so one grid serves all.
        warped = F.grid_sample(b[None].expand(t, n, side, side), self.grid, mode="bilinear",
                               padding_mode="border", align_corners=False)
        # Normalising each spectrum is the same as normalising their product, and cheaper.
        fa = torch.fft.rfft2(self._whiten(a))
        fb = torch.fft.rfft2(self._whiten(warped))
        cross = (fa / (fa.abs() + 1e-6))[None] * torch.conj(fb / (fb.abs() + 1e-6))
        surface = torch.fft.irfft2(cross, s=(side, side)).reshape(t, n, -1)
        peak, where = surface.max(-1)
        best = peak.argmax(0)
        loc = where[best, torch.arange(n)]
        dy, dx = loc // side, loc % side
        dy = torch.where(dy > side // 2, dy - side, dy)
        dx = torch.where(dx > side // 2, dx - side, dx)

        # b registered = warp(b) shifted by (dy, dx): sample b at M (x - d) in normalised units.
        angle, scale = self.angles[best], self.scales[best]
        zeros = torch.zeros(n)
        rot = _theta(angle, scale, zeros, zeros)[:, :, :2]
        shift = torch.stack([2 * dx.float() / side, 2 * dy.float() / side], -1)
        theta = torch.cat([rot, -(rot @ shift[:, :, None])], -1)
        grid = F.affine_grid(theta, (n, 1, side, side), align_corners=False)
        b_reg = F.grid_sample(b[:, None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        wb_reg = F.grid_sample(wb[:, None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        inside = F.grid_sample(torch.ones(n, 1, side, side), grid, mode="bilinear", padding_mode="zeros",
                               align_corners=False)[:, 0] > 0.999

        registered = self._pooled(a, b_reg[:, 0], wa, wb_reg[:, 0], inside)
        plain = self._pooled(a, b, wa, wb, torch.ones_like(inside))
        return PairScores(torch.maximum(registered, plain).numpy(), registered.numpy(), plain.numpy(),
                          angle.numpy(), scale.numpy(), dy.numpy().astype(np.float32),
                          dx.numpy().astype(np.float32))

    def _pooled(self, a, b, wa, wb, inside):
        """SSIM averaged with the subject weight of either image, over windows fully inside b."""
        return _pooled(a, b, wa, wb, inside, self.window)


def weighted_ssim(grey_a: np.ndarray, grey_b: np.ndarray, weight_a: np.ndarray, weight_b: np.ndarray,
                  inside: np.ndarray, window: int = SSIM_WINDOW) -> np.ndarray:
    """Subject-weighted SSIM of already aligned pairs (B, side, side): the verifier's pooling, over the
    windows lying wholly where ``inside`` (B, side, side, 0/1) says b has pixels."""
    import torch

    if len(grey_a) == 0:
        return np.zeros(0, dtype=np.float32)
    a, b, wa, wb = (torch.from_numpy(np.asarray(x, dtype=np.float32)) for x in (grey_a, grey_b, weight_a,
                                                                                weight_b))
    mask = torch.from_numpy(np.asarray(inside, dtype=np.float32)) > 0.999
    return _pooled(a, b, wa / 255.0, wb / 255.0, mask, window).numpy()


def _pooled(a, b, wa, wb, inside, win: int):
    import torch

    ssim = ssim_map(a, b, win)
    weight = _box(torch.maximum(wa, wb), win) * (_box(inside.float(), win) > 0.999)
    return (ssim * weight).sum((-1, -2)) / weight.sum((-1, -2)).clamp_min(1e-6)


_WORKER_VERIFIER: Verifier | None = None


def _score_task(grey_a: np.ndarray, grey_b: np.ndarray, weight_a: np.ndarray, weight_b: np.ndarray,
                batch: int) -> PairScores:
    """One pool task: single-threaded torch (the pool supplies the parallelism), batches of pairs."""
    import torch

    global _WORKER_VERIFIER
    torch.set_num_threads(1)
    if _WORKER_VERIFIER is None or _WORKER_VERIFIER.side != grey_a.shape[1]:
        _WORKER_VERIFIER = Verifier(side=grey_a.shape[1])
    parts = [_WORKER_VERIFIER.score(grey_a[k:k + batch], grey_b[k:k + batch], weight_a[k:k + batch],
                                    weight_b[k:k + batch]) for k in range(0, len(grey_a), batch)]
    return _concat(parts)


def _concat(parts: list[PairScores]) -> PairScores:
    return PairScores(*(np.concatenate([getattr(p, f) for p in parts]).astype(np.float32)
                        for f in PairScores.__dataclass_fields__))


def verify_pairs(
    grey: np.ndarray,
    weight: np.ndarray,
    pairs: np.ndarray,
    batch: int = DEFAULT_BATCH,
    progress: bool = False,
    workers: int = 1,
) -> PairScores:
    """Score every pair (rows of ``pairs``: indices into ``grey`` / ``weight``).

    ``workers > 1`` spreads tasks of a few batches over a process pool; each task carries only the
    thumbnails of its pairs.  Results are in pair order either way.
    """
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    grey = np.asarray(grey)
    weight = np.asarray(weight)
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if grey.ndim != 3 or grey.shape != weight.shape or grey.shape[1] != grey.shape[2]:
        raise VerifierInputError(f"thumbnails must be (N, side, side) with matching weights; got "
                                 f"{grey.shape} and {weight.shape}")
    if len(pairs) and (pairs.min() < 0 or pairs.max() >= len(grey)):
        raise VerifierInputError(f"pair indices must lie in 0..{len(grey) - 1}")
    if batch < 1:
        raise VerifierInputError(f"batch must be positive, got {batch}")
    if len(pairs) == 0:
        empty = np.zeros(0, dtype=np.float32)
        return PairScores(empty, empty, empty, empty, empty, empty, empty)
    task = batch * 4
    spans = [(k, min(len(pairs), k + task)) for k in range(0, len(pairs), task)]

    def arguments(a: int, b: int) -> tuple[np.ndarray, ...]:
        i, j = pairs[a:b, 0], pairs[a:b, 1]
        return grey[i], grey[j], weight[i], weight[j]

    bar = tqdm(total=len(pairs), desc="verifying pairs", unit="pair", disable=not progress_wanted(progress),
               mininterval=1.0)
    with bar:
        if workers <= 1 or len(spans) == 1:
            import torch

            threads = torch.get_num_threads()
            try:
                results = []
                for a, b in spans:
                    results.append(_score_task(*arguments(a, b), batch))
                    bar.update(b - a)
            finally:
                torch.set_num_threads(threads)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(_score_task, *arguments(a, b), batch) for a, b in spans]
                results = []
                for (a, b), future in zip(spans, futures, strict=True):
                    results.append(future.result())
                    bar.update(b - a)
    return _concat(results)
