"""The "Across sources" section of chapter 2, rendered from the ``cross_sets`` block of ``audit/audit.json``
(numbers never typed): kept here so the notebook only displays what this returns."""

from __future__ import annotations

from typing import Any

import pandas as pd


def _relative_sentence(cross: dict[str, Any], cohort: str) -> str:
    """How many of a cohort's photos have a trusted relative in each training set (field-train first)."""
    sets = {s["name"]: s for s in cross["sets"]}
    found = cross["relatives"][cohort]["with_relative_in"]
    others = sorted((o for o in sets if not o.startswith("cohort:")), key=lambda o: o == "lab")
    parts = [f"**{found[o]['in_group']:,}** share a leakage group with a `{o}` photo "
             f"({found[o]['directly']:,} of them directly related to one)" for o in others]
    return f"Of the {sets[cohort]['rows']:,} photos of `{cohort}`, " + " and ".join(parts) + "."


def cross_sets_text(cross: dict[str, Any]) -> str:
    """The section's heading and paragraph."""
    names = [s["name"] for s in cross["sets"]]
    across, conflicts, groups = cross["across_sets"], cross["label_conflicts"], cross["groups"]
    largest = groups["largest_across_sets"]
    others = " and ".join(f"`{n}`" for n in names if n != "lab")
    biggest = ("; the largest holds {:,} photos ({})".format(
        largest["size"], ", ".join(f"{n:,} in `{name}`" for name, n in largest["by_set"].items()))
        if largest else "")
    return (
        "## Across sources\n\n"
        f"The lab corpus was audited again together with {others}, "
        f"as one corpus of {cross['rows_audited']:,} photos, with the same candidate sources, verifiers and "
        "thresholds as the lab audit above (whose figures do not change), each set in place of the inherited "
        f"split. Across sets, **{across['trusted']:,}** relationships are trusted: {across['exact_bytes']:,} "
        f"identical files, {across['exact_pixels']:,} identical pixels and {across['near']:,} verified near "
        "duplicates. "
        + " ".join(_relative_sentence(cross, c) for c in names if c.startswith("cohort:"))
        + f" **{conflicts['across_sets']:,}** trusted pair(s) across sets carry two different labels (the "
        "source labels one image twice, differently)"
        + "".join(f"; {n:,} within `{name}`" for name, n in conflicts["within_sets"].items() if n)
        + f". {groups['groups_across_sets']:,} leakage groups span more than one set"
        + biggest
        + f". {cross['review']['pairs']:,} rejected candidates across sets are close enough for a human look "
        f"(the review list's thresholds). The cross-set audit took {cross['seconds']['total']:,.0f} s. Every "
        f"pair with a non-lab member is in `{cross['evidence']['pairs']}`, every photo's group in "
        f"`{cross['evidence']['groups']}`."
    )


def cross_sets_table(cross: dict[str, Any]) -> pd.DataFrame:
    """Trusted relationships per pair of sets, by kind, with the near candidates rejected."""
    return pd.DataFrame(cross["by_set_pair"]).set_index(["set_a", "set_b"]).rename(
        columns={"trusted": "trusted (all kinds)", "near_rejected": "near candidates rejected"})
