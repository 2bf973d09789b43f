"""Chapter 2's paragraphs: every number comes from the facts given, and each optional clause appears only
when its facts exist."""

from __future__ import annotations

import copy

import pandas as pd

from cropcop_utils.audit import chapter_prose as prose

SETTINGS = {"verify_threshold": 0.9, "geometry_min_inliers": 12, "geometry_min_ratio": 0.7,
            "geometry_min_ssim": 0.5, "leaf_min_ssim": 0.72, "phash_radius": 10, "dihedral_radius": 8,
            "embedding_k": 5, "words_k": 3}
FACTS = {
    "rows_audited": 1234, "distinct_pixel_contents": 1200, "settings": SETTINGS,
    "relationships": {"exact_bytes": 7, "exact_pixels": 3, "near_trusted": 45, "near_rejected": 1001},
    "by_source": {
        "trusted": {"by_source": {"phash": 30, "embedding": 20},
                    "by_source_only": {"phash": 10, "embedding": 2},
                    "by_kind": {"near": 45}, "by_verifier": {"ssim": 40, "geometry": 5}},
        "crossing": {"by_source": {"phash": 4, "embedding": 1}, "by_kind": {"near": 5},
                     "by_verifier": {"ssim": 5}}},
    "recall_by_source": [
        {"kind": "flip", "found": 9, "planted_pairs": 10, "recall": 0.9, "recall_ci_low": 0.55,
         "recall_ci_high": 0.99},
        {"kind": "warp", "found": 6, "planted_pairs": 12, "recall": 0.5, "recall_ci_low": 0.21,
         "recall_ci_high": 0.79}],
    "timings": {"embedding_cpu_seconds": 12.5, "embedding_images_per_cpu_second": 98.7,
                "hashing_seconds": 20.1,
                "hashing_workers": 2, "images_per_second": 61.4, "phash_search_seconds": 0.2,
                "dihedral_search_seconds": 0.3, "embedding_search_seconds": 0.4, "rings_search_seconds": 0.5,
                "words_search_seconds": 0.6, "ssim_seconds": 3.1, "geometry_seconds": 4.2,
                "leaf_seconds": 5.3,
                "total_seconds": 50.0},
    "verifier": {"candidates_verified": 4321, "leaf": {"scored": 77}},
    "review": {"pairs": 1500, "by_reason": {"leaf": 1200, "geometry": 400}, "min_leaf_ssim": 0.6,
               "min_inliers": 20, "min_ratio": 0.5, "crossing": 300,
               "crossing_by_reason": {"leaf": 250, "geometry": 60}},
}


def test_relationships_and_sources_read_every_number() -> None:
    assert prose.relationships_text(FACTS) == (
        "**1,234** admitted images hold 1,200 distinct pictures. Trusted relationships: **7** identical "
        "files, **3** identical pixels and **45** verified near duplicates (1,001 near candidates were "
        "rejected by the verifier).")
    text = prose.by_source_text(FACTS["by_source"])
    assert "**phash** 30, **embedding** 20; proposed by that source alone: phash 10, embedding 2." in text
    assert text.endswith("crossing the inherited split, phash 4, embedding 1 were proposed by each source.")
    table = prose.by_source_table(FACTS["by_source"])
    assert table.loc["verified by: geometry"].tolist() == [5, 0]  # absent from crossing: zero, not NaN
    assert table.loc["kind: near", "crossing"] == 5


def test_recall_names_the_weakest_kind_with_its_interval() -> None:
    recall = prose.recall_table(FACTS)
    text = prose.recall_text(recall)
    assert "The weakest kind is `warp`: 6 of 12 planted pairs found, recall 0.500" in text
    assert "(exact 95 % interval 0.21–0.79)" in text
    assert "a kind with 11 planted pairs moves by 0.091 per pair" in text


def test_leaf_threshold_clause_only_when_the_table_has_it() -> None:
    leaf = pd.DataFrame({"min_leaf_ssim": [0.70, 0.72, 0.80], "pairs_added": [9, 4, 1],
                         "precision_near": [0.9, 0.975, 1.0]})
    assert prose.leaf_calibration_text(SETTINGS, leaf).endswith(
        " At the profile's 0.72 it adds 4 pairs, with near-pair precision 0.975.")
    assert "At the profile's" not in prose.leaf_calibration_text(SETTINGS, leaf.iloc[[0, 2]])


def test_timings_without_words_or_embedding_workers() -> None:
    text = prose.timings_text(FACTS)
    assert "(rings), 0.6 s (visual words); verification of 4,321 candidates 3.1 s (SSIM)" in text
    assert text.endswith("the whole chapter 50.0 s. The embedding took 12.5 CPU seconds inside the hashing "
                         "workers (98.7 images per CPU second).")
    quiet = copy.deepcopy(FACTS)
    quiet["settings"]["words_k"] = 0
    quiet["timings"]["embedding_cpu_seconds"] = None
    text = prose.timings_text(quiet)
    assert "(rings), visual words off; verification" in text and text.endswith("the whole chapter 50.0 s.")


def test_review_adds_planted_relatives_only_on_a_corpus_with_truth() -> None:
    text = prose.review_text(FACTS["review"])
    assert text.startswith("**1,500** rejected candidates are on the review list: 1,200 reach a leaf-aligned "
                           "SSIM of 0.60")
    assert "**300** of them cross the inherited split (250 by leaf alignment, 60 by geometry)" in text
    assert "planted" not in text
    planted = {**FACTS["review"], "planted_related": 900, "planted_related_by_reason": {"leaf": 800,
                                                                                       "geometry": 150}}
    assert "900 of the 1,500 are planted relatives (800 of the leaf-aligned, 150 of the geometric near " \
        "misses)" in prose.review_text(planted)


def test_truth_and_untruthed_threshold_paragraphs() -> None:
    assert "aligned SSIM 0.50) and the leaf-aligned SSIM threshold 0.72 come from the synthetic" in \
        prose.thresholds_without_truth_text(SETTINGS)
    truth = {"byte_copy_recall": 1.0, "near_duplicate_recall": 0.95, "near_duplicate_found": 95,
             "near_duplicate_planted": 100, "near_precision": 0.99, "false_near_pairs": 1,
             "trusted_near_pairs": 96,
             "reshot_recall": 0.8, "reshot_families": {"kept_whole": 7, "families": 9},
             "label_conflicts_found": 3, "label_conflicts_planted": 3, "calibrated_threshold": 0.88}
    text = prose.truth_text(SETTINGS, truth)
    assert "near duplicates recall **0.950** (95 of 100)" in text
    assert "7 of 9 re-shot families end up whole in one group" in text
    assert text.endswith("at least 0.98 on this corpus is 0.88.")


def test_verdicts_paragraph_tells_how_to_give_verdicts_back_then_what_they_changed() -> None:
    none = {"file": None, "sha256": None, "copy": None, "judged": 0, "same": 0, "different": 0,
            "confirmed_new": 0, "confirmed_crossing": 0, "added": 0, "different_but_trusted": 0,
            "disagreements": []}
    review = {**FACTS["review"], "sheet": "audit/review.csv", "verdicts": none}
    text = prose.verdicts_text(review)
    assert "The 1,500 pairs on the list are in `audit/review.csv`" in text
    assert "REVIEW=path/to/review.csv" in text and "--review-verdicts PATH" in text
    assert "holds only its header" in prose.verdicts_text({**review, "pairs": 0})
    given = {**none, "file": "/r/review.csv", "sha256": "f" * 64, "copy": "audit/review_verdicts.csv",
             "judged": 40, "same": 31, "different": 9, "confirmed_new": 29, "confirmed_crossing": 7,
             "added": 3}
    text = prose.verdicts_text({**review, "verdicts": given})
    for part in ("**40** verdicts were given back in `/r/review.csv`", "`ffffffffffff…`", "31 `same` and 9",
                 "confirmed **29** pairs", "(3 of them proposed by no source), **7** of them across",
                 "No pair judged `different` is trusted", "add rows from `audit/review.csv` to it"):
        assert part in text, part
    assert "REVIEW=" not in text
