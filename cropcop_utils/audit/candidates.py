"""Near candidates: who proposes a pair, capped per image, and what the two verifiers say.

Five sources propose pairs between distinct pixel contents (one representative per pixel group):

* ``phash`` — every pair within ``audit.table_radius`` pHash bits (:mod:`.pairs`), capped at
  ``audit.max_neighbours`` nearest partners per image; those within ``audit.phash_radius`` are proposed,
  the rest are scored only for the threshold table.
* ``dihedral`` — pairs within ``audit.dihedral_radius`` bits between one image's pHash and any of the
  eight dihedral pHashes of the other (:func:`.hashing.dihedral_phashes`): flips and quarter turns,
  capped the same way.  The winning symmetry is recorded and undone before the SSIM verifier looks.
* ``embedding`` — each image's ``audit.embedding_k`` nearest neighbours in the ImageNet EfficientNet-Lite0
  embedding with cosine similarity of at least ``audit.embedding_min_cosine`` (:mod:`.embedding`).
* ``rings`` — each image's ``audit.rings_k`` nearest neighbours by the correlation of ring spectra
  (:func:`.hashing.ring_spectrum`, unchanged by a turn of any angle about the centre), at least
  ``audit.rings_min_correlation``: the arbitrary turns that neither hash nor embedding sees.
* ``words`` — each image's ``audit.words_k`` nearest neighbours by a bag of ORB visual words
  (:mod:`.words`, ``audit.words_vocabulary`` words): zoomed-out, cropped and warped copies whose local
  patterns survive while their global picture changes.

Proposed pairs are scored by the registered SSIM (:mod:`.verifier`), by ORB + RANSAC (:mod:`.geometry`)
and, where neither accepts them, by the SSIM of the two leaves laid on each other by their silhouettes
(:mod:`.leaf_align`); a pair is trusted when any verifier accepts it (:func:`NearCandidates.accepted`).
The SSIM verifier only speaks for *hash-close* pairs (within ``audit.phash_radius`` of pHash, or
``audit.dihedral_radius`` of a symmetry's pHash): its threshold was calibrated where the pictures
already agree in their coarse layout, and between two smooth, featureless subjects that a learned or
ring neighbour search brings together from far apart in hash space it rates different leaves alike.
So the cheap verifier runs first and only there; ORB + RANSAC then scores every proposed pair that the
SSIM did not already confirm beyond doubt (:data:`SURE_SSIM`), so the SSIM calibration table stays exact
up to that score.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import embedding, geometry, leaf_align, reshot, verifier, words
from . import pairs as pair_search
from .hashing import ImageHashes, dihedral_apply

SOURCES = ("phash", "dihedral", "embedding", "rings", "words")
SURE_SSIM = 0.95  # a hash-close pair this similar is a copy: the geometric verifier is not asked


def cap_neighbours(pairs: np.ndarray, primary: np.ndarray, secondary: np.ndarray, k: int) -> np.ndarray:
    """Keep a pair when it is among the ``k`` nearest partners of either of its two ends.

    Nearness: ``primary`` distance, then ``secondary``, then the partner's position (deterministic).
    Returns a boolean mask over ``pairs`` (rows i, j).  Why: on uniform backdrops hundreds of unrelated
    images fall inside a loose radius of each other; a per-image cap bounds the verifier's work at
    ``k`` × N pairs while a true partner, being nearest, survives.
    """
    m = len(pairs)
    if m == 0:
        return np.zeros(0, dtype=bool)
    node = np.concatenate([pairs[:, 0], pairs[:, 1]])
    other = np.concatenate([pairs[:, 1], pairs[:, 0]])
    first = np.concatenate([primary, primary])
    second = np.concatenate([secondary, secondary])
    order = np.lexsort((other, second, first, node))
    sorted_node = node[order]
    starts = np.flatnonzero(np.r_[True, sorted_node[1:] != sorted_node[:-1]])
    rank = np.arange(2 * m) - np.repeat(starts, np.diff(np.r_[starts, 2 * m]))
    kept = np.zeros(2 * m, dtype=bool)
    kept[order[rank < k]] = True
    return kept[:m] | kept[m:]


@dataclass
class NearCandidates:
    """Candidate pairs between distinct pixel contents (positions of representatives), with every score."""

    pairs: np.ndarray             # (M, 2) representative positions, i < j
    phash_distance: np.ndarray
    dhash_distance: np.ndarray
    dihedral_distance: np.ndarray  # min over the 8 symmetries g of b: bits between pHash(a), pHash(g(b))
    dihedral_transform: np.ndarray  # that g (0: none; see hashing.DIHEDRAL)
    cosine: np.ndarray            # embedding cosine similarity (NaN without an embedding)
    capped: np.ndarray            # bool: a pHash pair within table_radius that survives the per-image cap
    proposed: dict[str, np.ndarray]  # source -> bool: the source proposes this pair
    ssim: np.ndarray              # registered SSIM (the better of as-is and dihedral-undone); -inf: not asked
    geometry: geometry.GeometryScores
    aligned_ssim: np.ndarray      # SSIM after warping b onto a by the homography (NaN: none fitted)
    hash_close: np.ndarray        # bool: within phash_radius, or dihedral_radius of a symmetry
    leaf_ssim: np.ndarray | None = None  # leaf-aligned SSIM (NaN: not asked, or no leaf found)
    timings: dict[str, float] = field(default_factory=dict)
    reshot: reshot.ReshotScores | None = None  # SIFT + similarity on the leaf (done: asked)

    def __post_init__(self) -> None:
        if self.leaf_ssim is None:
            self.leaf_ssim = np.full(len(self.pairs), np.nan, dtype=np.float32)
        if self.reshot is None:
            self.reshot = reshot.ReshotScores.empty(len(self.pairs))

    @property
    def scored(self) -> np.ndarray:
        """The SSIM verifier was asked (hash-close proposals and the threshold table's pHash pairs)."""
        return np.isfinite(self.ssim)

    @property
    def geometry_done(self) -> np.ndarray:
        """The geometric verifier was asked (every proposal but SSIM-certain copies)."""
        return self.geometry.done

    @property
    def any_source(self) -> np.ndarray:
        return np.logical_or.reduce([self.proposed[s] for s in SOURCES])

    def proposed_by(self) -> np.ndarray:
        """'+'-joined names of the sources proposing each pair ('' for table-only pHash pairs)."""
        names = np.full(len(self.pairs), "", dtype=object)
        for source in SOURCES:
            flag = self.proposed[source]
            names[flag] = np.where(names[flag] == "", source, names[flag] + "+" + source)
        return names

    def geometry_ok(self, min_inliers: int, min_ratio: float, min_ssim: float) -> np.ndarray:
        aligned = np.nan_to_num(self.aligned_ssim, nan=-1.0)
        return (self.geometry.inliers >= min_inliers) & (self.geometry.ratio >= min_ratio) & (
            aligned >= min_ssim)

    def both_agree(self, support_ssim: float, support_inliers: int) -> np.ndarray:
        """Neither verifier is sure, but both lean the same way (re-shots: moved, relit leaves)."""
        return self.hash_close & (self.ssim >= support_ssim) & (self.geometry.inliers >= support_inliers)

    def leaf_ok(self, leaf_min_ssim: float) -> np.ndarray:
        return np.nan_to_num(self.leaf_ssim, nan=-1.0) >= leaf_min_ssim

    def accepted(self, ssim_threshold: float, min_inliers: int, min_ratio: float, min_ssim: float,
                 support_ssim: float = 2.0, support_inliers: int = 0, leaf_min_ssim: float = 2.0,
                 *reshot_decision: float) -> np.ndarray:
        """Verifier decision, whoever proposed the pair: SSIM (hash-close pairs), geometry, both at
        their lower support levels, the leaf-aligned SSIM, or the re-shot verifier (``reshot_decision``:
        the arguments of :func:`.reshot.accepted` after the scores; none: not asked)."""
        return ((self.hash_close & (self.ssim >= ssim_threshold))
                | self.geometry_ok(min_inliers, min_ratio, min_ssim)
                | self.both_agree(support_ssim, support_inliers)
                | self.leaf_ok(leaf_min_ssim)
                | self.reshot_ok(*reshot_decision))

    def reshot_ok(self, *decision: float) -> np.ndarray:
        """The re-shot verifier accepts the pair (all False without its settings)."""
        if not decision:
            return np.zeros(len(self.pairs), dtype=bool)
        return reshot.accepted(self.reshot, *decision)

    def verified_by(self, ssim_threshold: float, min_inliers: int, min_ratio: float, min_ssim: float,
                    support_ssim: float = 2.0, support_inliers: int = 0, leaf_min_ssim: float = 2.0,
                    *reshot_decision: float) -> np.ndarray:
        """'+'-joined names of the verifiers accepting each pair ('' where none does)."""
        names = np.full(len(self.pairs), "", dtype=object)
        ok = {"ssim": self.hash_close & (self.ssim >= ssim_threshold),
              "geometry": self.geometry_ok(min_inliers, min_ratio, min_ssim)
              | self.both_agree(support_ssim, support_inliers),
              "leaf": self.leaf_ok(leaf_min_ssim),
              "reshot": self.reshot_ok(*reshot_decision)}
        for name, flag in ok.items():
            names[flag] = np.where(names[flag] == "", name, names[flag] + "+" + name)
        return names


def decision_settings(cfg: dict) -> tuple[float, ...]:
    """The arguments of :meth:`NearCandidates.accepted` from the audit settings, in order (the first
    seven: the SSIM, geometric and leaf verifiers; then the re-shot verifier's, when it is on)."""
    first = (float(cfg["verify_threshold"]), int(cfg["geometry_min_inliers"]),
             float(cfg["geometry_min_ratio"]), float(cfg["geometry_min_ssim"]), float(cfg["support_ssim"]),
             int(cfg["support_inliers"]), float(cfg.get("leaf_min_ssim", 2.0)))
    if not cfg.get("reshot_verifier", False):
        return first
    return first + (int(cfg["reshot_min_inliers"]), int(cfg["reshot_support_inliers"]),
                    float(cfg["reshot_min_share"]), float(cfg["reshot_max_angle"]))


def dihedral_match(hashes: ImageHashes, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distance, symmetry g) per pair: min over g of bits between pHash(a) and pHash(g(b))."""
    if len(pairs) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int8)
    distance = np.bitwise_count(hashes.dihedral[pairs[:, 0], :1] ^ hashes.dihedral[pairs[:, 1]])
    g = distance.argmin(axis=1)
    return distance[np.arange(len(pairs)), g].astype(np.int64), g.astype(np.int8)


def _dihedral_search(hashes: ImageHashes, representatives: np.ndarray, radius: int) -> np.ndarray:
    """Representative pairs (positions, i < j) with some symmetry within ``radius`` bits."""
    codes = hashes.dihedral[representatives].ravel()
    found = pair_search.radius_pairs(codes, radius, workers=1)
    a, b = representatives[found[:, 0] // 8], representatives[found[:, 1] // 8]
    keep = a != b
    pairs = np.stack([np.minimum(a, b)[keep], np.maximum(a, b)[keep]], axis=1)
    return np.unique(pairs, axis=0) if len(pairs) else np.zeros((0, 2), np.int64)


def _turned(images: np.ndarray, rows: np.ndarray, g: np.ndarray) -> np.ndarray:
    return np.stack([dihedral_apply(images[r], int(s)) for r, s in zip(rows, g, strict=True)])


def _ssim_scores(hashes: ImageHashes, pairs: np.ndarray, g: np.ndarray, batch: int, progress: bool,
                 workers: int) -> np.ndarray:
    """Registered SSIM of each pair, and of a with the symmetry g of b where g is not the identity."""
    plain = verifier.verify_pairs(hashes.grey, hashes.weight, pairs, batch=batch, progress=progress,
                                  workers=workers).score.astype(np.float64)
    turned = np.flatnonzero(g != 0)
    if len(turned):
        n = len(hashes.grey)
        grey = np.concatenate([hashes.grey, _turned(hashes.grey, pairs[turned, 1], g[turned])])
        weight = np.concatenate([hashes.weight, _turned(hashes.weight, pairs[turned, 1], g[turned])])
        undone = np.stack([pairs[turned, 0], n + np.arange(len(turned))], axis=1)
        score = verifier.verify_pairs(grey, weight, undone, batch=batch, workers=workers).score
        plain[turned] = np.maximum(plain[turned], score)
    return plain


def near_candidates(
    hashes: ImageHashes,
    representatives: np.ndarray,
    cfg: dict,
    progress: bool = False,
    workers: int = 1,
    paths: Callable[[int], str] | None = None,
) -> NearCandidates:
    """Pairs of representatives proposed by any source (see module docstring), with the verifiers' scores.

    ``cfg``: the audit settings (``table_radius``, ``phash_radius``, ``max_neighbours``,
    ``dihedral_radius``, ``embedding_k``, ``embedding_min_cosine``, ``rings_k``,
    ``rings_min_correlation``, ``words_k``, ``words_vocabulary``, ``verify_batch`` and the ``reshot_*``
    settings).  ``paths``: the file of a position, for the re-shot verifier, which decodes the pictures
    it scores again at full size (without it, or with ``audit.reshot_verifier`` off, it is not asked).
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    k_cap = int(cfg["max_neighbours"])
    # The search itself runs in-process: at corpus sizes it takes well under a second.
    found = pair_search.radius_pairs(hashes.phash[representatives], int(cfg["table_radius"]), workers=1)
    table_pairs = representatives[found[:, :2]] if len(found) else np.zeros((0, 2), dtype=np.int64)
    table_pairs = np.sort(table_pairs, axis=1)
    table_capped = cap_neighbours(found[:, :2], found[:, 2],
                                  pair_search.hamming_distance(hashes.dhash[table_pairs[:, 0]],
                                                               hashes.dhash[table_pairs[:, 1]]), k_cap)
    timings["phash_search_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    dihedral_pairs = _dihedral_search(hashes, representatives, int(cfg["dihedral_radius"]))
    d_distance, _ = dihedral_match(hashes, dihedral_pairs)
    d_rank = pair_search.hamming_distance(hashes.phash[dihedral_pairs[:, 0]],
                                          hashes.phash[dihedral_pairs[:, 1]])
    dihedral_keep = cap_neighbours(dihedral_pairs, d_distance, d_rank, k_cap) & (
        d_distance <= int(cfg["dihedral_radius"]))
    dihedral_pairs = dihedral_pairs[dihedral_keep]
    timings["dihedral_search_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    embed_pairs = np.zeros((0, 2), np.int64)
    if hashes.embedding is not None and int(cfg["embedding_k"]) > 0:
        local, _ = embedding.neighbour_pairs(hashes.embedding[representatives], int(cfg["embedding_k"]),
                                             float(cfg["embedding_min_cosine"]))
        embed_pairs = np.sort(representatives[local], axis=1) if len(local) else embed_pairs
    timings["embedding_search_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    ring_pairs = np.zeros((0, 2), np.int64)
    if int(cfg["rings_k"]) > 0 and len(hashes.rings):
        # Correlation = cosine of the spectra centred on the corpus mean and scaled per feature.
        rings = hashes.rings[representatives].astype(np.float64)
        rings = (rings - rings.mean(axis=0)) / (rings.std(axis=0) + 1e-6)
        rings /= np.linalg.norm(rings, axis=1, keepdims=True) + 1e-12
        local, _ = embedding.neighbour_pairs(rings.astype(np.float32), int(cfg["rings_k"]),
                                             float(cfg["rings_min_correlation"]))
        ring_pairs = np.sort(representatives[local], axis=1) if len(local) else ring_pairs
    timings["rings_search_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    word_pairs = np.zeros((0, 2), np.int64)
    if int(cfg["words_k"]) > 0 and len(hashes.keypoints):
        local, _ = words.neighbour_pairs([hashes.keypoints[r].descriptors for r in representatives],
                                         int(cfg["words_k"]), int(cfg["words_vocabulary"]))
        word_pairs = np.sort(representatives[local], axis=1) if len(local) else word_pairs
    timings["words_search_seconds"] = time.perf_counter() - start

    proposals = [dihedral_pairs, embed_pairs, ring_pairs, word_pairs]
    every = np.concatenate([table_pairs, table_pairs[table_capped], *proposals]).astype(np.int64)
    pairs, inverse = np.unique(every, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    m = len(pairs)

    def flag(rows: np.ndarray) -> np.ndarray:
        out = np.zeros(m, dtype=bool)
        out[rows] = True
        return out

    n_table = len(table_pairs)
    capped = flag(inverse[:n_table][table_capped])
    offset = n_table + int(table_capped.sum())
    phash_d = pair_search.hamming_distance(hashes.phash[pairs[:, 0]], hashes.phash[pairs[:, 1]]) \
        if m else np.zeros(0, np.int64)
    dhash_d = pair_search.hamming_distance(hashes.dhash[pairs[:, 0]], hashes.dhash[pairs[:, 1]]) \
        if m else np.zeros(0, np.int64)
    dihedral_d, dihedral_g = dihedral_match(hashes, pairs)
    proposed = {"phash": capped & (phash_d <= int(cfg["phash_radius"]))}
    for source, found in zip(SOURCES[1:], proposals, strict=True):
        proposed[source] = flag(inverse[offset:offset + len(found)])
        offset += len(found)
    if hashes.embedding is not None and m:
        cosine = np.einsum("ij,ij->i", hashes.embedding[pairs[:, 0]], hashes.embedding[pairs[:, 1]])
    else:
        cosine = np.full(m, np.nan)
    any_source = np.logical_or.reduce(list(proposed.values())) if m else np.zeros(0, bool)
    hash_close = (phash_d <= int(cfg["phash_radius"])) | (dihedral_d <= int(cfg["dihedral_radius"]))
    scored = capped | (any_source & hash_close)
    # Undo a symmetry only where it explains the pair better than the picture as it is.
    undo = np.where(dihedral_d < phash_d, dihedral_g, 0).astype(np.int8)

    start = time.perf_counter()
    ssim = np.full(m, -np.inf)
    ssim[scored] = _ssim_scores(hashes, pairs[scored], undo[scored], int(cfg["verify_batch"]), progress,
                                workers)
    timings["ssim_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    asked = any_source & ~(hash_close & (ssim >= SURE_SSIM))
    geo = geometry.verify_pairs(hashes.keypoints, pairs[asked], workers=workers)
    full = geometry.empty_scores(m)
    for name in ("matches", "inliers", "ratio", "mirrored", "homography"):
        getattr(full, name)[asked] = getattr(geo, name)
    full.done[asked] = True
    aligned = _aligned_ssim(hashes, pairs, full, int(cfg["geometry_min_inliers"]))
    timings["geometry_seconds"] = time.perf_counter() - start
    found = NearCandidates(pairs, phash_d, dhash_d, dihedral_d, undo, cosine.astype(np.float32), capped,
                           proposed, ssim, full, aligned, hash_close, timings=timings)
    start = time.perf_counter()
    if len(hashes.leaf_grey) and float(cfg.get("leaf_min_ssim", 2.0)) <= 1.0:
        # only where the other verifiers left the pair open: what it adds is all it can change
        settled = found.accepted(*decision_settings(cfg)[:6])  # the other verifiers' decision
        open_rows = np.flatnonzero(any_source & ~settled)
        found.leaf_ssim[open_rows] = leaf_align.align_pairs(hashes.leaf_grey, hashes.leaf_weight,
                                                            pairs[open_rows], workers=workers)
    timings["leaf_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    if paths is not None and cfg.get("reshot_verifier", False):
        found.reshot = _reshot_scores(found, any_source, cfg, paths, workers)
    timings["reshot_seconds"] = time.perf_counter() - start
    return found


def _reshot_scores(found: NearCandidates, any_source: np.ndarray, cfg: dict, paths: Callable[[int], str],
                   workers: int) -> reshot.ReshotScores:
    """The re-shot verifier on the proposed pairs the other three left open and the screen lets through
    (``audit.reshot_screen_inliers`` ORB inliers or ``audit.reshot_screen_leaf`` leaf-aligned SSIM)."""
    settled = found.accepted(*decision_settings(cfg)[:7])
    with np.errstate(invalid="ignore"):
        evidence = ((found.geometry.inliers >= int(cfg["reshot_screen_inliers"]))
                    | (np.nan_to_num(found.leaf_ssim, nan=-1.0) >= float(cfg["reshot_screen_leaf"])))
    rows = np.flatnonzero(any_source & ~settled & evidence)
    scores = reshot.ReshotScores.empty(len(found.pairs))
    part = reshot.verify_pairs(paths, found.pairs[rows], workers=workers)
    for name in ("matches", "inliers", "scale", "angle", "mirrored", "done"):
        getattr(scores, name)[rows] = getattr(part, name)
    return scores


def _aligned_ssim(hashes: ImageHashes, pairs: np.ndarray, geo: geometry.GeometryScores,
                  min_inliers: int) -> np.ndarray:
    """SSIM of a and b warped onto a by the fitted homography, for pairs with enough inliers (NaN else)."""
    out = np.full(len(pairs), np.nan, dtype=np.float32)
    rows = np.flatnonzero((geo.inliers >= min_inliers) & np.isfinite(geo.homography).all(axis=(1, 2)))
    if not len(rows):
        return out
    warped, weight, inside = [], [], []
    for k in rows:
        j = pairs[k, 1]
        grey, mask = geometry.align(hashes.grey[j], geo.homography[k], bool(geo.mirrored[k]))
        w, _ = geometry.align(hashes.weight[j], geo.homography[k], bool(geo.mirrored[k]))
        warped.append(grey)
        weight.append(w)
        inside.append(mask)
    out[rows] = verifier.weighted_ssim(hashes.grey[pairs[rows, 0]], np.stack(warped),
                                       hashes.weight[pairs[rows, 0]], np.stack(weight), np.stack(inside))
    return out
