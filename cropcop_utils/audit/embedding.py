"""The audit's learned candidate source: nearest neighbours in a pretrained embedding.

Each image's global-pooled features from the ImageNet EfficientNet-Lite0 (the packaged TensorFlow-trained
weights on timm's ``tf_efficientnet_lite0``, built by :func:`cropcop_utils.pretrained.create_pretrained`,
inputs normalised as those weights expect; nothing is downloaded) are L2-normalised, and every
image proposes its ``audit.embedding_k`` nearest neighbours by cosine similarity (scikit-learn's exact
``NearestNeighbors``), kept when the similarity reaches ``audit.embedding_min_cosine``.  Why a learned
embedding: a crop of a third of the picture, a 40-degree turn, a perspective change or a re-shot under
other light moves a perceptual hash by 20-35 bits, but barely moves what an ImageNet network sees.
"""

from __future__ import annotations

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
        from .. import pretrained

        net, _ = pretrained.create_pretrained(ARCH, 0)
        _MODEL = net.eval()
    return _MODEL


def weights_description() -> dict:
    """Where the embedding's weights come from (recorded in the chapter's evidence)."""
    from .. import pretrained

    return pretrained.locate(ARCH).as_dict()


def embed_squares(squares: np.ndarray) -> np.ndarray:
    """Unit-length pooled features (N, DIM) float32 of RGB squares (N, S, S, 3) uint8."""
    import torch

    from ..pretrained import INPUT_MEAN, INPUT_STD

    net = model()
    mean = torch.tensor(INPUT_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(INPUT_STD).view(1, 3, 1, 1)
    parts = []
    with torch.inference_mode():
        for k in range(0, len(squares), BATCH):
            x = torch.from_numpy(np.ascontiguousarray(squares[k:k + BATCH])).permute(0, 3, 1, 2).float() / 255
            parts.append(net((x - mean) / std).numpy())
    features = np.concatenate(parts) if parts else np.zeros((0, DIM), np.float32)
    norm = np.linalg.norm(features, axis=1, keepdims=True)
    return (features / np.maximum(norm, 1e-12)).astype(np.float32)


def neighbour_pairs(features: np.ndarray, k: int, min_cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) where j is among i's ``k`` nearest neighbours or i among j's, with cosine similarity
    of at least ``min_cosine``; returns (pairs (M, 2), cosine (M,)), sorted by (i, j)."""
    from sklearn.neighbors import NearestNeighbors

    n = len(features)
    if n < 2 or k < 1:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    k = min(k, n - 1)
    search = NearestNeighbors(n_neighbors=k + 1, metric="cosine", algorithm="brute").fit(features)
    distance, index = search.kneighbors(features)
    rows = np.repeat(np.arange(n), k + 1)
    cols, cosine = index.ravel(), 1 - distance.ravel()
    keep = (rows != cols) & (cosine >= min_cosine)
    a, b = np.minimum(rows, cols)[keep], np.maximum(rows, cols)[keep]
    pairs, first = np.unique(np.stack([a, b], axis=1), axis=0, return_index=True)
    return pairs.astype(np.int64), cosine[keep][first].astype(np.float32)
