"""The audit's learned candidate source: nearest neighbours in a pretrained embedding.

Each image's global-pooled features from the ImageNet EfficientNet-Lite0 (the packaged TensorFlow-trained
weights on timm's ``tf_efficientnet_lite0``, built by :func:`cropcop_utils.nets.pretrained.create_pretrained`,
inputs normalised as those weights expect; nothing is downloaded) are L2-normalised, and every
image proposes its ``audit.embedding_k`` nearest neighbours by cosine similarity (faiss's exact
inner-product index, ``IndexFlatIP``), kept when the similarity reaches ``audit.embedding_min_cosine``.
Why a learned embedding: a crop of a third of the picture, a 40-degree turn, a perspective change or a
re-shot under other light moves a perceptual hash by 20-35 bits, but barely moves what an ImageNet
network sees.
"""

from __future__ import annotations

import os

import numpy as np

ARCH = "tf_efficientnet_lite0"
DIM = 1280                      # Lite0's pooled feature width
BATCH = 64

_MODEL = None


def single_threaded() -> None:
    """Pool initialiser: one torch thread per worker (the pool supplies the parallelism)."""
    import torch

    torch.set_num_threads(1)


def model():
    """The ImageNet Lite0 with its head removed (pooled features), loaded once per process."""
    global _MODEL
    if _MODEL is None:
        from ..nets import pretrained

        net, _ = pretrained.create_pretrained(ARCH, 0)
        _MODEL = net.eval()
    return _MODEL


def weights_description() -> dict:
    """Where the embedding's weights come from (recorded in the chapter's evidence)."""
    from ..nets import pretrained

    return pretrained.locate(ARCH).as_dict()


def pooled_features(squares: np.ndarray) -> np.ndarray:
    """Global-pooled features (N, DIM) float32 of RGB squares (N, S, S, 3) uint8, as the network gives them.

    The inputs are normalised exactly as :func:`cropcop_utils.core.imaging.to_tensor` does with the weights'
    mean and std, so on the loading contract's squares these are the features chapter 4's frozen probe
    would compute (and may reuse: ``audit/embedding.npz``)."""
    import torch

    from ..nets.pretrained import INPUT_MEAN, INPUT_STD

    net = model()
    mean = torch.tensor(INPUT_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(INPUT_STD).view(1, 3, 1, 1)
    parts = []
    with torch.inference_mode():
        for k in range(0, len(squares), BATCH):
            x = torch.from_numpy(np.ascontiguousarray(squares[k:k + BATCH])).permute(0, 3, 1, 2).float() / 255
            parts.append(net((x - mean) / std).numpy())
    return (np.concatenate(parts) if parts else np.zeros((0, DIM), np.float32)).astype(np.float32)


def unit(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine similarity becomes a dot product)."""
    norm = np.linalg.norm(features, axis=1, keepdims=True)
    return (features / np.maximum(norm, 1e-12)).astype(np.float32)


def embed_squares(squares: np.ndarray) -> np.ndarray:
    """Unit-length pooled features (N, DIM) float32 of RGB squares (N, S, S, 3) uint8."""
    return unit(pooled_features(squares))


def neighbour_pairs(features: np.ndarray, k: int, min_cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) where j is among i's ``k`` nearest neighbours or i among j's, with cosine similarity
    of at least ``min_cosine``; returns (pairs (M, 2), cosine (M,)), sorted by (i, j)."""
    import faiss  # exact search as one BLAS product: 5x scikit-learn's brute cosine on 11,000 x 1280

    n = len(features)
    if n < 2 or k < 1:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    k = min(k, n - 1)
    features = unit(features)
    search = faiss.IndexFlatIP(features.shape[1])
    search.add(features)
    similarity, neighbour = search.search(features, k + 1)
    rows = np.repeat(np.arange(n), k + 1)
    cols, cosine = neighbour.ravel(), similarity.ravel()
    keep = (rows != cols) & (cosine >= min_cosine)
    a, b = np.minimum(rows, cols)[keep], np.maximum(rows, cols)[keep]
    pairs, first = np.unique(np.stack([a, b], axis=1), axis=0, return_index=True)
    return pairs.astype(np.int64), cosine[keep][first].astype(np.float32)


# --------------------------------------------------------------------------- reuse by chapter 4
FEATURES_FILE = "audit/embedding.npz"


def features_bytes(row_ids: list[str], features: np.ndarray, side: int) -> bytes:
    """``audit/embedding.npz``: every audited row's pooled features with what they were computed from
    (architecture, weights file SHA-256, the loading contract's side, mean and std)."""
    import io

    from ..nets.pretrained import INPUT_MEAN, INPUT_STD

    weights = weights_description()
    buffer = io.BytesIO()
    np.savez(buffer, row_ids=np.asarray(row_ids, dtype=str), features=features.astype(np.float32),
             side=np.int64(side), arch=np.asarray(ARCH), weights_sha256=np.asarray(weights["sha256"]),
             mean=np.asarray(INPUT_MEAN, np.float64), std=np.asarray(INPUT_STD, np.float64))
    return buffer.getvalue()


def reusable_features(path: str | os.PathLike, arch: str, weights_sha256: str, side: int,
                      mean: list[float], std: list[float], row_ids: np.ndarray
                      ) -> tuple[np.ndarray | None, str]:
    """The rows' features from ``audit/embedding.npz`` when they are what the caller would compute (same
    architecture, weights file, contract side, mean and std; every row present), else (None, why not)."""
    with np.load(path, allow_pickle=False) as data:
        recorded = {"architecture": str(data["arch"]), "weights": str(data["weights_sha256"]),
                    "side": int(data["side"]), "mean": data["mean"].tolist(), "std": data["std"].tolist()}
        wanted = {"architecture": arch, "weights": weights_sha256, "side": int(side),
                  "mean": [float(v) for v in mean], "std": [float(v) for v in std]}
        differ = [key for key in wanted if recorded[key] != wanted[key]]
        if differ:
            return None, f"the audit's embedding differs in {', '.join(differ)}"
        index = {row: k for k, row in enumerate(data["row_ids"].astype(str).tolist())}
        missing = [row for row in row_ids.astype(str).tolist() if row not in index]
        if missing:
            return None, f"{len(missing)} row(s) were not embedded by the audit"
        return data["features"][[index[row] for row in row_ids.astype(str).tolist()]], "reused"
