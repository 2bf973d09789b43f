"""The embedded corpus generator: determinism, planted truth vs. files on disk, and the traps it plants."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import imagehash
import numpy as np
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

from cropcop_utils import synthetic
from cropcop_utils.core.config import load_profile, open_run
from cropcop_utils.core.evidence import sha256_file

SMALL = {"seed": 7, "image_px": 48, "largest_class": 40, "tail_ratio": 50}
TINY = {"seed": 3, "image_px": 32, "largest_class": 12}  # for tests about folders, not pictures
NAME = re.compile(r"^(train|val|test)/([a-z_]+)/img_\d{6}\.(jpg|JPG|jpeg)$")


def _hashes(corpus: Path) -> dict[str, str]:
    return {p.relative_to(corpus).as_posix(): sha256_file(p) for p in corpus.rglob("*") if p.is_file()}


def _upright(path: Path) -> Image.Image:
    with Image.open(path) as opened:
        return ImageOps.exif_transpose(opened).convert("RGB")


def _coarse(image: Image.Image) -> np.ndarray:
    # Compare 16x16 averages: sensor noise and JPEG error wash out, the layout of the picture does not.
    return np.asarray(image.resize((16, 16), Image.Resampling.BOX), dtype=float)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("small")
    return out, synthetic.load_truth(synthetic.generate(out, SMALL))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("smoke")
    return out, synthetic.load_truth(synthetic.generate(out, load_profile("smoke")["synthetic"]))


def test_params_are_validated() -> None:
    with pytest.raises(synthetic.SyntheticParamsError, match="largest_clas"):
        synthetic.resolve_params({"largest_clas": 10})
    with pytest.raises(synthetic.SyntheticParamsError, match="image_px"):
        synthetic.resolve_params({"image_px": 8})
    assert synthetic.params_fingerprint({}) == synthetic.params_fingerprint(synthetic.DEFAULTS)
    assert synthetic.params_fingerprint(SMALL) != synthetic.params_fingerprint({**SMALL, "seed": 8})


def test_generation_is_deterministic(small: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = small
    again = synthetic.generate(tmp_path / "again", SMALL)
    assert _hashes(tmp_path / "again" / "corpus") == _hashes(out / "corpus")
    assert again.read_bytes() == (out / "planted.json").read_bytes()


def test_truth_matches_the_files_on_disk(small: tuple[Path, dict]) -> None:
    out, truth = small
    corpus = out / "corpus"
    files = {f["rel_path"]: f for f in truth["files"]}
    assert set(_hashes(corpus)) == set(files)
    assert {rel: f["sha256"] for rel, f in files.items()} == _hashes(corpus)
    assert not (out / "corpus" / "planted.json").exists()
    for rel, f in files.items():
        assert NAME.match(rel), rel
        split, cls = rel.split("/")[:2]
        assert (f["split"], f["class"]) == (split, cls)
        if f["origin"] == "byte_copy":
            assert (corpus / rel).read_bytes() == (corpus / f["parent"]).read_bytes()
        if f["origin"] in ("byte_copy", "near_duplicate", "reshot"):
            assert files[f["parent"]]["origin"] == "original"
        if f["origin"] == "broken":
            continue
        with Image.open(corpus / rel) as image:
            image.load()
            assert image.format == "JPEG" and image.mode == "RGB"
    broken = {f["broken_kind"]: corpus / rel for rel, f in files.items() if f["origin"] == "broken"}
    assert set(broken) == {"zero_byte", "truncated", "not_an_image"}
    assert broken["zero_byte"].stat().st_size == 0
    with pytest.raises(UnidentifiedImageError):
        Image.open(broken["not_an_image"])
    with pytest.raises(OSError, match="(?i)truncated"), Image.open(broken["truncated"]) as image:
        image.load()


def test_smoke_profile_has_the_study_shape(smoke: tuple[Path, dict]) -> None:
    _, truth = smoke
    classes = {c["name"]: c for c in truth["classes"]}
    assert 14 <= len(classes) <= 18
    assert len({c["crop"] for c in classes.values()}) >= 6
    assert {c["type"] for c in classes.values()} == {"healthy", "broad", "specific"}
    singletons = [c for c in classes.values() if c["count"] == 1]
    assert len(singletons) == 1 and singletons[0]["singleton"]
    tail = [c["count"] for c in classes.values() if not c["singleton"]]
    assert max(tail) / min(tail) >= 50
    assert min(tail) >= 3
    assert {"tomato_spider_mites", "grape_mites"} <= {n for n, c in classes.items() if c["pest"]}
    assert {"banana_healthy_fruit", "banana_disease_fruit"} <= {n for n, c in classes.items() if c["fruit"]}
    counted = {n: sum(f["class"] == n for f in truth["files"]) for n in classes}
    assert counted == {n: c["count"] for n, c in classes.items()}


def test_inherited_partition_and_preferred_sources(smoke: tuple[Path, dict]) -> None:
    _, truth = smoke
    originals = [f for f in truth["files"] if f["origin"] == "original"]
    for c in truth["classes"]:
        mine = [f for f in originals if f["class"] == c["name"]]
        if len(mine) < 20:
            continue
        train = sum(f["split"] == "train" for f in mine) / len(mine)
        assert 0.62 <= train <= 0.78, c["name"]
        preferred = sum(f["source"] == c["preferred_source"] for f in mine) / len(mine)
        assert 0.65 <= preferred <= 0.85, c["name"]
    assert {Path(f["rel_path"]).suffix for f in truth["files"]} == {".jpg", ".JPG", ".jpeg"}


def test_leakage_is_planted_and_some_crosses_the_split(smoke: tuple[Path, dict]) -> None:
    _, truth = smoke
    files = truth["files"]
    n_orig = sum(f["origin"] == "original" for f in files)
    for origin in ("byte_copy", "near_duplicate", "reshot"):
        kind = [f for f in files if f["origin"] == origin and not f["label_conflict"]]
        crossing = sum(f["crosses_split"] for f in kind)
        assert 0 < crossing < len(kind) / 2, origin
    for transform in synthetic.TRANSFORMS:
        assert sum(f["transform"] == transform for f in files) >= 0.008 * n_orig, transform
    assert 0.02 <= sum(f["origin"] == "byte_copy" for f in files) / n_orig <= 0.045
    assert 0.11 <= sum(f["origin"] == "near_duplicate" for f in files) / n_orig <= 0.16
    reshots = [f for f in files if f["origin"] == "reshot"]
    kinds = [f["reshot_kind"] for f in reshots]
    assert set(kinds) == set(synthetic.RESHOT_KINDS)
    assert max(kinds.count(k) for k in set(kinds)) - min(kinds.count(k) for k in set(kinds)) <= 1
    assert all(f["render"]["reshot"] == f["reshot_kind"] for f in reshots)
    conflicts = [f for f in files if f["label_conflict"]]
    assert conflicts and all(f["class"] != f["parent_class"] for f in conflicts)
    assert all(f["class"] == f["parent_class"] for f in files if f["parent"] and not f["label_conflict"])
    summary = truth["summary"]
    assert summary["crossing_split"]["total"] == sum(f["crosses_split"] for f in files)
    assert summary["label_conflicts"] == len(conflicts)


def test_exif_make_model_and_orientation(smoke: tuple[Path, dict]) -> None:
    out, truth = smoke
    corpus = out / "corpus"
    for f in truth["files"]:
        if f["origin"] == "broken":
            continue
        with Image.open(corpus / f["rel_path"]) as image:
            exif = image.getexif()
        source = synthetic.SOURCES[f["source"]]
        assert (exif.get(0x010F), exif.get(0x0110)) == (source.make, source.model), f["rel_path"]
        assert exif.get(0x0112) == f["exif_orientation"]
        assert re.match(r"^\d{4}:\d\d:\d\d \d\d:\d\d:\d\d$", exif.get(0x0132, ""))
    rotated = [f for f in truth["files"] if f["exif_orientation"] in (6, 8)]
    assert {f["exif_orientation"] for f in rotated} == {6, 8}
    px = truth["params"]["image_px"]
    for f in rotated:
        if f["origin"] != "original":
            continue
        upright = synthetic.render_upright(truth["seed"], px, f["class"], f["source"], **f["render"])
        expected = _coarse(upright)
        restored = _coarse(_upright(corpus / f["rel_path"]))
        with Image.open(corpus / f["rel_path"]) as image:
            raw = _coarse(image.convert("RGB"))
        assert np.abs(restored - expected).mean() < 3  # JPEG error only
        assert np.abs(raw - expected).mean() > 3 * np.abs(restored - expected).mean()
    # One near duplicate of a rotated original was saved upright: it only matches with EXIF applied.
    assert any(f["origin"] == "near_duplicate" and f["exif_orientation"] == 1 and
               next(g for g in truth["files"] if g["rel_path"] == f["parent"])["exif_orientation"] != 1
               for f in truth["files"])


def test_near_duplicates_are_perceptually_near_and_originals_are_not(smoke: tuple[Path, dict]) -> None:
    out, truth = smoke
    corpus = out / "corpus"
    cache: dict[str, imagehash.ImageHash] = {}

    def phash(rel: str) -> imagehash.ImageHash:
        if rel not in cache:
            cache[rel] = imagehash.phash(_upright(corpus / rel))
        return cache[rel]

    for kind in synthetic.HASH_NEAR_TRANSFORMS:
        distances = [phash(a) - phash(b) for a, b in map(tuple, synthetic.planted_pairs(truth, [kind]))]
        assert np.median(distances) <= 8, kind
    # Flips and quarter turns are far in pHash but near once the turn or mirror is undone.
    undo = {"hflip": Image.Transpose.FLIP_LEFT_RIGHT, "vflip": Image.Transpose.FLIP_TOP_BOTTOM}
    for kind, transpose in undo.items():
        for a, b in map(tuple, synthetic.planted_pairs(truth, [kind])):
            assert imagehash.phash(_upright(corpus / a).transpose(transpose)) - phash(b) <= 8, (kind, a, b)
    for kind in synthetic.GEOMETRIC_TRANSFORMS:
        distances = [phash(a) - phash(b) for a, b in map(tuple, synthetic.planted_pairs(truth, [kind]))]
        if kind == "elastic":
            # a local warp moves pixels, not the picture's low-frequency layout that pHash keeps
            assert np.median(distances) <= 8, kind
        else:
            assert np.median(distances) > 8, kind  # what a plain pHash radius alone cannot be trusted to see
    originals: dict[tuple[str, str], list[str]] = {}
    for f in truth["files"]:
        if f["origin"] == "original" and f["class"] in ("tomato_late_blight", "tomato_healthy"):
            originals.setdefault((f["class"], f["source"]), []).append(f["rel_path"])
    distinct = [phash(a) - phash(b)
                for rels in originals.values() for a, b in itertools.combinations(rels, 2)]
    assert len(distinct) > 1000
    assert np.mean(np.array(distinct) <= 10) < 0.02


def test_planted_pairs_groups_and_conflicts(small: tuple[Path, dict]) -> None:
    _, truth = small
    everything = synthetic.planted_pairs(truth)
    near = synthetic.planted_pairs(truth, ["near_duplicate"])
    assert near == set().union(*(synthetic.planted_pairs(truth, [t]) for t in synthetic.TRANSFORMS))
    assert near < everything
    assert synthetic.planted_pairs(truth, ["byte_copy"]) <= everything
    family_sizes = {}
    for f in truth["files"]:
        if f["family"] is not None:
            family_sizes[f["family"]] = family_sizes.get(f["family"], 0) + 1
    expected_pairs = sum(n * (n - 1) // 2 for n in family_sizes.values())
    assert len(synthetic.planted_pairs(truth, ["reshot"])) == expected_pairs
    assert all(2 <= n <= 4 for n in family_sizes.values())
    groups = synthetic.planted_groups(truth)
    for pair in everything:
        assert any(pair <= group for group in groups)
    conflicts = synthetic.label_conflicts(truth)
    assert len(conflicts) == truth["params"]["label_conflicts"] and conflicts <= everything
    with pytest.raises(ValueError, match="unknown pair kind"):
        synthetic.planted_pairs(truth, ["rotate_45"])


def test_ensure_corpus_is_idempotent(tmp_path: Path) -> None:
    ctx = open_run(tmp_path / "run", profile="smoke", overrides={"synthetic": TINY})
    root = synthetic.ensure_corpus(ctx)
    assert root == ctx.corpus_root and ctx.planted_truth_path.exists()
    stamp = ctx.planted_truth_path.stat().st_mtime_ns
    before = _hashes(root)
    assert synthetic.ensure_corpus(ctx) == root
    assert ctx.planted_truth_path.stat().st_mtime_ns == stamp
    victim = root / next(iter(before))
    victim.unlink()  # an incomplete corpus is regenerated, identically
    synthetic.ensure_corpus(ctx)
    assert _hashes(root) == before


def test_generate_refuses_what_it_cannot_prove_it_wrote(small: tuple[Path, dict], tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    (foreign / "corpus" / "train" / "x").mkdir(parents=True)
    (foreign / "corpus" / "train" / "x" / "mine.jpg").write_bytes(b"precious")
    with pytest.raises(synthetic.SyntheticCorpusConflict, match="planted.json"):
        synthetic.generate(foreign, TINY)
    assert (foreign / "corpus" / "train" / "x" / "mine.jpg").read_bytes() == b"precious"

    ours = tmp_path / "ours"
    shutil.copytree(small[0], ours)
    (ours / "corpus" / "notes.txt").write_text("someone else's file")
    with pytest.raises(synthetic.SyntheticCorpusConflict, match="notes.txt"):
        synthetic.generate(ours, TINY)
    (ours / "corpus" / "notes.txt").unlink()
    truth = synthetic.load_truth(synthetic.generate(ours, TINY))  # provably ours: replaced
    assert truth["params_fingerprint"] == synthetic.params_fingerprint(TINY)
    assert set(_hashes(ours / "corpus")) == {f["rel_path"] for f in truth["files"]}
    assert not list(ours.glob(synthetic.PARTIAL_PREFIX + "*"))
    assert not (ours / synthetic.PENDING_NAME).exists()

    # Killed after the new folder was moved into place but before planted.json: still provably ours.
    (ours / "planted.json").rename(ours / synthetic.PENDING_NAME)
    assert not synthetic.corpus_matches(ours, TINY)
    synthetic.generate(ours, TINY)
    assert synthetic.corpus_matches(ours, TINY)


def test_load_truth_rejects_other_files(tmp_path: Path) -> None:
    with pytest.raises(synthetic.SyntheticTruthError, match="does not exist"):
        synthetic.load_truth(tmp_path)
    (tmp_path / "planted.json").write_text(json.dumps({"files": []}))
    with pytest.raises(synthetic.SyntheticTruthError, match="not ground truth"):
        synthetic.load_truth(tmp_path)
    (tmp_path / "planted.json").write_bytes(b"{not json")
    with pytest.raises(synthetic.SyntheticTruthError, match="not valid JSON"):
        synthetic.load_truth(tmp_path / "planted.json")
