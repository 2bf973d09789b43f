"""What the re-shot verifier gets right on real photographs, from pairs labelled by eye.

    .venv/bin/python bench/reshot_labels.py RUN_DIR [--labels bench/reshot_labels.csv]

``bench/reshot_labels.csv`` holds pairs of PlantVillage tomato pictures (paths relative to
``../shared/data/plantvillage-tomato``), each looked at by a person, both pictures side by side and, for
pairs whose outlines are mirror images, with the second one mirrored, and labelled ``same`` (one leaf),
``different`` (two leaves) or ``unsure`` (not decidable at that size).  Columns: ``stratum`` — how the
pair was drawn: ``trusted`` (a random sample of the pairs only the re-shot verifier trusted),
``trusted_mirrored`` (of those it trusted through its mirrored pass) or ``rejected`` (a random sample
of the chapter's review list of rejected pairs); the scores it had when drawn; ``label`` and ``note``.

Printed, against the run's ``audit/relationships.parquet`` (an audit of the tomato corpus, e.g.
``make book DATA=../shared/data/plantvillage-tomato UNTIL=audit RUN_DIR=runs/tomato-36``): per stratum the
labels and how many of each the run trusts now; the precision of what the re-shot verifier adds (same /
judged, with an exact 95 % interval); and how many of the review list's same-leaf pairs, and of those
crossing the inherited split, the run trusts.  Not a test: it reads a finished audit of the real corpus.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from scipy.stats import binomtest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def interval(k: int, n: int) -> str:
    if not n:
        return "n/a"
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return f"{k}/{n} = {k / n:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def joined(labels: pd.DataFrame, relationships: pd.DataFrame) -> pd.DataFrame:
    """Each labelled pair with the run's verdict on it (either order of the two paths)."""
    near = relationships[relationships["kind"] == "near"]
    key = near[["rel_path_a", "rel_path_b", "trusted", "verified_by"]]
    swapped = key.rename(columns={"rel_path_a": "rel_path_b", "rel_path_b": "rel_path_a"})
    both = pd.concat([key, swapped]).drop_duplicates(["rel_path_a", "rel_path_b"])
    out = labels.merge(both, on=["rel_path_a", "rel_path_b"], how="left", suffixes=("", "_now"))
    out["trusted_now"] = out["trusted"].fillna(False).astype(bool)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--labels", type=Path, default=HERE / "reshot_labels.csv")
    parser.add_argument("--before", type=Path, default=None,
                        help="an audit of the same corpus without the re-shot verifier "
                             "(audit.reshot_verifier: false): how much of its review list the run trusts")
    args = parser.parse_args(argv)
    labels = pd.read_csv(args.labels)
    relationships = pd.read_parquet(args.run_dir / "audit" / "relationships.parquet")
    table = joined(labels, relationships)
    print(f"{len(table)} labelled pairs; the run trusts {int(table['trusted_now'].sum())} of them\n")
    print(table.groupby(["stratum", "label"])["trusted_now"].agg(pairs="size", trusted_now="sum").to_string())

    added = table[table["stratum"].str.startswith("trusted")]
    judged = added[added["label"] != "unsure"]
    print("\nprecision of the pairs the re-shot verifier adds (same / judged):",
          interval(int((judged["label"] == "same").sum()), len(judged)))
    for stratum, part in added.groupby("stratum"):
        part = part[part["label"] != "unsure"]
        print(f"  {stratum}: {interval(int((part['label'] == 'same').sum()), len(part))}")

    review = table[table["stratum"] == "rejected"]
    same = review[review["label"] == "same"]
    counts = review["label"].value_counts()
    print("\nthe review list sample:", ", ".join(f"{k} {v}" for k, v in counts.items()))
    print("same-leaf pairs of the review list the run trusts:",
          interval(int(same["trusted_now"].sum()), len(same)))
    crossing = same[same["crosses_split"].astype(bool)]
    print("... of those crossing the inherited split:",
          interval(int(crossing["trusted_now"].sum()), len(crossing)))
    if args.before is not None:
        before_review(args.before, relationships)
    return 0


def before_review(before: Path, relationships: pd.DataFrame) -> None:
    """The earlier run's review list (its own settings), and how much of it this run trusts."""
    import json

    from cropcop_utils.audit.figures import review_pairs

    earlier = pd.read_parquet(before / "audit" / "relationships.parquet")
    cfg = json.loads((before / "audit" / "audit.json").read_text())["figures"]["settings"]
    review = review_pairs(earlier, float(cfg["leaf_review_ssim"]), int(cfg["geometry_review_inliers"]),
                          float(cfg["geometry_min_ratio"]))
    trusted = relationships.set_index(["rel_path_a", "rel_path_b"])["trusted"]
    now = trusted.reindex(list(zip(review["rel_path_a"], review["rel_path_b"], strict=True))).fillna(False)
    now = now.to_numpy(dtype=bool)
    crossing = review["crosses_split"].to_numpy(dtype=bool)
    print(f"\nthe review list of {before}: {len(review)} pairs, {int(crossing.sum())} crossing; this run "
          "trusts", interval(int(now.sum()), len(review)), "; crossing:",
          interval(int((now & crossing).sum()), int(crossing.sum())))


if __name__ == "__main__":
    raise SystemExit(main())
