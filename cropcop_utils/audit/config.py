"""The audit's settings: the ``audit`` profile section over :data:`DEFAULTS`, validated.

Every threshold, radius and neighbour count of the candidate sources and verifiers lives here with its
default and its comment, apart from the code that uses them (:mod:`.corpus_audit`, :mod:`.chapter`).
"""

from __future__ import annotations

from typing import Any

from . import geometry
from .errors import AuditInputError

DEFAULTS: dict[str, Any] = {
    "hash_size": 8,           # 8x8 = 64-bit pHash / dHash
    "workers": None,          # hashing processes (None: all cores)
    "phash_radius": 12,       # near candidates trusted up to this pHash distance (evidence in the chapter)
    "table_radius": 16,       # the threshold table covers pHash radius 0..table_radius
    "max_neighbours": 4,      # candidates kept per image and source (nearest by pHash, then dHash)
    "dihedral_radius": 8,     # flips / quarter turns: bits between pHash(a) and a symmetry's pHash of b
    "embedding_k": 6,         # nearest embedding neighbours proposed per image (0: no embedding source)
    "embedding_min_cosine": 0.6,  # ... when at least this similar
    "embedding_px": 128,      # side of the loading contract's square the embedding network sees
    "rings_k": 4,             # nearest ring-spectrum neighbours proposed per image (0: no rings source)
    "rings_min_correlation": 0.85,  # ... when their spectra correlate at least this much
    "words_k": 3,             # nearest bag-of-ORB-words neighbours proposed per image (0: no words source)
    "words_vocabulary": 256,  # visual words (k-means centres of the audited ORB descriptors)
    "verify_threshold": 0.90,  # SSIM that confirms a candidate (calibrated on synthetic truth)
    "geometry_min_inliers": 24,  # RANSAC homography inliers that confirm a candidate
    "geometry_min_ratio": 0.7,   # ... when at least this share of the matches
    "geometry_min_ssim": 0.6,    # ... and b warped onto a by the homography reaches this SSIM
    "support_ssim": 0.85,     # a hash-close pair is also trusted when SSIM reaches this ...
    "support_inliers": 14,    # ... and the homography has this many inliers (both verifiers lean yes)
    "leaf_min_ssim": 0.92,    # leaf-aligned SSIM confirming a pair the others left open (> 1: off)
    "leaf_review_ssim": 0.80,  # rejected pairs from this leaf-aligned SSIM up are listed for a human look
    "geometry_review_inliers": 20,  # ... and those with this many RANSAC inliers at geometry_min_ratio
    # The re-shot verifier (cropcop_utils.audit.reshot): SIFT on the leaf, one similarity.  Chosen on the
    # synthetic truth pooled over four generator seeds (bench/audit_seeds.py): at these settings it recovers
    # 71 of the 91 re-shot pairs the other verifiers left open, with one unrelated pair among the 16,434 it
    # was shown
    "reshot_verifier": True,
    "reshot_screen_inliers": 10,  # asked about open pairs with this many ORB inliers ...
    "reshot_screen_leaf": 0.6,    # ... or this leaf-aligned SSIM
    "reshot_min_inliers": 25,     # similarity inliers that confirm a re-shot on their own
    "reshot_support_inliers": 12,  # ... or this many when they are at least
    "reshot_min_share": 0.7,      # ... this share of the matches (template look-alikes agree on half)
    "reshot_max_angle": 30.0,     # a re-shot turns a few degrees; chance fits came at 50-180
    "verify_batch": 512,
    "gallery_pairs": 12,
    # a reviewer's verdicts on audit/review.csv (same / different), given back: `same` pairs are trusted
    # (verified_by "reviewer") before the groups form (cropcop_utils.audit.verdicts); None: none given yet.
    # Set by --review-verdicts PATH (make book REVIEW=PATH) as an absolute path
    "review_verdicts": None,
}


# --------------------------------------------------------------------------- settings
def settings(ctx_or_section: Any) -> dict[str, Any]:
    """The ``audit`` profile section over :data:`DEFAULTS`, validated."""
    section = ctx_or_section.section("audit") if hasattr(ctx_or_section, "section") else ctx_or_section
    merged = {**DEFAULTS, **(section or {})}
    unknown = set(merged) - set(DEFAULTS)
    if unknown:
        raise AuditInputError(f"unknown audit setting(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    if merged["hash_size"] != 8:
        raise AuditInputError("audit.hash_size must be 8: the pair search works on 64-bit hashes")
    if not 0 <= merged["phash_radius"] <= merged["table_radius"] < 64:
        raise AuditInputError("audit radii must satisfy 0 <= phash_radius <= table_radius < 64, got "
                              f"{merged['phash_radius']} and {merged['table_radius']}")
    if not 0 <= int(merged["dihedral_radius"]) < 64:
        raise AuditInputError(f"audit.dihedral_radius must lie in 0..63, got {merged['dihedral_radius']}")
    if int(merged["max_neighbours"]) < 1:
        raise AuditInputError("audit.max_neighbours must be at least 1")
    if int(merged["embedding_k"]) < 0 or not -1 <= float(merged["embedding_min_cosine"]) <= 1:
        raise AuditInputError("audit.embedding_k must be >= 0 and audit.embedding_min_cosine in [-1, 1]")
    if int(merged["rings_k"]) < 0 or not -1 <= float(merged["rings_min_correlation"]) <= 1:
        raise AuditInputError("audit.rings_k must be >= 0 and audit.rings_min_correlation in [-1, 1]")
    if int(merged["words_k"]) < 0 or int(merged["words_vocabulary"]) < 2:
        raise AuditInputError("audit.words_k must be >= 0 and audit.words_vocabulary at least 2")
    if int(merged["embedding_px"]) < 32:
        raise AuditInputError("audit.embedding_px must be at least 32")
    if int(merged["geometry_min_inliers"]) < geometry.MIN_MATCHES or not 0 <= float(
            merged["geometry_min_ratio"]) <= 1 or not -1 <= float(merged["geometry_min_ssim"]) <= 1:
        raise AuditInputError(f"audit.geometry_min_inliers must be >= {geometry.MIN_MATCHES}, "
                              "audit.geometry_min_ratio in [0, 1] and audit.geometry_min_ssim in [-1, 1]")
    if not -1 <= float(merged["leaf_min_ssim"]) <= 2 or not -1 <= float(merged["leaf_review_ssim"]) <= 2:
        raise AuditInputError("audit.leaf_min_ssim and audit.leaf_review_ssim must lie in [-1, 2] (above 1 "
                              "turns the leaf verifier off)")
    if int(merged["geometry_review_inliers"]) < 0:
        raise AuditInputError("audit.geometry_review_inliers must be >= 0 (above geometry_min_inliers, the "
                              "review list holds no geometric near misses)")
    if merged["review_verdicts"] is not None and (not isinstance(merged["review_verdicts"], str)
                                                  or not merged["review_verdicts"].strip()):
        raise AuditInputError("audit.review_verdicts must be null or the path of a verdict file (a filled-in "
                              f"audit/review.csv), got {merged['review_verdicts']!r}")
    if not isinstance(merged["reshot_verifier"], bool):
        raise AuditInputError(f"audit.reshot_verifier must be true or false, got "
                              f"{merged['reshot_verifier']!r}")
    if min(int(merged["reshot_screen_inliers"]), int(merged["reshot_min_inliers"]),
           int(merged["reshot_support_inliers"])) < 0 or not 0 <= float(merged["reshot_min_share"]) <= 1 \
            or not 0 <= float(merged["reshot_max_angle"]) <= 180:
        raise AuditInputError("audit.reshot_* inlier counts must be >= 0, audit.reshot_min_share in [0, 1] "
                              "and audit.reshot_max_angle in [0, 180] degrees")
    return merged
