"""A reviewer's verdicts given back to the audit: the sheet, reading and checking it, applying it to the
relationships, and the chapter's round trip on a tiny folder corpus."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter

from cropcop_utils import audit
from cropcop_utils.audit import verdicts
from cropcop_utils.audit.figures import review_pairs
from cropcop_utils.audit.relations import NEAR_COLUMNS

PATHS = ["train/apple/a.png", "test/apple/b.png", "train/apple/c.png", "test/apple/d.png", "train/pear/e.png",
         "test/pear/f.png"]
HEADER = "rel_path_a,rel_path_b,verdict\n"


# --------------------------------------------------------------------------- a small relationship table
@pytest.fixture
def table() -> tuple[pd.DataFrame, pd.DataFrame, SimpleNamespace]:
    """Rows, fingerprints and relationships: a~b rejected but review-worthy (crossing), c~d trusted by SSIM
    (crossing), e~f rejected but review-worthy (crossing); nothing else proposed."""
    rows = pd.DataFrame({"row_id": [f"r{k}" for k in range(len(PATHS))], "rel_path": PATHS,
                         "class_name": [p.split("/")[1] for p in PATHS],
                         "inherited_split": [p.split("/")[0] for p in PATHS]})
    hashes = SimpleNamespace(phash=np.array([0, 1, 3, 7, 15, 31], dtype=np.uint64),
                             dhash=np.array([0, 0, 1, 1, 3, 3], dtype=np.uint64))

    def near(i: int, j: int, trusted: bool, verified: str, leaf: float | None) -> dict:
        return {**{c: pd.NA for c in NEAR_COLUMNS}, "i": i, "j": j, "proposed_by": "embedding",
                "verified_by": verified, "trusted": trusted, "leaf_ssim": leaf, "verify_score": 0.5,
                "dihedral_transform": 0}

    near_rows = pd.DataFrame([near(0, 1, False, "", 0.85), near(2, 3, True, "ssim", None),
                              near(4, 5, False, "", 0.83)])
    exact = pd.DataFrame({"i": np.zeros(0, np.int64), "j": np.zeros(0, np.int64),
                          "kind": np.zeros(0, object)})
    return rows, audit.relationship_table(rows, hashes, exact, near_rows), hashes


def _sheet(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "review.csv"
    path.write_text(text)
    return path


def _pair(relationships: pd.DataFrame, a: str, b: str) -> pd.Series:
    hit = relationships[[{x, y} == {a, b} for x, y in zip(relationships["rel_path_a"],
                                                           relationships["rel_path_b"], strict=True)]]
    assert len(hit) == 1, f"expected one relationship {a} ~ {b}, found {len(hit)}"
    return hit.iloc[0]


# --------------------------------------------------------------------------- reading
def test_verdicts_are_case_insensitive_unordered_and_blank_means_not_judged(tmp_path) -> None:
    path = _sheet(tmp_path, "rel_path_a,rel_path_b,class_a,verdict\n"
                            "train/apple/a.png,test/apple/b.png,apple, Same \n"
                            "test/apple/b.png,train/apple/a.png,apple,same\n"   # the same pair, reversed
                            "train/apple/c.png,test/apple/d.png,apple,\n"        # not judged yet
                            "train/pear/e.png,test/pear/f.png,pear,DIFFERENT\n")
    judged = verdicts.read_verdicts(path, PATHS)
    assert judged[["rel_path_a", "rel_path_b", "verdict"]].to_dict("records") == [
        {"rel_path_a": "test/apple/b.png", "rel_path_b": "train/apple/a.png", "verdict": "same"},
        {"rel_path_a": "test/pear/f.png", "rel_path_b": "train/pear/e.png", "verdict": "different"}]
    assert judged["line"].tolist() == [2, 5]
    assert verdicts.read_verdicts(b"\xef\xbb\xbf" + path.read_bytes(), PATHS).equals(judged)  # a BOM


@pytest.mark.parametrize(("text", "match"), [
    ("rel_path_a,rel_path_b\nx,y\n", r"lacks column\(s\) \['verdict'\]"),
    (HEADER + "train/apple/a.png,test/apple/b.png,same\ntrain/apple/c.png,test/apple/d.png,maybe\n",
     r"unknown verdict\(s\) \['maybe'\] on line\(s\) 3"),
    (HEADER + "train/apple/a.png,test/apple/zz.png,same\n",
     r"line\(s\) 2 name a path that is not an admitted image .*'test/apple/zz.png'"),
    (HEADER + "train/apple/a.png,test/apple/b.png,same\ntest/apple/b.png,train/apple/a.png,different\n",
     r"test/apple/b.png ~ train/apple/a.png is judged both same and different \(lines 2, 3\)"),
    (HEADER + "train/apple/a.png,train/apple/a.png,same\n", r"one image with itself on line\(s\) 2"),
    (HEADER + ",test/apple/b.png,same\n", r"lacks a path on line\(s\) 2"),
    ("", r"not a readable CSV sheet"),
    (HEADER + 'train/apple/a.png,"test/apple/b.png,same\n', r"not a readable CSV sheet"),
])
def test_a_bad_sheet_is_refused_by_line_not_by_a_parser_traceback(tmp_path, text, match) -> None:
    with pytest.raises(audit.AuditInputError, match=match):
        verdicts.read_verdicts(_sheet(tmp_path, text), PATHS)


def test_a_missing_or_binary_file_is_an_audit_input_error(tmp_path) -> None:
    with pytest.raises(audit.AuditInputError, match="cannot read it"):
        verdicts.read_verdicts(tmp_path / "nope.csv", PATHS)
    with pytest.raises(audit.AuditInputError, match="not a readable CSV"):
        verdicts.read_verdicts(bytes(range(256)) * 4, PATHS)


def test_the_setting_is_none_or_a_path() -> None:
    assert audit.settings({})["review_verdicts"] is None
    assert audit.settings({"review_verdicts": "/tmp/review.csv"})["review_verdicts"] == "/tmp/review.csv"
    for bad in (3, "", ["a.csv"]):
        with pytest.raises(audit.AuditInputError, match="review_verdicts"):
            audit.settings({"review_verdicts": bad})


# --------------------------------------------------------------------------- applying
def test_same_on_a_rejected_crossing_pair_trusts_it_and_joins_its_groups(table) -> None:
    rows, relationships, hashes = table
    before = audit.crossing_counts(relationships)
    judged = verdicts.check_verdicts(pd.DataFrame({"rel_path_a": ["train/apple/a.png"],
                                                   "rel_path_b": ["test/apple/b.png"], "verdict": ["same"]}))
    applied, report = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    pair = _pair(applied, "train/apple/a.png", "test/apple/b.png")
    assert pair["trusted"] and pair["verified_by"] == "reviewer" and pair["reviewer_verdict"] == "same"
    assert pair["proposed_by"] == "embedding" and pair["leaf_ssim"] == 0.85   # the evidence is kept
    assert audit.crossing_counts(applied)["near"] == before["near"] + 1
    before_groups = audit.leakage_groups(rows["row_id"], relationships).set_index("row_id")["group_id"]
    groups = audit.leakage_groups(rows["row_id"], applied).set_index("row_id")["group_id"]
    assert before_groups["r0"] != before_groups["r1"] and groups["r0"] == groups["r1"]
    assert report["confirmed_new"] == report["confirmed_crossing"] == 1 and report["added"] == 0
    assert not applied["label_conflict"].any()


def test_a_confirmed_pair_with_two_labels_is_a_label_conflict(table) -> None:
    rows, relationships, hashes = table
    relationships.loc[relationships["rel_path_b"] == "train/apple/a.png", "class_b"] = "pear"
    judged = pd.DataFrame({"rel_path_a": ["train/apple/a.png"], "rel_path_b": ["test/apple/b.png"],
                           "verdict": ["same"]})
    applied, _ = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    assert not relationships["label_conflict"].any()   # untrusted pairs are just similar images
    assert _pair(applied, "train/apple/a.png", "test/apple/b.png")["label_conflict"]


def test_same_on_a_pair_nobody_proposed_adds_a_reviewer_row_computed_like_the_others(table) -> None:
    rows, relationships, hashes = table
    judged = verdicts.check_verdicts(pd.DataFrame({"rel_path_a": ["train/pear/e.png"],
                                                   "rel_path_b": ["test/apple/d.png"], "verdict": ["same"]}))
    applied, report = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    assert len(applied) == len(relationships) + 1
    assert list(applied.columns) == [*audit.RELATIONSHIP_COLUMNS, "reviewer_verdict"]
    row = _pair(applied, "train/pear/e.png", "test/apple/d.png")
    assert (row["rel_path_a"], row["kind"], row["proposed_by"], row["verified_by"]) == (
        "test/apple/d.png", "near", "reviewer", "reviewer")
    assert row["trusted"] and row["crosses_split"] and (row["split_a"], row["split_b"]) == ("test", "train")
    assert row["label_conflict"] and (row["class_a"], row["class_b"]) == ("apple", "pear")
    # from the fingerprints, as relationship_table computes them: 7 ^ 15 and 1 ^ 3 differ in one bit
    assert row["phash_distance"] == 1 and row["dhash_distance"] == 1 and pd.isna(row["verify_score"])
    assert (applied["rel_path_a"] < applied["rel_path_b"]).all()
    ends = applied[["rel_path_a", "rel_path_b"]]   # in the order relationship_table gives
    assert ends.equals(ends.sort_values(["rel_path_a", "rel_path_b"]).reset_index(drop=True))
    assert report == {**report, "judged": 1, "same": 1, "confirmed_new": 1, "added": 1,
                      "confirmed_crossing": 1}
    groups = audit.leakage_groups(rows["row_id"], applied).set_index("row_id")["group_size"]
    assert groups["r4"] == groups["r3"] == 3   # e joins c~d


def test_different_on_a_trusted_pair_is_reported_not_untrusted(table) -> None:
    rows, relationships, hashes = table
    judged = verdicts.check_verdicts(pd.DataFrame({
        "rel_path_a": ["test/apple/d.png", "train/pear/e.png"], "rel_path_b": ["train/apple/c.png",
                                                                              "test/pear/f.png"],
        "verdict": ["different", "different"]}))
    applied, report = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    trusted = _pair(applied, "train/apple/c.png", "test/apple/d.png")
    assert trusted["trusted"] and trusted["verified_by"] == "ssim"
    assert trusted["reviewer_verdict"] == "different"
    assert not _pair(applied, "train/pear/e.png", "test/pear/f.png")["trusted"]
    assert audit.crossing_counts(applied) == audit.crossing_counts(relationships)
    assert report["different"] == 2 and report["different_but_trusted"] == 1 and report["confirmed_new"] == 0
    assert report["disagreements"] == [{"rel_path_a": "test/apple/d.png", "rel_path_b": "train/apple/c.png",
                                        "kind": "near", "verified_by": "ssim"}]
    text = audit.verdicts_text({"pairs": 1, "sheet": verdicts.SHEET,
                                "verdicts": {**report, "file": "/r/review.csv", "sha256": "ab" * 32,
                                             "copy": verdicts.GIVEN}})
    assert "**1** pairs judged `different` are trusted by a verifier and stay trusted" in text
    assert "`test/apple/d.png` ~ `train/apple/c.png` (near, ssim)" in text


def test_judged_pairs_leave_the_review_list_and_no_verdicts_change_nothing(table) -> None:
    rows, relationships, hashes = table
    untouched, report = verdicts.apply_verdicts(relationships, rows, hashes, None)
    assert untouched.drop(columns="reviewer_verdict").equals(relationships)
    assert untouched["reviewer_verdict"].isna().all() and report["judged"] == 0
    listed = verdicts.unjudged(review_pairs(untouched, 0.8, 20, 0.7))
    assert len(listed) == 2
    judged = verdicts.check_verdicts(pd.DataFrame({"rel_path_a": ["train/pear/e.png"],
                                                   "rel_path_b": ["test/pear/f.png"],
                                                   "verdict": ["different"]}))
    applied, _ = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    left = verdicts.unjudged(review_pairs(applied, 0.8, 20, 0.7))
    assert left[["rel_path_a", "rel_path_b"]].values.tolist() == [["test/apple/b.png", "train/apple/a.png"]]


def test_apply_refuses_a_path_that_is_not_an_admitted_row(table) -> None:
    rows, relationships, hashes = table
    stray = pd.DataFrame({"rel_path_a": ["train/apple/a.png"], "rel_path_b": ["elsewhere/x.png"],
                          "verdict": ["same"]})
    with pytest.raises(audit.AuditInputError, match="not an admitted image"):
        verdicts.apply_verdicts(relationships, rows, hashes, stray)


# --------------------------------------------------------------------------- the sheet
def test_the_sheet_lists_the_review_list_crossing_first_with_every_score_and_round_trips(table, tmp_path):
    rows, relationships, hashes = table
    review = review_pairs(relationships, 0.8, 20, 0.7).assign(reshot_ssim=[0.7, 0.6])  # a future score
    review.loc[review["rel_path_a"] == "test/apple/b.png", "crosses_split"] = False  # listed first
    sheet = verdicts.review_sheet(review)
    assert list(sheet.columns[:13]) == [*verdicts.SHEET_COLUMNS, "leaf_ssim", "geometry_inliers",
                                        "geometry_ratio", "geometry_ssim", "verify_score"]
    assert "reshot_ssim" in sheet and "phash_distance" in sheet and sheet.columns[-1] == "verdict"
    assert not {"trusted", "review_leaf", "label_conflict", "geometry_mirrored"} & set(sheet.columns)
    assert sheet["crosses_split"].tolist() == [True, False] and (sheet["verdict"] == "").all()
    assert sheet["rel_path_a"].tolist() == ["test/pear/f.png", "test/apple/b.png"]  # crossing first

    path = tmp_path / "review.csv"
    path.write_text(sheet.to_csv(index=False))
    filled = pd.read_csv(path, dtype=str, keep_default_na=False)
    filled.loc[1, "verdict"] = "same"
    filled.to_csv(path, index=False)
    judged = verdicts.read_verdicts(path, rows["rel_path"])
    assert judged[["rel_path_a", "rel_path_b", "verdict", "line"]].values.tolist() == [
        ["test/apple/b.png", "train/apple/a.png", "same", 3]]
    applied, report = verdicts.apply_verdicts(relationships, rows, hashes, judged)
    assert _pair(applied, "train/apple/a.png", "test/apple/b.png")["trusted"] and report["confirmed_new"] == 1


# --------------------------------------------------------------------------- the chapter's round trip
def _texture(seed: int, side: int = 64) -> Image.Image:
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(side, side, 3)), (4, 4, 0))
    return Image.fromarray((30 + 200 * (field - field.min()) / (field.max() - field.min())).astype(np.uint8))


def test_the_chapter_writes_the_sheet_and_applies_a_verdict_file(tmp_path) -> None:
    from cropcop_utils import corpus
    from cropcop_utils.core import config
    from cropcop_utils.core.evidence import sha256_file, verify_registry

    root = tmp_path / "lab"
    for k in range(6):  # unrelated pictures: nothing is proposed, nothing is trusted
        path = root / ("train" if k % 2 else "test") / ("apple" if k < 3 else "pear") / f"x{k}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        _texture(k).save(path)
    fast = {"embedding_k": 0, "words_k": 0, "workers": 1}
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(root), overrides={"audit": fast})
    corpus.run_chapter(ctx, progress=False)
    first = audit.run_chapter(ctx, progress=False)["figures"]
    assert first["crossings"]["total"] == 0 and first["review"]["verdicts"]["file"] is None
    assert (tmp_path / "run" / verdicts.SHEET).read_text().startswith(
        "rel_path_a,rel_path_b,class_a,class_b,split_a,split_b,crosses_split,review_reason,")
    assert "No verdicts have been given back yet" in audit.verdicts_text(first["review"])

    filled = _sheet(tmp_path, HEADER + "test/apple/x0.png,train/apple/x1.png,same\n"
                                       "test/pear/x4.png,train/pear/x5.png,different\n")
    ctx = config.open_run(tmp_path / "run2", profile="smoke", data=str(root),
                          overrides={"audit": {**fast, "review_verdicts": str(filled)}})
    corpus.run_chapter(ctx, progress=False)
    record = audit.run_chapter(ctx, progress=False)
    facts, run = record["figures"], tmp_path / "run2"
    assert facts["review"]["verdicts"] == {
        "file": str(filled), "sha256": sha256_file(filled), "copy": verdicts.GIVEN, "judged": 2, "same": 1,
        "different": 1, "confirmed_new": 1, "confirmed_crossing": 1, "added": 1, "different_but_trusted": 0,
        "disagreements": []}
    assert facts["crossings"]["near"] == 1 and facts["inherited_partition"]["decision"] == "reject"
    assert (run / verdicts.GIVEN).read_bytes() == filled.read_bytes()
    assert {verdicts.SHEET, verdicts.GIVEN} <= set(record["outputs"])
    assert verify_registry(run)["matches"].all()
    relationships = pd.read_parquet(run / "audit/relationships.parquet")
    confirmed = _pair(relationships, "test/apple/x0.png", "train/apple/x1.png")
    assert confirmed["trusted"] and confirmed["verified_by"] == "reviewer"
    groups = pd.read_parquet(run / "audit/groups.parquet")
    assert groups["group_size"].max() == 2 and facts["groups"]["groups_across_inherited_splits"] == 1
    text = audit.verdicts_text(json.loads((run / "audit/audit.json").read_text())["figures"]["review"])
    assert "**2** verdicts were given back" in text and "confirmed **1** pairs" in text

    filled.write_text(HEADER + "test/apple/x0.png,train/apple/x9.png,same\n")   # a typo stops the chapter
    with pytest.raises(audit.AuditInputError, match="not an admitted image"):
        audit.run_chapter(ctx, progress=False)
