"""Corpus chapter: layouts, the per-file scan, quarantine reasons, counts, tables and the chapter run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from cropcop_utils import config, corpus, taxonomy
from cropcop_utils.evidence import row_id, sha256_file, verify_registry

REPO = Path(__file__).resolve().parents[1]


def jpeg(path: Path, seed: int, size: tuple[int, int] = (32, 32)) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path, "JPEG")
    return path


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# rel_path → expected quarantine reason (None = admitted)
EXPECTED = {
    "train/alpha/a1.jpg": None, "train/alpha/a2.jpg": None, "train/alpha/a3.JPG": None,
    "test/alpha/a4.jpeg": None,
    "train/alpha/zero.jpg": "zero_byte",
    "train/alpha/truncated.jpg": "truncated",
    "train/alpha/notes.jpg": "not_an_image",
    "train/alpha/bomb.png": "decompression_bomb",
    "train/alpha/corrupt.png": "unreadable",
    "train/alpha/.hidden.jpg": "hidden",
    "train/alpha/._a1.jpg": "os_junk",
    "train/.DS_Store": "os_junk",
    "train/beta/b1.jpg": None, "train/beta/b2.jpg": None, "test/beta/b3.jpg": None,
    "train/beta/sub/deep.jpg": "outside_layout",
    "train/loose.jpg": "outside_layout",
    "README.txt": "outside_layout",
    ".git/HEAD": "hidden",
    "__MACOSX/train/alpha/a1.jpg": "os_junk",
    "train/solo/s1.jpg": "class_below_min_support",
}


@pytest.fixture
def broken_corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    for seed, rel in enumerate(rel for rel, reason in EXPECTED.items()
                               if reason in (None, "class_below_min_support", "outside_layout", "hidden")
                               and rel.endswith(("jpg", "JPG", "jpeg"))):
        jpeg(root / rel, seed)
    good = (root / "train/alpha/a1.jpg").read_bytes()
    write(root / "train/alpha/zero.jpg", b"")
    write(root / "train/alpha/truncated.jpg", good[: len(good) // 2])
    write(root / "train/alpha/notes.jpg", b"field notes, not a photo\n")
    write(root / "train/alpha/._a1.jpg", b"\x00\x05\x16\x07AppleDouble")
    write(root / "train/.DS_Store", b"Bud1junk")
    write(root / "README.txt", b"a corpus\n")
    write(root / ".git/HEAD", b"ref: refs/heads/main\n")
    write(root / "__MACOSX/train/alpha/a1.jpg", good)
    Image.new("RGB", (100, 100), (0, 90, 0)).save(root / "train/alpha/bomb.png")  # 10,000 px > limit
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "train/alpha/corrupt.png")
    data = bytearray((root / "train/alpha/corrupt.png").read_bytes())
    start = data.index(b"IDAT") + 40
    data[start:start + 20] = b"\x00" * 20
    (root / "train/alpha/corrupt.png").write_bytes(bytes(data))
    (root / "val" / "empty_class").mkdir(parents=True)
    return root


def test_scan_quarantines_every_broken_kind(broken_corpus):
    result = corpus.scan_corpus(broken_corpus, min_class_support=2, max_image_pixels=5000, workers=1,
                                progress=False)
    manifest = result.manifest
    assert list(manifest.columns) == corpus.MANIFEST_COLUMNS
    assert dict(zip(manifest["rel_path"], manifest["quarantine_reason"], strict=True)) == EXPECTED
    assert result.layout.kind == "split"
    assert result.layout.split_folders == {"train": "train", "test": "test", "val": "val"}

    # every file seen is admitted or quarantined, once
    assert len(manifest) == len(EXPECTED) == manifest["admitted"].sum() + len(result.quarantine)
    assert manifest["row_id"].is_unique
    assert set(result.quarantine["rel_path"]) == {r for r, why in EXPECTED.items() if why}
    assert list(result.quarantine.columns) == corpus.QUARANTINE_COLUMNS
    assert (result.quarantine["detail"].notna()).all()

    row = manifest.set_index("rel_path")
    assert row.at["train/alpha/a1.jpg", "row_id"] == row_id("train/alpha/a1.jpg")
    assert row.at["train/alpha/a1.jpg", "sha256"] == sha256_file(broken_corpus / "train/alpha/a1.jpg")
    assert row.at["train/alpha/a1.jpg", "format"] == "JPEG"
    assert (row.at["train/alpha/a1.jpg", "width"], row.at["train/alpha/a1.jpg", "height"]) == (32, 32)
    assert row.at["test/alpha/a4.jpeg", "inherited_split"] == "test"
    assert row.at["train/alpha/zero.jpg", "bytes"] == 0
    assert row.at["train/alpha/truncated.jpg", "decode_status"] == "error"
    assert "truncated" in row.at["train/alpha/truncated.jpg", "error"].lower()
    assert row.at["train/alpha/bomb.png", "width"] == 100  # the header is recorded, pixels never decoded
    assert row.at["train/alpha/.hidden.jpg", "decode_status"] == "ok"  # probed, quarantined by place
    assert row.at["train/loose.jpg", "class_name"] is None
    assert row.at["train/beta/sub/deep.jpg", "class_name"] == "beta"
    assert row.at["README.txt", "inherited_split"] == "none"
    assert row.at[".git/HEAD", "class_name"] is None  # a hidden top-level folder is not a class
    assert row.at["__MACOSX/train/alpha/a1.jpg", "class_name"] is None

    class_map = result.class_map
    assert [c["name"] for c in class_map["classes"]] == ["alpha", "beta"]
    assert [c["support"] for c in class_map["classes"]] == [4, 3]
    assert class_map["quarantined_classes"] == [
        {"name": "empty_class", "reason": "class_below_min_support", "support": 0},
        {"name": "solo", "reason": "class_below_min_support", "support": 1},
    ]
    assert result.empty_class_folders == ["val/empty_class"]

    counts = corpus.reason_counts(manifest)
    assert sum(counts.values()) == len(result.quarantine)
    assert counts["outside_layout"] == 3 and counts["os_junk"] == 3 and counts["zero_byte"] == 1


def test_parallel_scan_matches_inline(broken_corpus, monkeypatch):
    inline = corpus.scan_corpus(broken_corpus, 2, 5000, workers=1, progress=False).manifest
    monkeypatch.setattr(corpus, "INLINE_BELOW", 0)
    pooled = corpus.scan_corpus(broken_corpus, 2, 5000, workers=2, progress=False).manifest
    pd.testing.assert_frame_equal(inline, pooled)


def test_flat_layout_and_aliases(tmp_path):
    for i in range(3):
        jpeg(tmp_path / "flat" / "bean_healthy" / f"{i}.jpg", i)
        jpeg(tmp_path / "flat" / "bean_fungal_disease" / f"{i}.jpg", 10 + i)
    result = corpus.scan_corpus(tmp_path / "flat", 2, None, workers=1, progress=False)
    assert result.layout.kind == "flat"
    assert set(result.manifest["inherited_split"]) == {"none"}
    assert result.manifest["admitted"].all()
    assert {c["name"]: c["type"] for c in result.class_map["classes"]} == {
        "bean_fungal_disease": "broad", "bean_healthy": "healthy"}

    jpeg(tmp_path / "aliased" / "Train" / "x" / "1.jpg", 1)
    jpeg(tmp_path / "aliased" / "valid" / "x" / "2.jpg", 2)
    layout = corpus.detect_layout(tmp_path / "aliased")
    assert layout.split_folders == {"Train": "train", "valid": "val"}


@pytest.mark.parametrize(("files", "message"), [
    (["train/a/1.jpg", "beans/1.jpg"], "mixes split folders"),
    (["train/1.jpg"], "no class folders"),
    (["1.jpg"], "no class folders"),
    (["val/a/1.jpg", "validation/a/2.jpg"], "both mean split"),
    (["a/b/c/1.jpg"], "no file sits where"),
])
def test_unexpected_layouts_are_refused(tmp_path, files, message):
    for i, rel in enumerate(files):
        jpeg(tmp_path / "c" / rel, i)
    with pytest.raises(corpus.CorpusLayoutError, match=message):
        corpus.scan_corpus(tmp_path / "c", progress=False)


def test_missing_corpus_folder_is_refused(tmp_path):
    with pytest.raises(corpus.CorpusLayoutError, match="does not exist"):
        corpus.detect_layout(tmp_path / "absent")


def test_support_tables_and_plot(broken_corpus):
    manifest = corpus.scan_corpus(broken_corpus, 2, 5000, workers=1, progress=False).manifest
    support = corpus.support_table(manifest).set_index("class_name")
    assert support.loc["alpha", "files_seen"] == 11  # 4 good + 5 broken + hidden + AppleDouble
    assert support.loc["alpha", "admitted"] == 4 and support.loc["solo", "admissible"] == 1
    assert support.loc["solo", "status"] == "quarantined" and support.loc["solo", "admitted"] == 0
    assert support["share_of_admitted"].sum() == pytest.approx(1.0)

    per_split = corpus.split_support_table(manifest).set_index("class_name")
    assert list(per_split.columns) == ["train", "test", "total"]
    assert per_split.loc["alpha"].tolist() == [3, 1, 4] and per_split.loc["beta"].tolist() == [2, 1, 3]

    ratio = corpus.imbalance({"alpha": 4, "beta": 3})
    assert ratio["largest_class"] == "alpha" and ratio["largest_to_smallest"] == pytest.approx(4 / 3)
    figure = corpus.plot_class_support(corpus.support_table(manifest), 2)
    assert isinstance(figure, Figure)
    assert len(figure.axes[0].patches) == 3  # alpha, beta and the quarantined solo


def test_run_chapter_writes_registered_evidence(broken_corpus, tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(broken_corpus),
                          overrides={"corpus": {"max_image_pixels": 5000}})
    record = corpus.run_chapter(ctx, progress=False)
    run = tmp_path / "run"
    for rel in ("corpus/manifest.parquet", "corpus/quarantine.parquet", "corpus/class_map.json",
                "corpus/class_support.png"):
        assert record["outputs"][rel] == sha256_file(run / rel)
    assert verify_registry(run)["matches"].all()

    figures = record["figures"]
    assert figures["files_seen"] == len(EXPECTED)
    assert figures["admitted"] == sum(why is None for why in EXPECTED.values())
    assert figures["files_seen"] == figures["admitted"] + figures["quarantined"] and figures["identity_holds"]
    assert figures["quarantine_reasons"]["decompression_bomb"] == 1
    assert figures["n_classes_admitted"] == 2
    assert figures["per_class_split"]["alpha"] == {"train": 3, "test": 1}
    assert figures["largest_class"] == "alpha" and figures["smallest_class"] == "beta"

    class_map = json.loads((run / "corpus/class_map.json").read_text())
    assert class_map["fingerprint"] == figures["class_map_fingerprint"]
    assert class_map["fingerprint"] == taxonomy.class_map_fingerprint(class_map["classes"])
    manifest = pd.read_parquet(run / "corpus/manifest.parquet")
    assert list(manifest.columns) == corpus.MANIFEST_COLUMNS
    assert manifest["admitted"].dtype == bool
    stored = json.loads((run / "corpus/corpus.json").read_text())
    assert stored["figures"]["class_map_fingerprint"] == class_map["fingerprint"]


@pytest.fixture
def copied_corpus(tmp_path) -> Path:
    """40 distinct JPEGs in train/test, a byte-identical copy inside train and one across train/test."""
    root = tmp_path / "copies"
    for i in range(40):
        jpeg(root / ("train" if i % 4 else "test") / ("a" if i % 2 else "b") / f"f{i}.jpg", 100 + i)
    out = sorted(p for p in root.rglob("*.jpg")
                 if not corpus.in_sample(sha256_file(p), 0.3) and p.parts[-3] == "train")
    write(root / "train/a/copy_in_train.jpg", out[0].read_bytes())
    write(root / "test/b/copy_across.jpg", out[1].read_bytes())
    return root


def test_content_hash_sample_keeps_copies_together_and_lists_the_rest(copied_corpus, tmp_path):
    result = corpus.scan_corpus(copied_corpus, workers=1, progress=False, sample_fraction=0.3)
    manifest, left_out = result.manifest, result.not_sampled
    assert len(manifest) + len(left_out) == 42 and len(left_out) > 0
    assert set(manifest["rel_path"]).isdisjoint(left_out["rel_path"])
    assert list(left_out.columns) == corpus.NOT_SAMPLED_COLUMNS
    sampled = dict(zip(manifest["rel_path"], manifest["sha256"], strict=True))
    across = sampled.get("test/b/copy_across.jpg")
    assert across is not None and not corpus.in_sample(across, 0.3)  # kept for its cross-split twin
    assert (manifest["sha256"] == across).sum() == 2
    in_train_copy = left_out.loc[left_out["rel_path"] == "train/a/copy_in_train.jpg", "sha256"]
    # the copy inside train and its original are left out together
    assert len(in_train_copy) == 1 and (left_out["sha256"] == in_train_copy.iloc[0]).sum() == 2
    assert all(corpus.in_sample(sha, 0.3) or sha == across for sha in sampled.values())
    assert not any(corpus.in_sample(sha, 0.3) for sha in left_out["sha256"])

    plain = corpus.scan_corpus(copied_corpus, workers=1, progress=False, sample_fraction=0.3,
                               keep_cross_split_copies=False)
    assert "test/b/copy_across.jpg" in set(plain.not_sampled["rel_path"])
    assert corpus.scan_corpus(copied_corpus, workers=1, progress=False).not_sampled.empty
    for bad in (0, 1.5, "half", True):
        with pytest.raises(corpus.CorpusSampleError, match="sample_fraction"):
            corpus.scan_corpus(copied_corpus, workers=1, progress=False, sample_fraction=bad)


def test_sampled_chapter_accounts_for_every_file(copied_corpus, tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(copied_corpus),
                          overrides={"corpus": {"sample_fraction": 0.3}})
    figures = corpus.run_chapter(ctx, progress=False)["figures"]
    left_out = pd.read_parquet(tmp_path / "run/corpus/not_sampled.parquet")
    assert figures["files_seen"] == 42
    assert figures["files_seen"] == figures["admitted"] + figures["quarantined"] + figures["not_sampled"]
    assert figures["not_sampled"] == len(left_out) > 0 and figures["identity_holds"]
    assert verify_registry(tmp_path / "run")["matches"].all()


def test_tomato_corpus(tomato_root, tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(tomato_root))
    record = corpus.run_chapter(ctx, progress=False)
    figures = record["figures"]
    assert figures["files_seen"] == 11_000 and figures["admitted"] == 11_000
    assert figures["quarantined"] == 0 and figures["layout"] == "split"
    assert figures["n_classes_admitted"] == 10
    assert all(counts == {"train": 1000, "test": 100} for counts in figures["per_class_split"].values())
    assert figures["largest_to_smallest"] == 1.0

    class_map = json.loads((tmp_path / "run/corpus/class_map.json").read_text())
    by_name = {c["name"]: c for c in class_map["classes"]}
    assert by_name["Tomato___Spider_mites Two-spotted_spider_mite"]["pest"] is True
    assert by_name["Tomato___healthy"]["type"] == "healthy"
    assert [c["name"] for c in class_map["classes"] if c["pest"]] == [
        "Tomato___Spider_mites Two-spotted_spider_mite"]
    assert {c["naming"] for c in class_map["classes"]} == {"plantvillage"}


@pytest.mark.slow
def test_notebook_runs_headless_on_synthetic(smoke_book):
    run_dir = Path(smoke_book["run_dir"])
    out = smoke_book["book_root"] / "book" / "01_corpus.ipynb"
    record = json.loads((run_dir / "corpus/corpus.json").read_text())
    assert record["figures"]["planted_check"]["all_match"] is True
    text = out.read_text()
    assert "Chapter 1: Corpus" in text and "Traceback" not in text
    assert f"{record['figures']['files_seen']:,}" in text  # prose numbers come from the run files


# --------------------------------------------------------------------------- symbolic links
@pytest.fixture
def linked_corpus(tmp_path) -> tuple[Path, Path]:
    """A corpus with links that stay inside it, links that leave it, and a folder-link cycle."""
    root, outside = tmp_path / "corpus", tmp_path / "elsewhere"
    for i in range(3):
        jpeg(root / "train" / "alpha" / f"a{i}.jpg", i)
        jpeg(root / "train" / "beta" / f"b{i}.jpg", 10 + i)
    jpeg(outside / "secret.jpg", 99)  # a valid image: read, it would be admitted
    write(outside / "passwd", b"root:x:0:0:root:/root:/bin/bash\n")
    (root / "train/beta/b_link.jpg").symlink_to("../alpha/a0.jpg")  # inside: followed
    (root / "train/alpha/stolen.jpg").symlink_to(outside / "secret.jpg")  # outside, absolute
    (root / "train/alpha/passwd.jpg").symlink_to(Path("../../..") / "elsewhere/passwd")  # outside, relative
    (root / "train/alpha/far").symlink_to(outside, target_is_directory=True)  # outside folder
    (root / "train/alpha/loop").symlink_to("..", target_is_directory=True)  # cycle back to train/
    (root / "train/beta_again").symlink_to("beta", target_is_directory=True)  # a folder seen twice
    return root, outside


def test_links_leaving_the_corpus_are_quarantined_without_being_opened(linked_corpus, monkeypatch):
    root, outside = linked_corpus
    probed: list[str] = []
    real_probe = corpus.probe_file

    def spy(path, *args, **kwargs):  # probe_file is the only code that opens a corpus file
        probed.append(os.path.realpath(path))
        return real_probe(path, *args, **kwargs)

    monkeypatch.setattr(corpus, "probe_file", spy)
    result = corpus.scan_corpus(root, min_class_support=2, workers=1, progress=False)
    row = result.manifest.set_index("rel_path")
    for rel in ("train/alpha/stolen.jpg", "train/alpha/passwd.jpg", "train/alpha/far"):
        assert row.at[rel, "quarantine_reason"] == "outside_corpus", rel
        assert bool(row.at[rel, "is_link"]) and row.at[rel, "decode_status"] == "not_opened"
        assert row.at[rel, "bytes"] is pd.NA and row.at[rel, "sha256"] is None
    assert str(outside) in result.quarantine.set_index("rel_path").at["train/alpha/stolen.jpg", "detail"]
    assert not [p for p in probed if Path(p).is_relative_to(outside.resolve())]
    assert len(probed) == len(result.manifest) - 3  # every other row was probed, once
    # The folder outside is one row, never entered: nothing under it is listed.
    assert not [rel for rel in row.index if rel.startswith("train/alpha/far/")]
    assert corpus.reason_counts(result.manifest)["outside_corpus"] == 3
    assert len(result.manifest) == result.manifest["admitted"].sum() + len(result.quarantine)


def test_links_inside_the_corpus_are_followed_once_and_marked(linked_corpus):
    root, _ = linked_corpus
    result = corpus.scan_corpus(root, min_class_support=2, workers=1, progress=False)
    manifest = result.manifest
    assert list(manifest.columns) == corpus.MANIFEST_COLUMNS and manifest["is_link"].dtype == bool
    row = manifest.set_index("rel_path")
    # A file link inside the root is read through the link: the same bytes as its target, marked a link.
    link = row.loc["train/beta/b_link.jpg"]
    assert bool(link["admitted"]) and bool(link["is_link"])
    assert row.at["train/beta/b_link.jpg", "sha256"] == row.at["train/alpha/a0.jpg", "sha256"]
    assert not manifest.loc[~manifest["rel_path"].isin(
        ["train/beta/b_link.jpg", "train/alpha/stolen.jpg", "train/alpha/passwd.jpg", "train/alpha/far"]),
        "is_link"].any()
    # Folder links inside the root (a cycle, a second name for beta) add no row: each real file is
    # listed once, at its real path.
    real_files = {f"train/alpha/a{i}.jpg" for i in range(3)} | {f"train/beta/b{i}.jpg" for i in range(3)}
    assert set(manifest.loc[manifest["admitted"], "rel_path"]) == real_files | {"train/beta/b_link.jpg"}
    assert len(manifest) == len(real_files) + 4 and manifest["rel_path"].is_unique
    assert not manifest["rel_path"].str.contains("loop/|beta_again/").any()
    assert {c["name"] for c in result.class_map["classes"]} == {"alpha", "beta"}
