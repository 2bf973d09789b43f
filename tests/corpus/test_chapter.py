"""Corpus chapter: support tables and plot, the chapter run and its registered evidence, the notebook."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from corpus.corpus_files import EXPECTED
from matplotlib.figure import Figure

from cropcop_utils import corpus
from cropcop_utils.core import config
from cropcop_utils.core.evidence import sha256_file, verify_registry
from cropcop_utils.corpus import taxonomy

REPO = Path(__file__).resolve().parents[2]

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
    out = smoke_book["book_dir"] / "01_corpus.ipynb"
    record = json.loads((run_dir / "corpus/corpus.json").read_text())
    assert record["figures"]["planted_check"]["all_match"] is True
    text = out.read_text()
    assert "Chapter 1: Corpus" in text and "Traceback" not in text
    assert f"{record['figures']['files_seen']:,}" in text  # prose numbers come from the run files
