"""Training regimes: which ones a profile trains, which ships, where each regime's files live; and the
side-by-side path of the smoke book (both regimes through every chapter after training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cropcop_utils.training import regimes
from cropcop_utils.training.regimes import Regime, RegimeConfigError


def test_one_regime_by_default_and_it_owns_the_plain_paths():
    items = regimes.regimes({})
    assert [(r.name, r.shipped) for r in items] == [("baseline", True)]
    assert items[0].path("training/compact/best.pt") == "training/compact/best.pt"
    assert items[0].folder("ptq") == "ptq"


def test_the_shipped_regime_comes_last_and_the_others_move_one_folder_down():
    section = {"regime": ["background_robust", "baseline"], "shipped_regime": "background_robust"}
    items = regimes.regimes(section)
    assert [(r.name, r.shipped) for r in items] == [("baseline", False), ("background_robust", True)]
    base = regimes.reference_regime(items)
    assert base is not None and base.path("runtime/model.pte") == "runtime/baseline/model.pte"
    assert base.folder("ptq") == "ptq/baseline"
    assert regimes.shipped(items).path("runtime/model.pte") == "runtime/model.pte"


def test_without_shipped_regime_the_last_listed_ships():
    items = regimes.regimes({"regime": ["baseline", "background_robust"], "shipped_regime": None})
    assert regimes.shipped(items).name == "background_robust"


@pytest.mark.parametrize("section, message", [
    ({"regime": "dropout"}, "unknown regime"),
    ({"regime": ["baseline", "baseline"]}, "twice"),
    ({"regime": []}, "no regime"),
    ({"regime": "baseline", "shipped_regime": "background_robust"}, "not trained"),
])
def test_bad_regime_sections_are_refused(section, message):
    with pytest.raises(RegimeConfigError, match=message):
        regimes.regimes(section)


def test_a_path_outside_a_chapter_folder_is_refused():
    with pytest.raises(ValueError, match="chapter folder"):
        Regime("baseline", False).path("params.yaml")


def test_smoke_book_sets_both_regimes_side_by_side(smoke_book):
    run = Path(smoke_book["run_dir"])
    training = json.loads((run / "training/training.json").read_text())
    assert set(training["regimes"]) == {"baseline", "background_robust"}
    assert training["shipped_regime"] == "background_robust"
    robust = training["regimes"]["background_robust"]
    assert robust["background"]["pool"]["sha256"] == training["outputs"]["training/background_pool.npz"]
    assert robust["models"]["compact"]["hyperparameters"]["regime"]["pool_sha256"] == \
        robust["background"]["pool"]["sha256"]
    assert training["attribution_penalty"]["ran"] is False and training["attribution_penalty"]["reason"]
    # every later chapter scored the baseline from its own files
    for rel in ("training/baseline/compact/best.pt", "ptq/baseline/selected.pt2",
                "runtime/baseline/model.pte", "field/baseline/predictions_pte.parquet",
                "abstention/baseline/predictions_val_pte.parquet"):
        assert (run / rel).is_file(), rel
    per_class = json.loads((run / "analysis/per_class.json").read_text())
    assert {r["state"] for r in per_class["regimes"]["table"]} == {"reference", "compact", "int8", "pte"}
    field = json.loads((run / "field/field.json").read_text())
    pte = field["comparison"]["background_robust"]["states"]["pte"]
    assert pte["field"]["accuracy"]["n"] > 0 and set(pte["cells"]) >= {"lab_plain", "lab_field"}
    base_acc = field["regimes"]["baseline"]["states"]["pte"]["field"]["accuracy"]["value"]
    robust_acc = field["regimes"]["background_robust"]["states"]["pte"]["field"]["accuracy"]["value"]
    assert pte["field"]["accuracy"]["value"] == pytest.approx(robust_acc - base_acc)
    abstention = json.loads((run / "abstention/abstention.json").read_text())
    assert set(abstention["regimes"]["baseline"]["states"]) == {"reference", "compact", "int8", "pte"}
    card = (run / "field/card.md").read_text()
    assert "`background_robust`** training regime" in card and "Training regimes side by side" in card


def test_only_the_field_adapted_regime_uses_field_train_and_it_needs_a_field_train_folder(tmp_path):
    from types import SimpleNamespace

    section = {"regime": ["baseline", "field_adapted"]}
    items = regimes.regimes(section)
    assert [(r.name, r.uses_field_train) for r in items] == [("baseline", False), ("field_adapted", True)]
    assert regimes.shipped(items).name == "field_adapted"

    def run(field_train):
        return SimpleNamespace(section=lambda name: section, field_train=field_train)

    assert [r.name for r in regimes.of_run(run(str(tmp_path)))] == ["baseline", "field_adapted"]
    with pytest.raises(RegimeConfigError, match="--field-train"):
        regimes.of_run(run(None))
