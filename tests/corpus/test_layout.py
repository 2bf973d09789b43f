"""Corpus layouts: flat and split layouts, refused layouts, and symbolic links inside and outside."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from corpus.corpus_files import jpeg

from cropcop_utils import corpus
from cropcop_utils.corpus import probe


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


# --------------------------------------------------------------------------- symbolic links
def test_links_leaving_the_corpus_are_quarantined_without_being_opened(linked_corpus, monkeypatch):
    root, outside = linked_corpus
    probed: list[str] = []
    real_probe = corpus.probe_file

    def spy(path, *args, **kwargs):  # probe_file is the only code that opens a corpus file
        probed.append(os.path.realpath(path))
        return real_probe(path, *args, **kwargs)

    monkeypatch.setattr(probe, "probe_file", spy)
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
