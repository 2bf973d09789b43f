"""Chapter 2's paragraphs, rendered from the ``figures`` block of ``audit/audit.json`` (numbers never
typed), so that the notebook's cells only display what these return.  The "Across sources" section has
its own module (:mod:`.cross_prose`)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def relationships_text(facts: dict[str, Any]) -> str:
    """What the admitted images hold, and the trusted relationships by kind."""
    rel = facts["relationships"]
    return (f"**{facts['rows_audited']:,}** admitted images hold {facts['distinct_pixel_contents']:,} "
            f"distinct pictures. Trusted relationships: **{rel['exact_bytes']:,}** identical files, "
            f"**{rel['exact_pixels']:,}** identical pixels and **{rel['near_trusted']:,}** verified near "
            f"duplicates ({rel['near_rejected']:,} near candidates were rejected by the verifier).")


def by_source_text(by_source: dict[str, Any]) -> str:
    """Which candidate source proposed the trusted pairs, and the crossing ones."""
    return ("Trusted pairs proposed by each source: "
            + ", ".join(f"**{name}** {n:,}" for name, n in by_source["trusted"]["by_source"].items())
            + "; proposed by that source alone: "
            + ", ".join(f"{name} {n:,}" for name, n in by_source["trusted"]["by_source_only"].items())
            + ". Of the trusted pairs crossing the inherited split, "
            + ", ".join(f"{name} {n:,}" for name, n in by_source["crossing"]["by_source"].items())
            + " were proposed by each source.")


def by_source_table(by_source: dict[str, Any]) -> pd.DataFrame:
    """Trusted and crossing pairs by kind and by the verifier that decided."""
    return pd.DataFrame({part: pd.Series({**{f"kind: {k}": v for k, v in by_source[part]["by_kind"].items()},
                                          **{f"verified by: {k}": v
                                             for k, v in by_source[part]["by_verifier"].items()}})
                         for part in ("trusted", "crossing")}).fillna(0).astype(int)


def thresholds_without_truth_text(settings: dict[str, Any]) -> str:
    """A real corpus has no planted truth: which calibrated thresholds it uses."""
    return (f"This corpus has no planted truth. The SSIM threshold {settings['verify_threshold']:.2f} "
            f"and the geometric thresholds ({settings['geometry_min_inliers']} RANSAC inliers, inlier ratio "
            f"{settings['geometry_min_ratio']:.2f}, aligned SSIM {settings['geometry_min_ssim']:.2f}) and "
            f"the leaf-aligned SSIM threshold {settings['leaf_min_ssim']:.2f} come from the synthetic "
            "calibration; below, the number of confirmed pairs the SSIM verifier would give at other "
            "thresholds.")


def truth_text(settings: dict[str, Any], truth: dict[str, Any]) -> str:
    """Recall and precision against the synthetic corpus's planted truth, at the profile's settings."""
    return (f"At pHash radius {settings['phash_radius']}, dihedral radius {settings['dihedral_radius']}, "
            f"{settings['embedding_k']} embedding neighbours, {settings['words_k']} visual-word neighbours "
            f"and SSIM threshold {settings['verify_threshold']:.2f}: "
            f"byte copies found {truth['byte_copy_recall']:.3f}; near duplicates recall "
            f"**{truth['near_duplicate_recall']:.3f}** ({truth['near_duplicate_found']} of "
            f"{truth['near_duplicate_planted']}); precision of trusted near pairs "
            f"**{truth['near_precision']:.3f}** ({truth['false_near_pairs']} false of "
            f"{truth['trusted_near_pairs']}); re-shot pairs recall {truth['reshot_recall']:.3f}, and "
            f"{truth['reshot_families']['kept_whole']} of {truth['reshot_families']['families']} re-shot "
            f"families end up whole in one group. Planted label conflicts found: "
            f"{truth['label_conflicts_found']} of {truth['label_conflicts_planted']}. The lowest SSIM "
            f"threshold with near-pair precision of at least 0.98 on this corpus is "
            f"{truth['calibrated_threshold']}.")


def recall_table(facts: dict[str, Any]) -> pd.DataFrame:
    """Recall per planted kind and candidate source, indexed by kind."""
    return pd.DataFrame(facts["recall_by_source"]).set_index("kind")


def recall_text(recall: pd.DataFrame) -> str:
    """The weakest planted kind, with its exact interval, and what one corpus can tell."""
    weakest = recall["recall"].idxmin()
    typical = recall["planted_pairs"].median()
    return (f"Recall per planted kind, and the share of each kind's planted pairs that each source proposed "
            f"(`proposed_*`) and that the verifiers then trusted (`trusted_*`). The weakest kind is "
            f"`{weakest}`: {recall.loc[weakest, 'found']} of {recall.loc[weakest, 'planted_pairs']} planted "
            f"pairs found, recall {recall.loc[weakest, 'recall']:.3f} (exact 95 % interval "
            f"{recall.loc[weakest, 'recall_ci_low']:.2f}–{recall.loc[weakest, 'recall_ci_high']:.2f}). The "
            f"interval is what one corpus can tell: a kind with {typical:.0f} planted pairs moves by "
            f"{1 / typical:.3f} per pair, and even a perfect score leaves its lower bound well below 1. The "
            "thresholds were chosen on this corpus; `bench/audit_seeds.py` audits corpora of other generator "
            "seeds with the same settings and pools them.")


def leaf_calibration_text(settings: dict[str, Any], leaf: pd.DataFrame) -> str:
    """What the leaf-alignment verifier adds, at the profile's threshold when the table has it."""
    threshold = round(settings["leaf_min_ssim"], 2)
    at = (leaf.set_index("min_leaf_ssim").loc[threshold]
          if threshold in set(leaf["min_leaf_ssim"].round(2)) else None)
    return ("The leaf-alignment verifier scores only the proposed pairs the other two left open, so the "
            "table below is its whole effect: for each threshold, the pairs it adds and the recall and "
            "precision that result."
            + (f" At the profile's {settings['leaf_min_ssim']:.2f} it adds {int(at['pairs_added'])} pairs, "
               f"with near-pair precision {at['precision_near']:.3f}." if at is not None else ""))


def timings_text(facts: dict[str, Any]) -> str:
    """Where the chapter's seconds went: hashing, each candidate search, each verifier."""
    t, settings = facts["timings"], facts["settings"]
    embed = (f" The embedding took {t['embedding_cpu_seconds']} CPU seconds inside the hashing workers "
             f"({t['embedding_images_per_cpu_second']} images per CPU second)."
             if t["embedding_cpu_seconds"] else "")
    words = (f"{t['words_search_seconds']} s (visual words)" if settings["words_k"] else "visual words off")
    return (f"Timings: hashing (with keypoints and embedding) {t['hashing_seconds']} s on "
            f"{t['hashing_workers']} process(es) ({t['images_per_second']} images/s), candidate search "
            f"{t['phash_search_seconds']} s (pHash), {t['dihedral_search_seconds']} s (dihedral), "
            f"{t['embedding_search_seconds']} s (embedding), {t['rings_search_seconds']} s (rings), {words}; "
            "verification of "
            f"{facts['verifier']['candidates_verified']:,} candidates {t['ssim_seconds']} s (SSIM), "
            f"{t['geometry_seconds']} s (geometry) and {t.get('leaf_seconds', 0)} s (leaf alignment, "
            f"{facts['verifier']['leaf']['scored']:,} pairs); the whole chapter {t['total_seconds']} s."
            f"{embed}")


def review_text(review: dict[str, Any]) -> str:
    """The rejected candidates on the review list, those crossing the split, and planted relatives."""
    return (f"**{review['pairs']:,}** rejected candidates are on the review list: "
            f"{review['by_reason']['leaf']:,} reach a leaf-aligned SSIM of {review['min_leaf_ssim']:.2f} "
            "(`audit.leaf_review_ssim`) and "
            f"{review['by_reason']['geometry']:,} have at least {review['min_inliers']} RANSAC inliers at an "
            f"inlier ratio of {review['min_ratio']:.2f} (`audit.geometry_review_inliers`; a pair can be "
            "both). "
            f"**{review['crossing']:,}** of them cross the inherited split "
            f"({review['crossing_by_reason']['leaf']:,} by leaf alignment, "
            f"{review['crossing_by_reason']['geometry']:,} by geometry). Where the pairs below show one leaf "
            "photographed twice, the trusted crossings are a lower bound, short by up to that many pairs; "
            "`audit/relationships.parquet` lists each with its `leaf_ssim`, `geometry_inliers` and "
            "`geometry_ratio`."
            + (f" On this corpus's planted truth, {review['planted_related']:,} of the "
               f"{review['pairs']:,} are planted relatives "
               f"({review['planted_related_by_reason']['leaf']:,} of the leaf-aligned, "
               f"{review['planted_related_by_reason']['geometry']:,} of the geometric near misses); the "
               "others are different leaves that look alike, which is why they are not trusted."
               if "planted_related" in review else ""))


def verdicts_text(review: dict[str, Any]) -> str:
    """The review list as a sheet to fill, and what the verdicts given back changed (or how to give them)."""
    v, sheet = review["verdicts"], f"`{review['sheet']}`"
    text = (f"The {review['pairs']:,} pairs on the list are in {sheet} (crossing pairs first, both paths "
            "relative to the corpus root, classes, splits and every recorded score) with an empty `verdict` "
            "column: write `same` where the two images show one leaf (or one picture) and `different` where "
            "they do not, and leave the rest blank. " if review["pairs"] else
            f"The review list is empty: {sheet} holds only its header. ")
    if v["file"] is None:
        return (text + "No verdicts have been given back yet. Give the filled file back with `make book ... "
                "REVIEW=path/to/review.csv` (`--review-verdicts PATH`): a pair judged `same` is then trusted "
                "(verified by `reviewer`), joins its leakage group and is kept on one side of the split, and "
                "every judged pair leaves the list.")
    disputed = v["different_but_trusted"]
    shown = "; ".join(f"`{d['rel_path_a']}` ~ `{d['rel_path_b']}` ({d['kind']}, {d['verified_by']})"
                      for d in v["disagreements"][:5])
    return (text + f"**{v['judged']:,}** verdicts were given back in `{v['file']}` (SHA-256 "
            f"`{v['sha256'][:12]}…`, kept as `{v['copy']}`): {v['same']:,} `same` and {v['different']:,} "
            f"`different`. They confirmed **{v['confirmed_new']:,}** pairs no verifier had trusted "
            f"({v['added']:,} of them proposed by no source), **{v['confirmed_crossing']:,}** of them across "
            "the inherited split; these are among the trusted pairs, groups and crossings above, verified by "
            "`reviewer`. Judged pairs are left off the list and the sheet. "
            + (f"**{disputed:,}** pairs judged `different` are trusted by a verifier and stay trusted (a "
               f"verdict does not undo a verifier's evidence; check them): {shown}"
               + (" and more (`audit/audit.json`)" if disputed > 5 else "") + ". "
               if disputed else "No pair judged `different` is trusted by a verifier. ")
            + f"The verdicts come from that one file: to judge more, add rows from {sheet} to it and run the "
            "book again (a rerun sees the edit); a file given in its place replaces these verdicts.")
