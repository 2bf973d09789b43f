"""The corpus scan: every broken kind quarantined, the pooled probe equal to the inline one, and the
content-hash sample."""

from __future__ import annotations

import pandas as pd
import pytest
from corpus.corpus_files import EXPECTED

from cropcop_utils import corpus
from cropcop_utils.core.evidence import row_id, sha256_file
from cropcop_utils.corpus import probe


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
    monkeypatch.setattr(probe, "INLINE_BELOW", 0)
    pooled = corpus.scan_corpus(broken_corpus, 2, 5000, workers=2, progress=False).manifest
    pd.testing.assert_frame_equal(inline, pooled)


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
