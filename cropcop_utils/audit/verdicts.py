"""A reviewer's verdicts on the review list, given back to the audit.

Chapter 2 writes its whole review list (rejected near pairs worth a human look) as ``audit/review.csv``
(:func:`review_sheet`) with an empty ``verdict`` column.  A person writes ``same`` (one leaf, or one
picture) or ``different`` beside the pairs they judged, leaves the rest blank, and gives the file back
(``--review-verdicts PATH``, the setting ``audit.review_verdicts``).  :func:`read_verdicts` checks it
against the admitted rows before the audit starts; :func:`apply_verdicts` folds it into the relationship
table before the leakage groups form:

* ``same`` — the pair is trusted and ``reviewer`` joins its ``verified_by``; a pair no source proposed
  gets a near row of its own (``proposed_by`` = ``verified_by`` = ``reviewer``), so it joins a leakage
  group, the crossings and, through ``audit/groups.parquet``, chapter 3's split.
* ``different`` — an untrusted pair stays untrusted.  A pair a verifier trusted stays trusted and is
  reported as a disagreement (``different_but_trusted``): a verdict never silently undoes the evidence.

Every judged pair carries its verdict in ``reviewer_verdict`` and leaves the next review list
(:func:`unjudged`), so a reviewer is never asked twice.  Pairs are unordered: (a, b) is (b, a).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.evidence import Chapter, atomic_write_bytes, atomic_write_text, sha256_bytes
from .errors import AuditInputError
from .figures import review_sample
from .hashing import ImageHashes
from .relations import KINDS, NEAR_COLUMNS, RELATIONSHIP_COLUMNS, relationship_table

SHEET = "audit/review.csv"              # the review list for a person to fill
GIVEN = "audit/review_verdicts.csv"     # a byte copy of the verdict file the audit applied
VERDICTS = ("same", "different")
NEEDS = ("rel_path_a", "rel_path_b", "verdict")
VERDICT_COLUMN = "reviewer_verdict"
REVIEWER = "reviewer"
SHEET_COLUMNS = ["rel_path_a", "rel_path_b", "class_a", "class_b", "split_a", "split_b", "crosses_split",
                 "review_reason"]
# the scores that put a pair on the list come first; every other numeric score follows as recorded
FIRST_SCORES = ["leaf_ssim", "geometry_inliers", "geometry_ratio", "geometry_ssim", "verify_score"]
SHOWN = 10  # offending lines named in an error


# --------------------------------------------------------------------------- export
def _is_score(column: pd.Series) -> bool:
    if pd.api.types.is_bool_dtype(column):
        return False
    return pd.api.types.is_numeric_dtype(column) or pd.api.types.infer_dtype(column, skipna=True) in (
        "integer", "floating", "mixed-integer-float")


def review_sheet(review: pd.DataFrame) -> pd.DataFrame:
    """The review list as a sheet to fill: both paths (relative to the corpus root), classes, inherited
    splits, whether the pair crosses them, why it is listed, every numeric score the relationship table
    records (new score columns are copied through) and an empty ``verdict``; crossing pairs first, in
    :func:`~.figures.review_sample`'s order."""
    ordered = review_sample(review, len(review))
    scores = [c for c in ordered.columns if c not in SHEET_COLUMNS and _is_score(ordered[c])]
    scores = [c for c in FIRST_SCORES if c in scores] + [c for c in scores if c not in FIRST_SCORES]
    return ordered[SHEET_COLUMNS + scores].assign(verdict="")


def unjudged(review: pd.DataFrame) -> pd.DataFrame:
    """The review list without the pairs a reviewer already judged."""
    if VERDICT_COLUMN not in review:
        return review
    return review[review[VERDICT_COLUMN].isna()]


# --------------------------------------------------------------------------- reading
def _lines(frame: pd.DataFrame, mask: np.ndarray) -> str:
    lines = frame.loc[mask, "line"].tolist()
    return ", ".join(str(n) for n in lines[:SHOWN]) + (f" (and {len(lines) - SHOWN} more)"
                                                        if len(lines) > SHOWN else "")


def check_verdicts(frame: pd.DataFrame, admitted: Iterable[str] | None = None,
                   source: str = "the review verdicts") -> pd.DataFrame:
    """The judged pairs of a filled sheet, checked: ``rel_path_a`` < ``rel_path_b``, ``verdict`` (``same``
    / ``different``) and ``line`` (its line in the CSV; rows without one count from line 2).

    Blank verdicts are pairs not judged yet and are dropped unread.  An unknown verdict word, a judged
    path that is not in ``admitted`` (when given), a pair of one path with itself, or one pair given two
    different verdicts raise :class:`AuditInputError` naming the lines; a pair given twice alike counts
    once.
    """
    missing = [c for c in NEEDS if c not in frame.columns]
    if missing:
        raise AuditInputError(f"{source} lacks column(s) {missing}: it needs {', '.join(NEEDS)}, as "
                              f"{SHEET} has them")
    table = pd.DataFrame({c: frame[c].astype(object).where(frame[c].notna(), "").astype(str).str.strip()
                          for c in NEEDS})
    table["verdict"] = table["verdict"].str.lower()
    table["line"] = frame["line"].to_numpy() if "line" in frame else np.arange(2, len(frame) + 2)
    unknown = ~table["verdict"].isin(("", *VERDICTS)).to_numpy()
    if unknown.any():
        words = sorted(set(table.loc[unknown, "verdict"]))[:SHOWN]
        raise AuditInputError(f"{source}: unknown verdict(s) {words} on line(s) {_lines(table, unknown)}; "
                              "write same, different, or leave it blank (not judged yet)")
    table = table[table["verdict"] != ""].reset_index(drop=True)
    blank = ((table["rel_path_a"] == "") | (table["rel_path_b"] == "")).to_numpy()
    if blank.any():
        raise AuditInputError(f"{source}: a judged pair lacks a path on line(s) {_lines(table, blank)}")
    itself = (table["rel_path_a"] == table["rel_path_b"]).to_numpy()
    if itself.any():
        raise AuditInputError(f"{source}: a pair of one image with itself on line(s) {_lines(table, itself)}")
    if admitted is not None:
        known = set(admitted)
        stray = ~(table["rel_path_a"].isin(known) & table["rel_path_b"].isin(known)).to_numpy()
        if stray.any():
            first = next(p for p in table.loc[stray, ["rel_path_a", "rel_path_b"]].to_numpy().ravel()
                         if p not in known)
            raise AuditInputError(f"{source}: line(s) {_lines(table, stray)} name a path that is not an "
                                  f"admitted image of this corpus (e.g. {first!r}); paths are relative to "
                                  f"the corpus root, as {SHEET} writes them")
    a, b = table["rel_path_a"].to_numpy(object), table["rel_path_b"].to_numpy(object)
    table["rel_path_a"], table["rel_path_b"] = np.where(a < b, a, b), np.where(a < b, b, a)
    kinds = table.groupby(["rel_path_a", "rel_path_b"])["verdict"].transform("nunique")
    torn = (kinds > 1).to_numpy()
    if torn.any():
        pair = table.loc[torn].iloc[0]
        raise AuditInputError(f"{source}: {pair['rel_path_a']} ~ {pair['rel_path_b']} is judged both same "
                              f"and different (lines {_lines(table, torn)}); keep one verdict per pair")
    return table.drop_duplicates(["rel_path_a", "rel_path_b"]).reset_index(drop=True)


def _file_bytes(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise AuditInputError(f"audit.review_verdicts {path}: cannot read it ({error.strerror})") from None


def read_verdicts(source: str | os.PathLike | bytes, admitted: Iterable[str] | None = None,
                  name: str | None = None) -> pd.DataFrame:
    """Read a filled review sheet (a path, or its bytes) and :func:`check_verdicts` it.  A spreadsheet's
    byte-order mark and blank cells are accepted; a file that is not a CSV raises
    :class:`AuditInputError`, never a parser's traceback."""
    name = name or (str(source) if not isinstance(source, bytes) else "the review verdicts")
    data = source if isinstance(source, bytes) else _file_bytes(source)
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise AuditInputError(f"{name} is not a readable CSV sheet ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); fill in {SHEET} "
                              "and give that file") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    frame["line"] = np.arange(2, len(frame) + 2)
    return check_verdicts(frame, admitted, name)


# --------------------------------------------------------------------------- the chapter's part
def take_given(ch: Chapter, path: str | None, admitted: Iterable[str]) -> tuple[pd.DataFrame | None,
                                                                                 dict[str, Any]]:
    """Read the verdict file once, check it against the admitted paths and keep a byte copy in the run
    folder (:data:`GIVEN`, registered), so the groups trace to the verdicts that made them.  Returns the
    judged pairs (None without a file) and the file's path and SHA-256 for the chapter's record."""
    if path is None:
        return None, {"file": None, "sha256": None, "copy": None}
    data = _file_bytes(path)
    table = read_verdicts(data, admitted, name=str(path))
    atomic_write_bytes(ch.path(GIVEN), data)
    ch.record_output(GIVEN)
    return table, {"file": str(path), "sha256": sha256_bytes(data), "copy": GIVEN}


def write_sheet(ch: Chapter, review: pd.DataFrame) -> str:
    """Write the review list as :data:`SHEET` (atomic, registered); returns its SHA-256."""
    atomic_write_text(ch.path(SHEET), review_sheet(review).to_csv(index=False))
    return ch.record_output(SHEET)


# --------------------------------------------------------------------------- applying
def _reviewer_rows(pairs: pd.DataFrame, rows: pd.DataFrame, hashes: ImageHashes) -> pd.DataFrame:
    """Near rows for pairs no source proposed, built by :func:`~.relations.relationship_table` so every
    derived column (hash distances, classes, splits, crossing, label conflict) is computed as for the
    others.  Positions go in path order, so the table never swaps them (a swap would invert a dihedral
    transform, and a reviewer's pair has none)."""
    position = pd.Index(rows["rel_path"])
    near = pd.DataFrame({"i": position.get_indexer(pairs["rel_path_a"]).astype(np.int64),
                         "j": position.get_indexer(pairs["rel_path_b"]).astype(np.int64)})
    for column in NEAR_COLUMNS:
        near[column] = pd.Series([pd.NA] * len(near), dtype=object)
    near["proposed_by"], near["verified_by"], near["trusted"] = REVIEWER, REVIEWER, True
    exact = pd.DataFrame({"i": np.zeros(0, np.int64), "j": np.zeros(0, np.int64),
                          "kind": np.zeros(0, object)})
    return relationship_table(rows, hashes, exact, near)


def apply_verdicts(relationships: pd.DataFrame, rows: pd.DataFrame, hashes: ImageHashes,
                   verdicts: pd.DataFrame | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The relationship table with the verdicts folded in (module docstring), and what they changed.

    Adds ``reviewer_verdict`` (``same`` / ``different``, null where none was given) in every case, so the
    table has one schema.  The report counts the pairs ``judged``, ``same``, ``different``,
    ``confirmed_new`` (``same`` pairs no verifier had trusted), ``confirmed_crossing`` (of those, the ones
    crossing the inherited split), ``added`` (``same`` pairs no source had proposed) and
    ``different_but_trusted`` (listed in ``disagreements``).
    """
    table = relationships.reset_index(drop=True).copy()
    table[VERDICT_COLUMN] = pd.Series([pd.NA] * len(table), dtype="string")
    report: dict[str, Any] = {k: 0 for k in ("judged", "same", "different", "confirmed_new",
                                             "confirmed_crossing", "added", "different_but_trusted")}
    report["disagreements"] = []
    if verdicts is None or verdicts.empty:
        return table, report
    verdicts = check_verdicts(verdicts, rows["rel_path"])
    keys = pd.MultiIndex.from_arrays([np.minimum(table["rel_path_a"].to_numpy(object),
                                                 table["rel_path_b"].to_numpy(object)),
                                      np.maximum(table["rel_path_a"].to_numpy(object),
                                                 table["rel_path_b"].to_numpy(object))])
    where = keys.get_indexer(pd.MultiIndex.from_frame(verdicts[["rel_path_a", "rel_path_b"]]))
    found, same = where >= 0, (verdicts["verdict"] == "same").to_numpy()
    table.loc[where[found], VERDICT_COLUMN] = verdicts.loc[found, "verdict"].to_numpy()

    def marked(selected: np.ndarray) -> np.ndarray:  # the table rows of the selected verdicts
        mask = np.zeros(len(table), dtype=bool)
        mask[where[selected]] = True
        return mask

    trusted = table["trusted"].to_numpy(dtype=bool)
    confirm, disputed = marked(found & same) & ~trusted, marked(found & ~same) & trusted
    # reviewer joins the verifiers of every near pair judged same (its own confirmation, or agreement)
    near_same = marked(found & same) & (table["kind"] == "near").to_numpy()
    table.loc[near_same, "verified_by"] = [f"{v}+{REVIEWER}" if v else REVIEWER
                                           for v in table.loc[near_same, "verified_by"].fillna("")]
    table.loc[confirm, "trusted"] = True
    table["label_conflict"] = table["trusted"] & (table["class_a"] != table["class_b"])
    added = _reviewer_rows(verdicts[~found & same], rows, hashes)
    added[VERDICT_COLUMN] = pd.array(["same"] * len(added), dtype="string")
    report.update(judged=len(verdicts), same=int(same.sum()), different=int((~same).sum()),
                  confirmed_new=int(confirm.sum()) + len(added), added=len(added),
                  confirmed_crossing=int((confirm & table["crosses_split"].to_numpy(dtype=bool)).sum()
                                         + added["crosses_split"].sum()),
                  different_but_trusted=int(disputed.sum()),
                  disagreements=table.loc[disputed, ["rel_path_a", "rel_path_b", "kind", "verified_by"]]
                  .head(200).to_dict("records"))
    if len(added):
        table = pd.concat([table, added[table.columns]], ignore_index=True)
    # the order relationship_table gives: by kind, then paths
    rank = table["kind"].map({k: n for n, k in enumerate(KINDS)})
    table = table.assign(_rank=rank).sort_values(["_rank", "rel_path_a", "rel_path_b"], kind="stable")
    return table.drop(columns="_rank").reset_index(drop=True)[[*RELATIONSHIP_COLUMNS, VERDICT_COLUMN]], report
