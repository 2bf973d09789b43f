"""Out-of-scope inputs: images that are not plants (scikit-image's photos and textures and seeded crops
of them, seeded noise), written under ``abstention/out_of_scope/``; leaves of another crop for a one-crop
corpus; and the near out-of-scope folder (this crop in the field, with conditions outside the classes,
each photo's condition from its ``labels.csv``).  Every state's prediction records of them, and the
rejection rate at the threshold (:func:`rejection_block`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.config import REPO_ROOT, RunContext
from ..core.evidence import Chapter, atomic_write_bytes, row_id, sha256_bytes
from ..core.model_states import STATE_NAMES
from ..nets.predict import logits_matrix
from .records import FOLDER
from .selective import confidence_scores, proportion

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


# --------------------------------------------------------------------------- out-of-scope images
# scikit-image's bundled samples that are not plants (grass is left out: it is one).
NON_PLANT_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "clock",
                    "hubble_deep_field", "immunohistochemistry")
NON_PLANT_TEXTURES = ("brick", "gravel", "text", "checkerboard")


def _rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    return image[..., :3].astype(np.uint8)


def _crops(image: np.ndarray, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The whole image, then ``count - 1`` seeded square crops (a third of the short side to all of it):
    more inputs of one kind from the few bundled samples.  Crops of one photo are related, so the
    interval of a kind's rejection rate is narrower than its number of source photos would give."""
    image = _rgb(image)
    h, w = image.shape[:2]
    out = [image]
    for _ in range(max(0, count - 1)):
        side = int(rng.uniform(0.33, 1.0) * min(h, w))
        top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        out.append(image[top:top + side, left:left + side])
    return out


def out_of_scope_images(noise_images: int, seed: int, side: int, photo_crops: int = 1,
                        texture_crops: int = 1) -> list[tuple[str, str, np.ndarray]]:
    """(name, kind, RGB uint8 array) of every non-plant image: sample photos and textures (each whole,
    then seeded crops of it), and seeded noise."""
    import skimage.data
    from PIL import Image
    from skimage.filters import gaussian

    def square(image: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(_rgb(image)).resize((side, side), Image.Resampling.BICUBIC))

    rng = np.random.default_rng(seed)
    images = []
    for names, kind, count in ((NON_PLANT_PHOTOS, "photo", photo_crops),
                               (NON_PLANT_TEXTURES, "texture", texture_crops)):
        for name in names:
            for j, crop in enumerate(_crops(getattr(skimage.data, name)(), count, rng)):
                images.append((name if j == 0 else f"{name}_crop{j:03d}", kind, square(crop)))
    for i in range(noise_images):
        # alternate white noise and smooth (blurred) colour noise: two kinds of input no camera takes
        noise = rng.random((side, side, 3))
        if i % 2:
            noise = gaussian(noise, sigma=side / 16, channel_axis=-1)
            noise = (noise - noise.min()) / max(np.ptp(noise), 1e-9)
        images.append((f"noise_{i:03d}", "noise", (255 * noise).astype(np.uint8)))
    return images


def write_out_of_scope(ch: Chapter, params: dict[str, Any]) -> pd.DataFrame:
    """Write the non-plant images as PNGs under ``abstention/out_of_scope/`` (registered); their rows."""
    from PIL import Image

    rows = []
    for name, kind, array in out_of_scope_images(int(params["noise_images"]), int(params["seed"]),
                                                 int(params["out_of_scope_px"]), int(params["photo_crops"]),
                                                 int(params["texture_crops"])):
        rel_path = f"{FOLDER}/out_of_scope/{name}.png"
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        atomic_write_bytes(ch.path(rel_path), buffer.getvalue())
        ch.record_output(rel_path)
        rows.append({"row_id": row_id(rel_path), "rel_path": rel_path, "label": -1, "source": kind})
    return pd.DataFrame(rows)


def other_crop_rows(ctx: RunContext, class_map: dict[str, Any], params: dict[str, Any]
                    ) -> tuple[pd.DataFrame, Path | None, str | None]:
    """A deterministic sample of another crop's leaves (rows, folder), or (empty, None, why not)."""
    folder = params.get("other_crop_data")
    if not folder:
        return _no_rows(), None, "no other-crop folder was given (profile abstention.other_crop_data)"
    crops = sorted({str(c.get("crop") or "") for c in class_map["classes"]})
    if len(crops) != 1:
        return _no_rows(), None, (f"the corpus holds {len(crops)} crops; leaves of another crop are "
                                  "out of scope only for a one-crop corpus")
    path = Path(folder).expanduser()
    root = path if path.is_absolute() else REPO_ROOT / path
    root = root.resolve()
    if not root.is_dir():
        return _no_rows(), None, f"the other-crop folder {folder} does not exist here"
    if not ctx.is_synthetic and root == Path(ctx.data).resolve():
        return _no_rows(), None, f"the other-crop folder {folder} is this run's own corpus"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    own = crops[0].lower()
    # a folder named after this corpus's crop is not another crop (PlantVillage: Crop___Condition)
    files = [f for f in files if own not in Path(f).parent.name.lower()]
    if not files:
        return _no_rows(), None, f"the other-crop folder {folder} holds no image of another crop"
    chosen = sorted(files, key=lambda f: sha256_bytes(f.encode()))[:int(params["other_crop_images"])]
    rows = pd.DataFrame({"row_id": [row_id(f) for f in chosen], "rel_path": chosen, "label": -1,
                         "source": "other_crop"})
    return rows, root, None


def near_rows(ctx: RunContext, params: dict[str, Any]) -> tuple[pd.DataFrame, Path | None, str | None]:
    """The near out-of-scope folder's photos (``abstention.near_out_of_scope_data``: photos of this crop,
    in the field, with conditions outside the classes), each row's ``source`` its label from the folder's
    ``labels.csv`` (``path,source_label``) — or (empty, None, why not)."""
    folder = params.get("near_out_of_scope_data")
    if not folder:
        return _no_rows(), None, "no near out-of-scope folder was given (abstention.near_out_of_scope_data)"
    path = Path(folder).expanduser()
    root = (path if path.is_absolute() else REPO_ROOT / path).resolve()
    if not root.is_dir():
        return _no_rows(), None, f"the near out-of-scope folder {folder} does not exist here"
    labels = root / "labels.csv"
    if not labels.is_file():
        raise FileNotFoundError(f"{labels} is missing: the near out-of-scope folder needs a labels.csv "
                                "(path,source_label) naming each photo's condition")
    table = pd.read_csv(labels)
    missing_columns = {"path", "source_label"} - set(table.columns)
    if missing_columns:
        raise ValueError(f"{labels} lacks column(s) {sorted(missing_columns)}; expected path,source_label")
    absent = [p for p in table["path"] if not (root / p).is_file()]
    if absent:
        raise FileNotFoundError(f"{labels} lists {len(absent)} file(s) not in {root}, e.g. {absent[0]}")
    table = table.sort_values("path").reset_index(drop=True)
    return pd.DataFrame({"row_id": [row_id(f"near/{p}") for p in table["path"]], "rel_path": table["path"],
                         "label": -1, "source": table["source_label"].astype(str)}), root, None


def _no_rows() -> pd.DataFrame:
    return pd.DataFrame({"row_id": pd.Series(dtype=str), "rel_path": pd.Series(dtype=str),
                         "label": pd.Series(dtype=np.int64), "source": pd.Series(dtype=str)})


def out_of_scope_records(ctx: RunContext, ch: Chapter, class_map: dict[str, Any], loaded: dict[str, Any],
                         params: dict[str, Any]) -> tuple[dict[str, pd.DataFrame], str | None]:
    """Each state's prediction records (with ``source`` and ``root``, the folder ``rel_path`` is under) of
    every out-of-scope image, and why no other-crop images were scored (None when they were)."""
    from ..nets.states import score_rows

    parts = [(write_out_of_scope(ch, params), ch.run_dir)]
    other, root, note = other_crop_rows(ctx, class_map, params)
    if root is not None:
        parts.append((other, root))
    near, near_root, _ = near_rows(ctx, params)
    if near_root is not None:
        parts.append((near, near_root))
    frames = []
    for rows, corpus_root in parts:
        records = score_rows(loaded, rows, corpus_root, ctx.section("image"), int(params["batch_size"]))
        for state, record in records.items():
            frames.append(record.assign(state=state, source=rows["source"].to_numpy(),
                                        rel_path=rows["rel_path"].to_numpy(), root=str(corpus_root)))
    frame = pd.concat(frames, ignore_index=True)
    ch.write_parquet(f"{FOLDER}/predictions_out_of_scope.parquet", frame)
    return {state: frame[frame["state"] == state].reset_index(drop=True) for state in STATE_NAMES}, note


def rejection_block(frame: pd.DataFrame, temperature: float, threshold: float, score: str,
                    level: float) -> dict[str, Any]:
    """Rejection rate at the threshold over all out-of-scope rows and per source."""
    scores = confidence_scores(logits_matrix(frame), temperature)[score] if len(frame) else np.zeros(0)
    rejected = scores < threshold
    by_source = {source: proportion(int(rejected[(frame["source"] == source).to_numpy()].sum()),
                                    int((frame["source"] == source).sum()), level, f"{source} images")
                 for source in sorted(frame["source"].unique())}
    return {"n": int(len(frame)), "rejection_rate": proportion(int(rejected.sum()), len(frame), level,
                                                               "out-of-scope images"),
            "by_source": by_source, "scores": scores}
