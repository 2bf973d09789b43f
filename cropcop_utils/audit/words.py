"""The audit's local-pattern candidate source: a bag of ORB visual words.

Every image's ORB descriptors (the geometric verifier's own, :mod:`.geometry`; nothing is recomputed) are
quantised to the nearest of ``audit.words_vocabulary`` visual words, learned by k-means on a seeded sample
of the audited descriptors.  Each image becomes a tf-idf vector of its word counts (scikit-learn's
``TfidfTransformer``, sublinear counts: a vein pattern repeated along the leaf does not outvote the rest),
and proposes its ``audit.words_k`` nearest images by cosine similarity (faiss ``IndexFlatIP``, as
:mod:`.embedding`).

Why: ORB finds its keypoints over an image pyramid, so a copy zoomed out by a fifth, cropped by a third
or seen under a perspective change keeps many of its local patterns, while its pHash moves by 20+ bits
and the global ImageNet embedding ranks it behind look-alike leaves of its class.  On the default
synthetic corpus the four other sources proposed 0.72 of the planted ``scale`` pairs, 0.89 of the
``perspective`` ones and 0.94 of the ``shear`` ones; three word neighbours per image alone propose 0.94,
1.00 and 1.00 of them (the chapter's recall-by-source table shows every kind).

On PlantVillage tomato three word neighbours per image led the verifiers to trust 66 more pairs, nearly
all mosaic-virus leaves turned on the card between two shots: side by side they look like two leaves,
with the second warped onto the first by the fitted homography they are one (15 of 15 inspected).

Why some glue of our own: faiss supplies the k-means and the exact binary nearest-centroid search, and
scikit-learn the tf-idf weighting; only their chaining over the audit's keypoints is written here.
"""

from __future__ import annotations

import numpy as np

from .embedding import neighbour_pairs as cosine_neighbours

BITS = 256               # an ORB descriptor: 32 bytes
SAMPLE = 50_000          # descriptors the vocabulary is learned from (seeded; faiss would subsample anyway)
ITERATIONS = 10          # k-means iterations: the vocabulary only needs to group similar patches
SEED = 0


def vocabulary(descriptors: list[np.ndarray], words: int, seed: int = SEED) -> np.ndarray:
    """``words`` binary visual words (words, 32) uint8: k-means centres of a seeded sample of the ORB
    descriptors (their bits as 0/1 floats), each rounded back to bits."""
    import faiss

    stacked = np.concatenate([d for d in descriptors if len(d)]) if any(len(d) for d in descriptors) \
        else np.zeros((0, BITS // 8), np.uint8)
    words = min(int(words), len(stacked))
    if words < 2:
        return stacked[:words].copy()
    rng = np.random.default_rng(seed)
    sample = stacked[rng.choice(len(stacked), min(len(stacked), SAMPLE), replace=False)]
    bits = np.unpackbits(sample, axis=1).astype(np.float32)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one thread: the same centres on any machine
    try:
        kmeans = faiss.Kmeans(BITS, words, niter=ITERATIONS, seed=seed, verbose=False)
        kmeans.train(bits)
    finally:
        faiss.omp_set_num_threads(threads)
    return np.packbits(kmeans.centroids > 0.5, axis=1)


def word_counts(descriptors: list[np.ndarray], centres: np.ndarray) -> np.ndarray:
    """(N, words) float32: how many of each image's descriptors fall nearest each word (Hamming)."""
    import faiss

    counts = np.zeros((len(descriptors), len(centres)), np.float32)
    if not len(centres):
        return counts
    index = faiss.IndexBinaryFlat(BITS)
    index.add(np.ascontiguousarray(centres))
    sizes = np.array([len(d) for d in descriptors])
    if sizes.sum() == 0:
        return counts
    _, nearest = index.search(np.ascontiguousarray(np.concatenate([d for d in descriptors if len(d)])), 1)
    owner = np.repeat(np.arange(len(descriptors)), sizes)
    np.add.at(counts, (owner, nearest[:, 0]), 1.0)
    return counts


def word_vectors(counts: np.ndarray) -> np.ndarray:
    """Unit tf-idf vectors (N, words) float32 of word counts (zero rows stay zero)."""
    from sklearn.feature_extraction.text import TfidfTransformer

    if counts.size == 0:
        return counts.astype(np.float32)
    tfidf = TfidfTransformer(sublinear_tf=True).fit_transform(counts)
    return np.asarray(tfidf.toarray(), dtype=np.float32)


def neighbour_pairs(descriptors: list[np.ndarray], k: int, words: int,
                    seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) where j is among i's ``k`` nearest images by visual-word cosine or i among j's;
    images without descriptors take no part.  Returns (pairs (M, 2), cosine (M,)), sorted by (i, j)."""
    have = np.flatnonzero([len(d) > 0 for d in descriptors])
    if k < 1 or len(have) < 2:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    described = [descriptors[i] for i in have]
    vectors = word_vectors(word_counts(described, vocabulary(described, words, seed)))
    local, cosine = cosine_neighbours(vectors, k, -1.0)
    pairs = have[local] if len(local) else np.zeros((0, 2), np.int64)
    return pairs.astype(np.int64), cosine
