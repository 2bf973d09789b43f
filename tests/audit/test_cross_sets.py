"""The cross-set audit: lab, field-train and a field cohort audited together; the tables, groups and block
it writes, and the lab audit left as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image, PngImagePlugin
from scipy.ndimage import gaussian_filter

from cropcop_utils import audit
from cropcop_utils.audit import cross_sets
from cropcop_utils.core.config import load_profile
from cropcop_utils.core.evidence import row_id, sha256_file
from cropcop_utils.corpus.field_sets import field_row_id, scan_field

FAST = {**load_profile("default")["audit"], "workers": 1}
CLASSES = ["Apple_healthy", "Apple_rust", "Apple_scab"]
COHORT = "cohort:orchard"


# --------------------------------------------------------------------------- fixtures
def _texture(seed: int, side: int = 96) -> Image.Image:
    """A smooth random colour picture: unrelated seeds are far apart in pHash space."""
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(side, side, 3)), (4, 4, 0))
    field = (field - field.min()) / (field.max() - field.min())
    return Image.fromarray((30 + 200 * field).astype(np.uint8))


def _encode(img: Image.Image, fmt: str = "PNG", text: str | None = None) -> bytes:
    buffer = io.BytesIO()
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        if text:
            info.add_text("Comment", text)
        img.save(buffer, format="PNG", pnginfo=info)
    else:
        img.save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def _write(root: Path, rel: str, data: bytes) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


def build_folders(base: Path) -> tuple[Path, Path, Path]:
    """Three folders: a lab corpus, a field-train folder and a cohort, related across sets by a byte
    copy (lab → field-train), a re-saved copy (field-train → cohort, other metadata: identical pixels),
    a byte copy filed under another class (a label conflict), a JPEG re-encoding (near) and a chain
    through all three (lab → field-train → cohort); plus unrelated photos in every set."""
    lab, train, cohort = base / "lab", base / "field_train", base / "orchard"
    t = {seed: _texture(seed) for seed in range(1, 13)}
    _write(lab, "Apple_scab/l1.png", _encode(t[1]))
    _write(lab, "Apple_scab/l2.png", _encode(t[2]))
    _write(lab, "Apple_rust/l3.png", _encode(t[3]))
    _write(lab, "Apple_rust/l9.png", _encode(t[9]))
    _write(train, "Apple_scab/t1.png", _encode(t[1]))                       # byte copy of lab l1
    _write(train, "Apple_rust/t4.png", _encode(t[4]))
    _write(train, "Apple_scab/t5.png", _encode(t[5]))
    _write(train, "Apple_healthy/t6.png", _encode(t[6]))
    _write(train, "Apple_healthy/t10.png", _encode(t[10]))                  # unrelated
    _write(train, "Apple_rust/t9.png", _encode(t[9]))                       # byte copy of lab l9 ...
    _write(cohort, "Apple_rust/c4.png", _encode(t[4], text="re-saved"))     # pixels of t4
    _write(cohort, "Apple_healthy/c5.png", _encode(t[5]))                   # t5's bytes, another label
    _write(cohort, "Apple_healthy/c6.jpg", _encode(t[6], "JPEG"))           # t6 re-encoded
    _write(cohort, "Apple_rust/c9.png", _encode(t[9], text="again"))        # ... and on to the cohort
    _write(cohort, "Apple_scab/c11.png", _encode(t[11]))                    # unrelated
    _write(cohort, "Apple_rust/c12.png", _encode(t[12]))                    # unrelated
    return lab, train, cohort


def lab_rows(root: Path) -> pd.DataFrame:
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    return pd.DataFrame({"row_id": [row_id(r) for r in rels], "rel_path": rels,
                         "class_name": [r.split("/")[0] for r in rels], "inherited_split": "none",
                         "sha256": [sha256_file(root / r) for r in rels], "admitted": True})


def audit_sets_of(lab: Path, train: Path, cohort: Path) -> list[cross_sets.AuditSet]:
    """The three sets as the chapter builds them: lab rows, field-train and cohort scanned."""
    train_rows = scan_field(train, CLASSES, row_prefix="field_train").rows
    return [cross_sets.AuditSet("lab", lab, lab_rows(lab)),
            cross_sets.AuditSet("field_train", train, train_rows),
            cross_sets.AuditSet(COHORT, cohort, scan_field(cohort, CLASSES).rows)]


@pytest.fixture(scope="module")
def crossed(tmp_path_factory):
    result = cross_sets.audit_sets(audit_sets_of(*build_folders(tmp_path_factory.mktemp("sets"))), FAST,
                                   workers=1)
    return result, cross_sets.cross_block(result, FAST, {})


def _trusted(table: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    t = table[table["trusted"]]
    return {(f"{a}/{ra}", f"{b}/{rb}"): row for (a, ra, b, rb), row in
            zip(t[["set_a", "rel_path_a", "set_b", "rel_path_b"]].itertuples(index=False), t.itertuples(),
                strict=True)}


# --------------------------------------------------------------------------- the table
def test_every_relationship_across_sets_is_found_with_its_kind(crossed) -> None:
    result, _ = crossed
    pairs = {key: row.kind for key, row in _trusted(result.table).items()}
    assert pairs == {
        ("lab/Apple_scab/l1.png", "field_train/Apple_scab/t1.png"): "exact_bytes",
        ("lab/Apple_rust/l9.png", "field_train/Apple_rust/t9.png"): "exact_bytes",
        ("lab/Apple_rust/l9.png", f"{COHORT}/Apple_rust/c9.png"): "exact_pixels",
        ("field_train/Apple_rust/t9.png", f"{COHORT}/Apple_rust/c9.png"): "exact_pixels",
        ("field_train/Apple_rust/t4.png", f"{COHORT}/Apple_rust/c4.png"): "exact_pixels",
        ("field_train/Apple_scab/t5.png", f"{COHORT}/Apple_healthy/c5.png"): "exact_bytes",
        ("field_train/Apple_healthy/t6.png", f"{COHORT}/Apple_healthy/c6.jpg"): "near",
    }


def test_the_table_holds_paths_relative_to_each_set_and_its_ids(crossed) -> None:
    result, _ = crossed
    table = result.table
    assert list(table.columns) == cross_sets.CROSS_COLUMNS
    assert not ((table["set_a"] == "lab") & (table["set_b"] == "lab")).any()  # the lab audit's own
    for side in ("a", "b"):
        assert not table[f"rel_path_{side}"].str.startswith("/").any()
    cohort_side = table[table["set_b"] == COHORT]
    assert (cohort_side["row_id_b"] == cohort_side["rel_path_b"].map(field_row_id)).all()  # chapter 10's ids
    train_side = table[table["set_a"] == "field_train"]
    assert (train_side["row_id_a"] == [row_id(f"field_train/{r}") for r in train_side["rel_path_a"]]).all()
    order = {"lab": 0, "field_train": 1, COHORT: 2}
    assert (table["set_a"].map(order) <= table["set_b"].map(order)).all()


def test_a_label_conflict_across_sets_is_flagged_with_both_labels(crossed) -> None:
    result, block = crossed
    conflicts = result.table[result.table["label_conflict"]]
    assert len(conflicts) == 1
    row = conflicts.iloc[0]
    assert (row["rel_path_a"], row["class_name_a"], row["rel_path_b"], row["class_name_b"]) == \
        ("Apple_scab/t5.png", "Apple_scab", "Apple_healthy/c5.png", "Apple_healthy")
    assert block["label_conflicts"]["across_sets"] == 1
    assert block["label_conflicts"]["within_sets"] == {"field_train": 0, COHORT: 0}
    assert block["label_conflicts"]["pairs"][0]["rel_path_b"] == "Apple_healthy/c5.png"


# --------------------------------------------------------------------------- groups
def test_groups_cover_every_row_of_every_set_and_follow_trusted_pairs(crossed) -> None:
    result, _ = crossed
    groups = result.groups
    assert list(groups.columns) == cross_sets.GROUP_COLUMNS
    assert groups.groupby("set").size().to_dict() == {"lab": 4, "field_train": 6, COHORT: 6}
    by = groups.set_index(["set", "rel_path"])
    chain = [("lab", "Apple_rust/l9.png"), ("field_train", "Apple_rust/t9.png"),
             (COHORT, "Apple_rust/c9.png")]
    assert by.loc[chain, "group_id"].nunique() == 1 and by.loc[chain[0], "group_size"] == 3
    assert by.loc[chain[0], "group_sets"] == f"lab+field_train+{COHORT}"
    for alone in (("field_train", "Apple_healthy/t10.png"), (COHORT, "Apple_scab/c11.png"),
                  ("lab", "Apple_scab/l2.png")):
        assert by.loc[alone, "group_size"] == 1 and by.loc[alone, "group_sets"] == alone[0]
    near = [(COHORT, "Apple_healthy/c6.jpg"), ("field_train", "Apple_healthy/t6.png")]
    assert by.loc[near, "group_id"].nunique() == 1


# --------------------------------------------------------------------------- the block
def test_block_counts_sets_pairs_relatives_and_the_largest_group(crossed) -> None:
    _, block = crossed
    assert [(s["name"], s["rows"]) for s in block["sets"]] == [("lab", 4), ("field_train", 6), (COHORT, 6)]
    pairs = {(p["set_a"], p["set_b"]): p for p in block["by_set_pair"]}
    assert set(pairs) == {("lab", "field_train"), ("lab", COHORT), ("field_train", "field_train"),
                          ("field_train", COHORT), (COHORT, COHORT)}
    assert (pairs[("lab", "field_train")]["exact_bytes"], pairs[("lab", COHORT)]["exact_pixels"]) == (2, 1)
    ft_cohort = pairs[("field_train", COHORT)]
    assert (ft_cohort["exact_bytes"], ft_cohort["exact_pixels"], ft_cohort["near"]) == (1, 2, 1)
    assert ft_cohort["label_conflicts"] == 1
    assert block["across_sets"]["exact_copies"] == 6 and block["across_sets"]["trusted"] == 7
    cohort = block["relatives"][COHORT]
    assert cohort["rows"] == 6
    assert cohort["with_relative_in"]["field_train"] == {"directly": 4, "in_group": 4}
    assert cohort["with_relative_in"]["lab"] == {"directly": 1, "in_group": 1}
    assert block["relatives"]["field_train"]["with_relative_in"]["lab"] == {"directly": 2, "in_group": 2}
    largest = block["groups"]["largest_across_sets"]
    assert largest["size"] == 3 and largest["by_set"] == {"lab": 1, "field_train": 1, COHORT: 1}
    assert block["groups"]["groups_across_sets"] == 5
    json.dumps(block, allow_nan=False)  # audit.json holds it as it is


def test_cohort_relative_through_a_chain_counts_in_group_not_directly(tmp_path) -> None:
    """A cohort photo related to the lab only through a field-train photo: in the group, not direct."""
    sets = audit_sets_of(*build_folders(tmp_path))
    table = pd.DataFrame({  # t1 ~ c11 (trusted) and l1 = t1: c11 reaches the lab through t1 only
        "set_a": ["lab", "field_train"], "row_id_a": [row_id("Apple_scab/l1.png"),
                                                      row_id("field_train/Apple_scab/t1.png")],
        "set_b": ["field_train", COHORT], "row_id_b": [row_id("field_train/Apple_scab/t1.png"),
                                                       field_row_id("Apple_scab/c11.png")],
        "trusted": True, "crosses_sets": True})
    union = cross_sets.union_rows(sets)
    groups = audit.leakage_groups(union["row_id"], table.assign(kind="near"))
    counted = cross_sets.relatives(table, cross_sets.cross_groups(groups, union), [s.name for s in sets])
    assert counted[COHORT]["with_relative_in"]["lab"] == {"directly": 0, "in_group": 1}
    assert counted[COHORT]["with_relative_in"]["field_train"] == {"directly": 1, "in_group": 1}


def test_sets_sharing_a_name_or_a_row_id_are_refused(crossed) -> None:
    result, _ = crossed
    lab = result.sets[0]
    with pytest.raises(audit.AuditInputError, match="share a name"):
        cross_sets.union_rows([lab, lab])
    renamed = cross_sets.AuditSet("field_train", lab.root, lab.rows)
    with pytest.raises(audit.AuditInputError, match="row id"):
        cross_sets.union_rows([lab, renamed])


# --------------------------------------------------------------------------- the chapter
LAB_FILES = ("audit/hashes.parquet", "audit/relationships.parquet", "audit/groups.parquet",
             "audit/threshold_table.parquet", "audit/verifier_calibration.parquet", "audit/embedding.npz")


def _chapter(run_dir: Path, lab: Path, **sets: str) -> dict:
    from cropcop_utils.core.config import open_run
    from cropcop_utils.corpus import chapter as corpus

    ctx = open_run(run_dir, profile="smoke", data=str(lab), overrides={"audit": {"workers": 1}}, **sets)
    corpus.run_chapter(ctx, progress=False)
    return audit.run_chapter(ctx, progress=False)


@pytest.fixture(scope="module")
def chapters(tmp_path_factory):
    """The audit chapter on the lab alone, and on the lab with a field-train folder and a cohort."""
    base = tmp_path_factory.mktemp("chapters")
    lab, train, cohort = build_folders(base)
    return {"plain": (base / "plain", _chapter(base / "plain", lab)),
            "with_sets": (base / "with_sets", _chapter(base / "with_sets", lab, field=str(cohort),
                                                       field_train=str(train)))}


def _lab_figures(record: dict) -> dict:
    return {k: v for k, v in record["figures"].items() if k not in ("timings", "cross_sets")}


def test_the_lab_audit_is_unchanged_when_field_sets_are_added(chapters) -> None:
    (_, plain), (_, with_sets) = chapters["plain"], chapters["with_sets"]
    assert plain["figures"]["cross_sets"] is None
    assert _lab_figures(plain) == _lab_figures(with_sets)
    for rel in LAB_FILES:
        assert plain["outputs"][rel] == with_sets["outputs"][rel], rel
    lab_outputs = {rel for rel in plain["outputs"]}
    added = set(with_sets["outputs"]) - lab_outputs
    assert {"audit/cross_sets.parquet", "audit/cross_groups.parquet", "audit/cross_gallery.png"} <= added
    assert all(rel.startswith("audit/cross_") for rel in added)


def test_the_chapter_writes_the_cross_set_evidence(chapters) -> None:
    run_dir, record = chapters["with_sets"]
    block = record["figures"]["cross_sets"]
    assert [s["name"] for s in block["sets"]] == ["lab", "field_train", "cohort:orchard"]
    # the lab has no Apple_healthy: those photos are left out of both field sets (chapter 1 and the scan
    # count them), so only c4 and c9 keep their field-train relative
    scan = block["sets"][2]["scan"]
    assert scan["identity_holds"] and (scan["files_seen"], scan["admitted"], scan["left_out"]) == (6, 4, 2)
    assert [s["rows"] for s in block["sets"]] == [4, 4, 4]
    assert block["relatives"]["cohort:orchard"]["with_relative_in"]["field_train"]["directly"] == 2
    pairs = pd.read_parquet(run_dir / "audit/cross_sets.parquet")
    groups = pd.read_parquet(run_dir / "audit/cross_groups.parquet")
    assert int(pairs["trusted"].sum()) == block["across_sets"]["trusted"] + sum(
        p["trusted"] for p in block["by_set_pair"] if p["set_a"] == p["set_b"])
    assert len(groups) == block["rows_audited"] == 12
    saved = json.loads((run_dir / "audit/audit.json").read_text())["figures"]["cross_sets"]
    assert saved == block


def test_the_section_text_and_table_are_rendered_from_the_block(crossed) -> None:
    _, block = crossed
    block = {**block, "seconds": {"total": 1.0}, "evidence": {"pairs": "p", "groups": "g"}}
    text = audit.cross_sets_text(block)
    assert text.startswith("## Across sources")
    assert f"**{block['across_sets']['trusted']:,}** relationships are trusted" in text
    assert f"Of the {2 + 4} photos of `{COHORT}`" in text  # one sentence per cohort
    table = audit.cross_sets_table(block)
    assert table.index.names == ["set_a", "set_b"] and "trusted (all kinds)" in table.columns
    assert int(table["trusted (all kinds)"].sum()) == sum(p["trusted"] for p in block["by_set_pair"])
