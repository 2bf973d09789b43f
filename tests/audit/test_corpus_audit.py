"""The whole audit of a corpus: exact / near / label-conflict detection, grouping, crossings and the
decision."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageEnhance, PngImagePlugin
from scipy.ndimage import gaussian_filter

from cropcop_utils import audit
from cropcop_utils.core.config import load_profile
from cropcop_utils.core.evidence import row_id, sha256_file

FAST = {**load_profile("default")["audit"], "workers": 1}  # the settings the profile ships, one process


# --------------------------------------------------------------------------- fixtures
def _texture(seed: int, side: int = 96) -> Image.Image:
    """A smooth random colour picture: unrelated seeds are far apart in pHash space."""
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(side, side, 3)), (4, 4, 0))
    field = (field - field.min()) / (field.max() - field.min())
    return Image.fromarray((30 + 200 * field).astype(np.uint8))


def _png_bytes(img: Image.Image, text: str | None = None, exif: Image.Exif | None = None) -> bytes:
    info = PngImagePlugin.PngInfo()
    if text:
        info.add_text("Comment", text)
    buffer = io.BytesIO()
    kwargs = {"exif": exif.tobytes()} if exif is not None else {}
    img.save(buffer, format="PNG", pnginfo=info, **kwargs)
    return buffer.getvalue()


def _jpeg_bytes(img: Image.Image, quality: int = 92) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _write(root: Path, rel: str, data: bytes) -> str:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return rel


def _rows(root: Path, rel_paths: list[str]) -> pd.DataFrame:
    return pd.DataFrame({
        "row_id": [row_id(r) for r in rel_paths], "rel_path": rel_paths,
        "class_name": [r.split("/")[1] for r in rel_paths],
        "inherited_split": [r.split("/")[0] for r in rel_paths],
        "sha256": [sha256_file(root / r) for r in rel_paths], "admitted": True})


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A tiny train/test corpus with every relationship the audit must find, and audited once."""
    root = tmp_path_factory.mktemp("mini_corpus")
    files: list[str] = []
    a1 = _png_bytes(_texture(1))
    files += [_write(root, "train/apple/a1.png", a1), _write(root, "test/apple/a1_copy.png", a1)]
    a2 = _texture(2)
    files += [_write(root, "train/apple/a2.png", _png_bytes(a2)),
              _write(root, "train/apple/a2_resaved.png", _png_bytes(a2, text="re-saved by an editor"))]
    a3 = _png_bytes(_texture(3))
    files += [_write(root, "train/apple/a3.png", a3), _write(root, "train/pear/a3_filed_as_pear.png", a3)]
    base = _texture(4)
    w, h = base.size
    files += [_write(root, "train/apple/n0.png", _png_bytes(base)),
              _write(root, "test/apple/n_reencode.jpg", _jpeg_bytes(base, 60)),
              _write(root, "test/apple/n_resize.png",
                     _png_bytes(base.resize((72, 72), Image.Resampling.LANCZOS))),
              _write(root, "test/apple/n_bright.png",
                     _png_bytes(ImageEnhance.Brightness(base).enhance(1.12))),
              _write(root, "test/apple/n_crop.png",
                     _png_bytes(base.crop((3, 2, w - 2, h - 3)).resize((w, h), Image.Resampling.BICUBIC)))]
    # A chain c1 ~ c2 ~ c3 where c1 and c3 are only related through c2.
    c1 = _texture(10)
    c2 = ImageEnhance.Brightness(c1).enhance(0.88)
    c3 = c2.crop((4, 4, w - 4, h - 4)).resize((w, h), Image.Resampling.BICUBIC)
    files += [_write(root, f"train/pear/c{k}.png", _png_bytes(img)) for k, img in ((1, c1), (2, c2), (3, c3))]
    # Stored sideways with EXIF orientation 6: upright, it is the same picture as u.png.
    upright = _texture(11)
    exif = Image.Exif()
    exif[0x0112] = 6
    files += [_write(root, "train/pear/u.png", _png_bytes(upright)),
              _write(root, "test/pear/u_sideways.png",
                     _png_bytes(upright.transpose(Image.Transpose.ROTATE_90), exif=exif))]
    # Copies an augmenting tool leaves beside the original (all in train: they add no crossing).
    m0 = _texture(40)
    mirror, turn = m0.transpose(Image.Transpose.FLIP_LEFT_RIGHT), m0.transpose(Image.Transpose.ROTATE_90)
    files += [_write(root, "train/pear/m0.png", _png_bytes(m0)),
              _write(root, "train/pear/m_mirror.png", _png_bytes(mirror)),
              _write(root, "train/pear/m_turn.png", _png_bytes(turn))]
    files += [_write(root, f"{'train' if s % 2 else 'test'}/pear/other_{s}.png", _png_bytes(_texture(s)))
              for s in range(20, 32)]
    rows = _rows(root, files)
    result = audit.audit_corpus(rows, root, FAST)
    return root, rows, result


def _pair(result: audit.AuditResult, a: str, b: str) -> pd.Series:
    rel = result.relationships
    pair = {a, b}
    hit = rel[[{x, y} == pair for x, y in zip(rel["rel_path_a"], rel["rel_path_b"], strict=True)]]
    assert len(hit) == 1, f"expected one relationship {a} ~ {b}, found {len(hit)}"
    return hit.iloc[0]


# --------------------------------------------------------------------------- detection
def test_byte_copy_is_exact_bytes_and_crosses_the_split(mini) -> None:
    _, _, result = mini
    pair = _pair(result, "train/apple/a1.png", "test/apple/a1_copy.png")
    assert pair["kind"] == "exact_bytes" and pair["trusted"] and pair["crosses_split"]
    assert pair["phash_distance"] == 0 and pair["verify_score"] == 1.0


def test_resaved_file_is_exact_pixels_recorded_once(mini) -> None:
    _, _, result = mini
    assert _pair(result, "train/apple/a2.png", "train/apple/a2_resaved.png")["kind"] == "exact_pixels"
    # a byte copy is also pixel-identical, but each pair appears once with its strongest kind
    rel = result.relationships
    assert not rel.duplicated(["row_id_a", "row_id_b"]).any()
    assert (rel["rel_path_a"] < rel["rel_path_b"]).all()


def test_exif_orientation_is_applied_before_hashing(mini) -> None:
    _, _, result = mini
    assert _pair(result, "test/pear/u_sideways.png", "train/pear/u.png")["kind"] == "exact_pixels"


def test_near_duplicates_are_found_and_verified(mini) -> None:
    _, _, result = mini
    threshold = result.settings["verify_threshold"]
    for variant in ("n_reencode.jpg", "n_resize.png", "n_bright.png", "n_crop.png"):
        pair = _pair(result, "train/apple/n0.png", f"test/apple/{variant}")
        assert pair["kind"] == "near" and pair["trusted"], variant
        assert pair["verify_score"] >= threshold and pair["phash_distance"] <= result.settings["phash_radius"]


def test_flipped_and_turned_copies_come_from_the_dihedral_source(mini) -> None:
    _, _, result = mini
    for variant in ("m_mirror.png", "m_turn.png"):
        pair = _pair(result, "train/pear/m0.png", f"train/pear/{variant}")
        assert pair["trusted"] and "dihedral" in pair["proposed_by"].split("+"), variant
        assert pair["dihedral_distance"] <= result.settings["dihedral_radius"] < pair["phash_distance"]
        assert pair["dihedral_transform"] != 0 and pair["verified_by"]


def test_every_near_pair_records_its_sources_and_scores(mini) -> None:
    _, _, result = mini
    rel = result.relationships
    near = rel[rel["kind"] == "near"]
    assert len(near) and (near["proposed_by"] != "").all()
    assert set("+".join(near["proposed_by"]).split("+")) <= set(audit.candidates.SOURCES)
    assert near["cosine"].notna().all()
    # geometry is asked wherever the SSIM is not already certain
    sure = near["verify_score"].fillna(-1) >= audit.candidates.SURE_SSIM
    assert (near["geometry_inliers"].notna() | sure).all() and near.loc[~sure, "geometry_ratio"].notna().all()
    exact = rel[rel["kind"] != "near"]
    assert (exact["proposed_by"] == "exact").all() and exact["geometry_inliers"].isna().all()
    assert (near["trusted"] == (near["verified_by"] != "")).all()


def test_the_visual_words_source_proposes_pairs(mini) -> None:
    root, rows, _ = mini
    result = audit.audit_corpus(rows, root, {**FAST, "words_k": 2})
    near = result.relationships[result.relationships["kind"] == "near"]
    sources = near["proposed_by"].str.split("+")
    assert sources.apply(lambda s: "words" in s).any()
    resized = _pair(result, "train/apple/n0.png", "test/apple/n_resize.png")
    assert resized["trusted"]  # the other sources and the verifiers decide as before


def test_unrelated_images_are_never_trusted(mini) -> None:
    _, _, result = mini
    trusted = result.relationships[result.relationships["trusted"]]
    involved = set(trusted["rel_path_a"]) | set(trusted["rel_path_b"])
    assert not any("other_" in rel for rel in involved)


def test_label_conflict_is_reported(mini) -> None:
    _, _, result = mini
    pair = _pair(result, "train/apple/a3.png", "train/pear/a3_filed_as_pear.png")
    assert pair["label_conflict"] and pair["class_a"] != pair["class_b"]
    assert result.relationships["label_conflict"].sum() == 1


def test_transitive_chain_is_one_group_and_every_row_has_a_group(mini) -> None:
    _, rows, result = mini
    groups = result.groups.set_index("row_id")
    chain = [row_id(f"train/pear/{n}.png") for n in ("c1", "c2", "c3")]
    assert groups.loc[chain, "group_id"].nunique() == 1
    assert (groups.loc[chain, "group_size"] == 3).all()
    assert set(groups.index) == set(rows["row_id"])
    singletons = groups.loc[[row_id(f"train/pear/other_{s}.png") for s in (21, 23)], "group_size"]
    assert (singletons == 1).all()


def test_crossings_and_decision(mini) -> None:
    _, _, result = mini
    crossings = result.crossings
    # a1 copy (bytes), u sideways (pixels), four near variants of n0 -- plus pairs among the variants
    # stay inside test and do not cross
    assert crossings["exact_bytes"] == 1 and crossings["exact_pixels"] == 1
    assert crossings["near"] == 4
    assert crossings["total"] == crossings["exact"] + crossings["near"] == 6
    assert result.decision["decision"] == "reject" and result.decision["rejected"] is True
    assert "6 trusted relationship" in result.decision["reason"]


def test_threshold_table_covers_every_radius(mini) -> None:
    _, _, result = mini
    table = result.table
    assert table["radius"].tolist() == list(range(result.settings["table_radius"] + 1))
    for column in ("candidate_pairs", "capped_pairs", "confirmed_pairs"):
        assert table[column].is_monotonic_increasing
    assert (table["confirmed_pairs"] <= table["capped_pairs"]).all()
    assert (table["capped_pairs"] <= table["candidate_pairs"]).all()
    reason = audit.radius_reason(table, result.settings["phash_radius"], result.settings["verify_threshold"])
    assert f"radius {result.settings['phash_radius']}" in reason


def test_changed_file_is_refused(tmp_path) -> None:
    rel = _write(tmp_path, "train/apple/x.png", _png_bytes(_texture(5)))
    rows = _rows(tmp_path, [rel])
    (tmp_path / rel).write_bytes(_png_bytes(_texture(6)))
    with pytest.raises(audit.AuditInputError, match="changed since chapter 'corpus'"):
        audit.audit_corpus(rows, tmp_path, FAST)
