"""The learning curve (chapter 10): seeded draws, the frozen-feature and fine-tuned learners, the summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.field import curve, curve_draws, curve_figures, curve_finetune

NAMES = ["rot", "scab"]


def _pool(per_class: dict[str, int]) -> pd.DataFrame:
    rows = [{"row_id": f"{name}-{i:03d}", "rel_path": f"{name}/{i}.png", "class_name": name,
             "label": NAMES.index(name)} for name, n in per_class.items() for i in range(n)]
    return pd.DataFrame(rows)


def test_draws_are_reproducible_from_the_seed_nested_and_capped():
    pool = _pool({"rot": 40, "scab": 7})
    first = curve.draw_field_rows(pool, 10, seed=3, draw=1)
    shuffled = pool.sample(frac=1.0, random_state=0)
    again = curve.draw_field_rows(shuffled, 10, seed=3, draw=1)
    assert list(first["row_id"]) == list(again["row_id"])  # the seed decides, not the pool's order
    assert curve.per_class_counts(first, NAMES) == {"rot": 10, "scab": 7}  # scab holds 7: all of them
    other_draw = curve.draw_field_rows(pool, 10, seed=3, draw=2)
    other_seed = curve.draw_field_rows(pool, 10, seed=4, draw=1)
    rot = set(first.loc[first["class_name"] == "rot", "row_id"])
    assert rot != set(other_draw.loc[other_draw["class_name"] == "rot", "row_id"])
    assert rot != set(other_seed.loc[other_seed["class_name"] == "rot", "row_id"])
    bigger = curve.draw_field_rows(pool, 25, seed=3, draw=1)
    assert set(first["row_id"]) <= set(bigger["row_id"])  # a larger k only adds photos
    assert len(curve.draw_field_rows(pool, 0, seed=3, draw=1)) == 0
    with pytest.raises(ValueError, match="k must be"):
        curve.draw_field_rows(pool, -1, seed=3, draw=1)


def test_params_name_the_offending_key():
    params = curve.curve_params(None, k=[25, 0, 10], draws=2)
    assert params["k"] == [0, 10, 25] and params["finetune"]["k"] == curve.DEFAULTS["finetune"]["k"]
    with pytest.raises(curve.CurveConfigError, match="unknown key.*'kk'"):
        curve.curve_params(None, kk=[1])
    with pytest.raises(curve.CurveConfigError, match="finetune.epochs"):
        curve.curve_params(None, finetune={"epochs": 1})
    with pytest.raises(curve.CurveConfigError, match="field_curve.k"):
        curve.curve_params(None, k=[0, 10, 10])
    with pytest.raises(curve.CurveConfigError, match="field_curve.draws"):
        curve.curve_params(None, draws=0)
    with pytest.raises(curve.CurveConfigError, match="targets"):
        curve.curve_params(None, targets=[80])


def _row(learner, k, draw, acc, lo):
    field = {"accuracy": {"value": acc, "lo": lo, "hi": min(1.0, acc + 0.05)},
             "macro_f1": {"value": acc, "lo": lo, "hi": acc},
             "no_relative": {"n": 10, "accuracy": {"value": acc - 0.1, "lo": None, "hi": None}}}
    lab = {"macro_f1": {"value": 0.95, "lo": 0.9, "hi": 0.99}}
    return curve.curve_row(learner, k, draw, {"rot": k, "scab": k}, 100, field, lab, "x" * 64, None)


def test_smallest_k_reads_the_mean_over_draws_and_says_not_reached():
    table = pd.DataFrame([_row(curve.FROZEN, 0, 0, 0.40, 0.35), _row(curve.FROZEN, 10, 0, 0.78, 0.70),
                          _row(curve.FROZEN, 10, 1, 0.84, 0.76),  # mean 0.81 reaches 80 % at k = 10
                          _row(curve.FROZEN, 25, 0, 0.86, 0.81), _row(curve.FROZEN, 25, 1, 0.86, 0.81)],
                         columns=curve.COLUMNS)
    eighty = curve.smallest_k(table, curve.FROZEN, 0.8)
    assert eighty == {"target": 0.8, "k": 10, "k_lower_bound": 25, "largest_k_tried": 25}
    ninety = curve.smallest_k(table, curve.FROZEN, 0.9)
    assert ninety["k"] is None and ninety["k_lower_bound"] is None and ninety["largest_k_tried"] == 25
    facts = {"status": "measured", "params": curve.curve_params(None, k=[0, 10, 25], draws=2),
             "smallest_k": {curve.FROZEN: [eighty, ninety]}, "by_k": curve.summary_by_k(table),
             "field_train": {"train_rows": 80, "per_class": {"rot": 40, "scab": 40}}, "cohort": {"n": 50}}
    text = curve_figures.curve_headline(facts)
    assert "80 %: k = 10; its interval's lower end clears it from k = 25" in text
    assert "90 %: not reached (up to k = 25)" in text
    by_k = facts["by_k"][curve.FROZEN]
    assert [p["k"] for p in by_k] == [0, 10, 25] and by_k[1]["field_accuracy"] == pytest.approx(0.81)
    assert by_k[1]["field_accuracy_draw_min"] == pytest.approx(0.78)
    assert list(curve_figures.curve_table(facts)["k"]) == [0, 10, 25]
    assert "not trained again" not in text
    reused = {"500": "reused: the run's field-adapted compact model (chapter 5 trained it)"}
    text = curve_figures.curve_headline({**facts, "finetune": {"reused": reused}})
    assert ("The fine-tuned point at k = 500 was not trained again: it is the run's field-adapted compact "
            "model (chapter 5 trained it).") in text
    assert isinstance(curve_figures.learning_curve_figure(facts["by_k"], facts["params"]), Figure)
    json.dumps(facts, allow_nan=False)


def _features(rows: pd.DataFrame, shift: float, seed: int) -> dict[str, np.ndarray]:
    """Class 0 and 1 on opposite sides of one axis; ``shift`` moves the whole domain along another, where
    the lab's classes do not separate: a classifier fitted on the lab alone misreads the shifted domain."""
    rng = np.random.default_rng(seed)
    out = {}
    for row in rows.itertuples():
        x = rng.normal(0, 0.3, 8)
        sign = 1.0 if row.label else -1.0
        x[0] += sign if shift == 0 else 0.0
        x[1] += shift + (sign * 1.0 if shift else 0.0)
        x[2] += -sign * 2.0 if shift else 0.0  # in the field, a lab-irrelevant axis points the wrong way
        out[row.row_id] = x.astype(np.float32)
    return out


def test_frozen_curve_learns_the_field_from_field_rows_and_logs_every_test_read():
    lab = _pool({"rot": 60, "scab": 60}).assign(row_id=lambda f: "lab-" + f["row_id"])
    pool = _pool({"rot": 50, "scab": 50}).assign(row_id=lambda f: "ft-" + f["row_id"])
    cohort = _pool({"rot": 40, "scab": 40}).assign(row_id=lambda f: "co-" + f["row_id"],
                                                    no_relative=lambda f: np.arange(len(f)) % 2 == 0)
    test = _pool({"rot": 30, "scab": 30}).assign(row_id=lambda f: "te-" + f["row_id"])
    bank = curve.FeatureBank(side=32)
    bank.features.update({**_features(lab, 0.0, 1), **_features(test, 0.0, 2), **_features(pool, 3.0, 3),
                          **_features(cohort, 3.0, 4)})
    reads = []

    def read_test(state: str) -> pd.DataFrame:
        reads.append(state)
        return test

    params = curve.curve_params(None, k=[0, 10, 50], draws=2, bootstrap=50)
    rows = curve.frozen_curve(bank, {"lab_train": lab, "field_pool": pool, "cohort": cohort},
                              dict.fromkeys(("lab_train", "field_pool", "cohort", "test"), "/nowhere"),
                              NAMES, params, read_test)
    table = pd.DataFrame(rows, columns=curve.COLUMNS)
    assert list(zip(table["k"], table["draw"], strict=True)) == [(0, 0), (10, 0), (10, 1), (50, 0), (50, 1)]
    assert reads == list(table["model_state"])[:4] and len(set(reads)) == 4  # one logged read per learner
    zero = table[table["k"] == 0].iloc[0]
    top = table[table["k"] == 50]
    assert zero["field_accuracy"] < 0.6 and (top["field_accuracy"] > 0.9).all()
    assert (table["lab_test_macro_f1"] > 0.9).all()
    assert json.loads(top.iloc[0]["n_field_per_class"]) == {"rot": 50, "scab": 50}
    # k = 50 takes all 50 of each class: the second draw is the first one's rows, fitted and read once
    assert top.iloc[1]["note"] == "the same rows as draw 0" and top.iloc[1]["model_state"] == reads[-1]
    assert (table["field_accuracy_lo"] <= table["field_accuracy"]).all()
    assert (table["n_no_relative"] == 40).all() and (top["field_accuracy_no_relative"] > 0.9).all()
    again = curve.frozen_curve(bank, {"lab_train": lab, "field_pool": pool, "cohort": cohort},
                               dict.fromkeys(("lab_train", "field_pool", "cohort", "test"), "/nowhere"),
                               NAMES, params, read_test)
    assert [r["model_state"] for r in again] == list(table["model_state"])  # same seed, same learners


def _images(root, rows: pd.DataFrame, tint: int) -> None:
    rng = np.random.default_rng(tint)
    for row in rows.itertuples():
        colour = (200, 40, 40) if row.label == 0 else (40, 40, 200)
        pixels = np.clip(rng.normal(0, 20, (24, 24, 3)) + colour + tint, 0, 255).astype(np.uint8)
        path = root / row.rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)


def test_feature_bank_embeds_the_contract_squares_once(tmp_path):
    rows = _pool({"rot": 2, "scab": 2})
    _images(tmp_path, rows, 0)
    bank = curve.FeatureBank(side=32)
    first = bank.of(rows, tmp_path)
    assert first.shape == (4, 1280) and bank.sources == {"reused": 0, "computed": 4}
    np.testing.assert_array_equal(bank.of(rows.iloc[::-1], tmp_path), first[::-1])
    assert bank.sources["computed"] == 4  # nothing decoded twice


def test_finetune_points_train_score_and_read_the_test_split_through_the_door(tmp_path):
    lab = _pool({"rot": 8, "scab": 8}).assign(rel_path=lambda f: "lab/" + f["rel_path"])
    pool = _pool({"rot": 6, "scab": 6}).assign(row_id=lambda f: "ft-" + f["row_id"],
                                                rel_path=lambda f: "ft/" + f["rel_path"])
    cohort = pool.assign(row_id=lambda f: "co-" + f["row_id"], no_relative=[True, False] * 6)
    for frame, tint in ((lab, 0), (pool, 30)):
        _images(tmp_path, frame, tint)
    training = {"compact_weights": None, "compact": {"arch": "test_resnet", "epochs": 1, "batch_size": 8,
                                                      "distill": {"enabled": True}, "checkpoint_every": 0}}
    config = curve_finetune.curve_config(training, {"eval_batch_size": 16})
    assert config["distill"]["enabled"] is False and config["eval_batch_size"] == 16
    with pytest.raises(curve_finetune.CurveFinetuneError, match="overrides.*'epoch'"):
        curve_finetune.curve_config(training, {"epoch": 1})
    reads = []

    def read_test(state: str) -> pd.DataFrame:
        reads.append(state)
        return lab

    params = curve.curve_params(None, bootstrap=20, finetune={"k": [0, 4]})
    rows = curve_finetune.finetune_points(
        {"lab_train": lab, "field_pool": pool, "val": pd.concat([lab.iloc[:4], pool.iloc[:4]]),
         "cohort": cohort}, {"train": tmp_path, "cohort": tmp_path, "test": tmp_path}, NAMES, params, config,
        ImageSpec(size=32, mean=(0.5,) * 3, std=(0.5,) * 3), tmp_path / "out", read_test)
    assert [r["k"] for r in rows] == [0, 4] and [json.loads(r["n_field_per_class"]) for r in rows] == [
        {"rot": 0, "scab": 0}, {"rot": 4, "scab": 4}]
    assert reads == [r["model_state"] for r in rows] and reads[0] != reads[1]
    assert (tmp_path / "out/finetune_k4/best.pt").exists() and all(r["seconds"] > 0 for r in rows)
    assert all(0 <= r["field_accuracy"] <= 1 and r["lab_test_macro_f1"] is not None for r in rows)
    assert all(r["n_no_relative"] == 6 for r in rows)


def test_same_training_knows_a_checkpoint_of_this_recipe_on_these_rows_only(tmp_path):
    lab = _pool({"rot": 6, "scab": 6}).assign(rel_path=lambda f: "lab/" + f["rel_path"])
    _images(tmp_path, lab, 0)
    training = {"compact_weights": None, "compact": {"arch": "test_resnet", "epochs": 1, "batch_size": 8,
                                                      "checkpoint_every": 0}}
    config = curve_finetune.curve_config(training, {})
    args = {"spec": ImageSpec(size=32, mean=(0.5,) * 3, std=(0.5,) * 3), "corpus_root": tmp_path,
            "train_rows": lab, "val_rows": lab.iloc[:4], "class_names": NAMES,
            "data_fingerprints": {"split/split.parquet": "a"}, "out_dir": tmp_path / "adapted",
            "progress": False}
    # chapter 5 labels a regime's model with its regime: not part of the recipe
    best, _ = curve_finetune.train_point(args, {**config, "regime": {"name": "field_adapted"}})
    assert curve_finetune.same_training(best, args, config)
    assert not curve_finetune.same_training(best, {**args, "data_fingerprints": {"split/split.parquet": "b"}},
                                            config)
    assert not curve_finetune.same_training(best, {**args, "train_rows": lab.iloc[:10]}, config)
    assert not curve_finetune.same_training(best, args, {**config, "epochs": 2})
    assert not curve_finetune.same_training(best, args, {**config, "distill": {**config["distill"],
                                                                               "enabled": True}})


def _class_images(root, rel_paths, class_names, tint: int) -> None:
    rng = np.random.default_rng(tint)
    for rel in rel_paths:
        label = class_names.index(rel.split("/")[-2]) if rel.split("/")[-2] in class_names else 0
        colour = np.array([40 + 30 * label, 200 - 25 * label, 60 + tint], dtype=float)
        pixels = np.clip(rng.normal(0, 15, (16, 16, 3)) + colour, 0, 255).astype(np.uint8)
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)


def test_run_curve_writes_its_record_table_and_figure_and_logs_every_test_read(tmp_path):
    from split.split_runs import field_train_tables, planted_corpus, write_upstream

    from cropcop_utils import split
    from cropcop_utils.audit import cross_sets
    from cropcop_utils.core import config
    from cropcop_utils.core.evidence import Chapter
    from cropcop_utils.split import locked_test

    photos, orchard = tmp_path / "orchard_train", tmp_path / "orchard"
    photos.mkdir()
    orchard.mkdir()
    ctx = config.open_run(tmp_path / "run", profile="smoke", field=orchard, field_train=photos,
                          overrides={"field_curve": {"finetune": {"k": [10]}}})
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected)
    field, cross = field_train_tables(admitted)
    Chapter(ctx.run_dir, "corpus").write_parquet("corpus/field_train.parquet", field)
    Chapter(ctx.run_dir, "audit").write_parquet("audit/cross_groups.parquet", cross)
    # no pair across sets is close enough for the review list: the only relative is the group above
    Chapter(ctx.run_dir, "audit").write_parquet("audit/cross_sets.parquet", pd.DataFrame(
        {c: pd.Series(dtype=object) for c in cross_sets.CROSS_COLUMNS}))
    split.run_chapter(ctx)
    names = sorted(set(admitted["class_name"]))
    _class_images(ctx.corpus_root, admitted["rel_path"], names, 0)
    _class_images(photos, field["rel_path"], names, 40)
    cohort = [f"{name}/c.jpg" if i == 0 else f"{name}/c{i}.jpg" for name in ("Tomato___healthy",
              "Tomato___Leaf_Mold") for i in range(6)]
    _class_images(orchard, cohort, names, 40)

    record = curve.run_curve(ctx)
    assert record["status"] == "measured" and record["cohort"]["n"] == 12
    assert record["cohort"]["n_no_relative"] == 11  # Tomato___healthy/c.jpg shares a series with field-train
    table = pd.read_parquet(ctx.run_dir / curve.CURVE)
    assert list(zip(table["learner"], table["k"], strict=True)) == [
        (curve.FROZEN, 0), (curve.FROZEN, 10), (curve.FROZEN, 10), (curve_draws.FINETUNE, 10)]
    assert (table["n_no_relative"] == 11).all()
    held = record["field_train"]["per_class"]  # k larger than a class holds: all it holds
    assert json.loads(table.iloc[1]["n_field_per_class"]) == {c: min(10, n) for c, n in held.items()}
    log = locked_test.read_accesses(ctx.run_dir)
    assert set(table["model_state"]) <= set(log.loc[log["reader"] == "field/curve", "model_state"])
    assert (ctx.run_dir / curve.FIGURE).exists() and record["figures"]["learning_curve"] == curve.FIGURE
    assert set(record["smallest_k"]) == {curve.FROZEN, curve_draws.FINETUNE}
    assert record["finetune"]["distillation"] == curve_finetune.NO_DISTILL
    assert (ctx.run_dir / "field/curve/finetune_k10/best.pt").exists()
    text = curve_figures.curve_headline(json.loads((ctx.run_dir / "field/curve.json").read_text()))
    assert "80 %" in text and "90 %" in text
