"""The acquisition cues: what predicts the class without looking at the plant.

Four cue sets (:data:`CUE_SETS`): the file metadata frame (manifest columns plus the JPEG encoder settings
read from the file header, with the IJG quality estimate), a tiny low-frequency thumbnail, the colour of
the outer border strips and eight corner pixels.  The pixel cues are computed per image in the pixel pass
of :mod:`.features`; the metadata frame is joined from the corpus manifest here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd
from PIL import Image, JpegImagePlugin

from .errors import ProbeInputError

CUE_SETS = ("metadata", "thumbnail", "border", "corners")
CUE_DESCRIPTIONS = {
    "metadata": "file metadata: EXIF make/model, format, mode, bytes, width, height, JPEG quality "
                "(IJG estimate from the quantisation tables), subsampling, progressive",
    "thumbnail": "low-frequency image: box-filtered {thumbnail_px}×{thumbnail_px} RGB thumbnail",
    "border": "border strips: mean RGB of {border_segments} pieces of each {border_px}-px outer strip "
              "+ per-strip RGB spread",
    "corners": "8 corner pixels: RGB of the corner pixel and the pixel {corner_inset} px inward along "
               "the diagonal, at each of the 4 corners",
}

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


# --------------------------------------------------------------------------- metadata design matrix
META_CATEGORICAL = ("exif_make", "exif_model", "format", "mode")
META_NUMERIC = ("bytes", "width", "height")
MISSING = "<none>"


def metadata_frame(rows: pd.DataFrame, manifest: pd.DataFrame, jpeg: np.ndarray) -> pd.DataFrame:
    """File-metadata features of every row: manifest columns joined on row_id, plus JPEG settings."""
    needed = {"row_id", *META_CATEGORICAL, *META_NUMERIC}
    missing = needed - set(manifest.columns)
    if missing:
        raise ProbeInputError(f"corpus/manifest.parquet lacks {sorted(missing)}; rerun chapter 'corpus'")
    meta = rows[["row_id"]].merge(manifest.drop_duplicates("row_id")[sorted(needed)], on="row_id", how="left",
                                  validate="one_to_one")
    if meta[list(META_NUMERIC)].isna().any().any():
        lost = meta.loc[meta[list(META_NUMERIC)].isna().any(axis=1), "row_id"].head(3).tolist()
        raise ProbeInputError(f"split rows without manifest metadata, e.g. row_id {lost}; the split and the "
                              "manifest are from different runs — rerun chapters corpus → split")
    frame = pd.DataFrame({col: meta[col].fillna(MISSING).astype(str) for col in META_CATEGORICAL})
    for col in META_NUMERIC:
        frame[col] = meta[col].astype(np.float64)
    for i, col in enumerate(JPEG_COLUMNS):
        frame[f"jpeg_{col}"] = jpeg[:, i]
    return frame
