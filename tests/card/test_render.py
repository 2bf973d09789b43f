"""The model card: rendered from fixed JSON, every number on it maps to its JSON path (strictly: the card is
its JSON's render and each printed value is checked at its path), on fixtures and on real-data cards; each
failure-mode rule fires for the state whose figures fired it and no other; its .pte snippet runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cropcop_utils.card import render as card
from cropcop_utils.core.evidence import atomic_write_json, read_registry, register, sha256_file
from cropcop_utils.nets import pte as pte_program

SHA = {
    k: (c * 64)
    for k, c in {"pte": "a", "ref": "b", "cmp": "c", "int8": "d", "split": "e", "map": "f"}.items()
}


def _ci(value, lo, hi, n):
    return {"value": value, "lo": lo, "hi": hi, "n": n}


def _state(label, sha, lab, field):
    return {
        "label": label,
        "model_state": sha,
        "lab_test": {
            "n": 115,
            "accuracy": _ci(lab, lab - 0.06, lab + 0.05, 115),
            "macro_f1": _ci(lab - 0.1, lab - 0.17, lab - 0.03, 115),
        },
        "lab_test_matched": {
            "n": 61,
            "accuracy": _ci(lab + 0.01, lab - 0.08, lab + 0.09, 61),
            "macro_f1": _ci(lab - 0.12, lab - 0.2, lab - 0.04, 61),
            "per_class_recall": {"apple_scab": _ci(0.75, 0.5, 1.0, 12)},
        },
        "field": {
            "n": 240,
            "accuracy": _ci(field, field - 0.04, field + 0.05, 240),
            "macro_f1": _ci(field - 0.02, field - 0.07, field + 0.03, 240),
            "per_class_recall": {
                "apple_scab": _ci(0.3125, 0.2, 0.43, 60),
                "apple_black_rot": _ci(0.1833, 0.09, 0.28, 60),
            },
            "direct_labels": {"n": 180, "accuracy": _ci(0.2611, 0.2, 0.33, 180)},
            "by_source_label": {
                "frog_eye_leaf_spot": {
                    "class_name": "apple_black_rot",
                    "mapping": "by symptom",
                    "accuracy": {**_ci(0.1167, 0.05, 0.2, 60), "undefined": 0},
                }
            },
        },
    }


def _swap(share):
    cell = {"n": 40, "accuracy": {**_ci(0.875, 0.775, 0.975, 40), "undefined": 0}}
    field_cell = {"n": 240, "accuracy": {**_ci(0.2417, 0.19, 0.3, 240), "undefined": 0}}
    return {
        "cells": {
            "lab_plain": cell,
            "lab_field": {"n": 40, "accuracy": _ci(0.525, 0.375, 0.675, 40)},
            "paste_control": {"n": 40, "accuracy": _ci(0.85, 0.725, 0.95, 40)},
            "field_field": field_cell,
            "field_plain": None,
        },
        "changed": {
            "lab_field": {"against": "lab_plain", "n": 40, "rate": _ci(0.4, 0.25, 0.55, 40)},
            "paste_control": {"against": "lab_plain", "n": 40, "rate": _ci(0.125, 0.025, 0.225, 40)},
            "field_plain": None,
        },
        "background_share": {
            "value": share,
            "lo": 0.3142,
            "hi": 0.8021,
            "reason": None,
            "undefined_resamples": 3,
            "n_lab": 40,
            "n_field": 240,
            "gap": 0.6333,
        },
    }


def fixed_records() -> dict[str, dict]:
    states = {
        "reference": _state("float reference", SHA["ref"], 0.4087, 0.1925),
        "compact": _state("float compact", SHA["cmp"], 0.3043, 0.1708),
        "int8": _state("converted INT8 graph", SHA["int8"], 0.3004, 0.1667),
        "pte": _state(".pte on the runtime", SHA["pte"], 0.2957, 0.1625),
    }
    looks = {
        s: {"lab_plain": _ci(0.4512, 0.41, 0.49, 16), "lab_field": _ci(0.6118, 0.55, 0.67, 16)}
        for s in states
    }
    field = {
        "chapter": "field",
        "status": "measured",
        "reason": None,
        "classes": ["apple_black_rot", "apple_scab"],
        "image": {"size": 48, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
        "params": {
            "ci_level": 0.95,
            "failure_rules": {
                "collapse_ratio": 0.5,
                "background_share": 0.5,
                "off_leaf_mass": 0.5,
                "paste_changed_rate": 0.1,
            },
        },
        "cohort": {"untested_classes": ["apple_healthy"], "admitted": 240},
        "states": states,
        "masks": {"n_estimated": 40, "target": 0.9, "iou": {**_ci(0.9312, 0.92, 0.94, 40), "undefined": 0}},
        "attribution": {
            "methods": {
                "gradcam": {"package": "grad-cam (pytorch-grad-cam)"},
                "occlusion": {"package": "captum (Occlusion)"},
            },
            "gradcam": {"reference": looks["reference"], "compact": looks["compact"]},
            "occlusion": looks,
        },
        "swap": {
            "cells_described": {"lab_plain": "lab photos as they are"},
            "states": {s: _swap(v) for s, v in zip(states, (0.5482, 0.6011, 0.4, 0.6158), strict=True)},
        },
    }
    hyper = {"epochs": 2, "batch_size": 32, "lr": 0.003, "weight_decay": 0.05, "label_smoothing": 0.1}
    model = {
        "arch": "test_resnet",
        "params": 374337,
        "image_size": 48,
        "best_epoch": 2,
        "teacher": None,
        "pretrained": {"description": "random initialisation"},
        "hyperparameters": hyper,
    }
    training = {
        "selection": "best epoch on validation macro-F1",
        "models": {
            "reference": model,
            "compact": {
                **model,
                "arch": "mobilenetv4_conv_small_050",
                "params": 979729,
                "teacher": {"temperature": 4.0, "alpha": 0.5},
            },
        },
    }
    runtime = {
        "pte": {"path": "runtime/model.pte", "sha256": SHA["pte"], "pte_mib": 1.3712},
        "selected_candidate": "static_pc_half",
    }
    split = {
        "totals": {"train": 537, "val": 115, "test": 115},
        "crossings": {"verdict": "zero crossings"},
        "fingerprints": {"split/split.parquet": SHA["split"]},
        "class_map_fingerprint": SHA["map"],
    }
    per_class = {
        "figures": {
            "n_test_rows": 115,
            "states": {
                s: {"accuracy": e["lab_test"]["accuracy"], "macro_f1": e["lab_test"]["macro_f1"]}
                for s, e in states.items()
            },
        }
    }
    abstention = {
        "deployment": {
            "state": "pte",
            "model_state": SHA["pte"],
            "temperature": 1.73,
            "score": "max_softmax",
            "threshold": 0.6211,
            "target_risk": 0.1,
            "lab_test": {
                "n": 115,
                "coverage": 0.4348,
                "coverage_ci": [0.34, 0.53],
                "selective_risk": 0.098,
                "selective_risk_ci": [0.03, 0.18],
            },
            "field": {
                "n": 240,
                "abstained_share": 0.8542,
                "abstained_share_ci": [0.81, 0.9],
                "accuracy_accepted": 0.2286,
                "accuracy_accepted_ci": [0.09, 0.37],
                "accuracy_all": 0.1625,
                "accuracy_all_ci": [0.12, 0.21],
            },
            "out_of_scope": {"n": 50, "rejection_rate": 0.72, "rejection_rate_ci": [0.58, 0.84]},
        }
    }
    return {
        "field/field.json": field,
        "training/training.json": training,
        "runtime/runtime.json": runtime,
        "split/split.json": split,
        "analysis/per_class.json": per_class,
        "abstention/abstention.json": abstention,
    }


def write_run(run_dir: Path, records: dict[str, dict]) -> None:
    for rel, obj in records.items():
        atomic_write_json(run_dir / rel, obj)
        register(run_dir, rel, rel.split("/")[0])


def audited(run_dir: Path) -> str:
    """Write the card as the chapters do and return it after the strict check found nothing."""
    card.write_card(run_dir)
    assert card.audit_card(run_dir) == []
    return (run_dir / card.CARD).read_text()


def marks(run_dir: Path) -> list[tuple[str, tuple, str]]:
    """(text, JSON path, formatter) of every value the card prints, in order."""
    traced = card.render(card.collect(run_dir, traced=True), traced=True)
    return [
        (m.group(2), tuple(json.loads(m.group(1))["p"] or ()), json.loads(m.group(1))["f"])
        for m in card._MARK.finditer(traced)
    ]


def test_every_number_on_the_card_maps_to_its_json_path(tmp_path):
    write_run(tmp_path, fixed_records())
    text = audited(tmp_path)
    # the headline, the symptom-mapped source, the abstention and the identities made it onto the card
    assert (
        "zero-shot, it scores\n16.2 % [12.2, " in text and "frog_eye_leaf_spot" in text and "85.4 %" in text
    )
    assert SHA["pte"] in text and SHA["split"] in text
    assert "collapses on field images** (rule" in text and "fires for reference, compact, int8, pte" in text
    # each figure is traced to the entry it means, not to an equal number elsewhere: the headline's lab
    # accuracy is the .pte's (29.6 %), the compact model's 30.4 % sits at its own path
    traced = marks(tmp_path)
    headline = next(m for m in traced if m[0].startswith("29.6 %"))
    assert headline[1:] == (("analysis/per_class.json", "figures", "states", "pte", "accuracy"), "ci")
    assert ("115", ("analysis/per_class.json", "figures", "n_test_rows"), "raw") in traced
    assert ("0.10", ("field/field.json", "params", "failure_rules", "paste_changed_rate"), "num") in traced
    # every digit outside the .pte snippet's code sits inside a traced value
    plain_numbers = card.NUMBER.findall(card._SNIPPET.sub(" ", text))
    traced_numbers = [n for t, _, _ in traced for n in card.NUMBER.findall(t)]
    assert len(plain_numbers) > 100 and len(plain_numbers) <= len(traced_numbers)


def test_a_number_not_in_the_json_is_caught(tmp_path):
    write_run(tmp_path, fixed_records())
    text = card.render(card.collect(tmp_path)) + "\nInvented: 77.7 %\n"
    problems = card.audit_card(tmp_path, text)
    assert len(problems) == 1 and "differs from its JSON's render" in problems[0] and "77.7" in problems[0]


def test_a_number_that_is_elsewhere_in_the_json_is_not_accepted(tmp_path):
    """The old check accepted any number found anywhere in the JSON; the strict one wants it at its path."""
    write_run(tmp_path, fixed_records())
    text = card.render(card.collect(tmp_path))
    pte, compact = "29.6 % [23.6, 34.6]", "30.4 % [24.4, 35.4]"  # both in the JSON, as lab accuracies
    assert text.count(pte) and compact in text
    swapped = text.replace(f"the `.pte` scores {pte}", f"the `.pte` scores {compact}")
    assert swapped != text
    problems = card.audit_card(tmp_path, swapped)
    line = 1 + text[: text.index(f"the `.pte` scores {pte}")].count("\n")
    assert len(problems) == 1 and f"line {line}:" in problems[0] and compact in problems[0]


def test_a_mark_pointing_at_another_path_is_caught(tmp_path):
    """Each mark is checked against the value at its own path in the files on disk."""
    records = fixed_records()
    write_run(tmp_path, records)
    traced = card.render(card.collect(tmp_path, traced=True), traced=True)
    files = {rel: json.loads((tmp_path / rel).read_text()) for rel in [*records, "registry.json"]}
    assert card.check_marks(traced, files) == []
    wrong = traced.replace(
        '["analysis/per_class.json", "figures", "states", "pte", "accuracy"]',
        '["analysis/per_class.json", "figures", "states", "compact", "accuracy"]',
    )
    assert wrong != traced
    problems = card.check_marks(wrong, files)
    assert problems and all("should read" in p and "states.compact.accuracy" in p for p in problems)
    missing = traced.replace('"n_test_rows"]', '"n_rows"]')
    assert any("n_rows is not in the run's JSON" in p for p in card.check_marks(missing, files))


def test_a_stale_card_is_caught(tmp_path):
    """The JSON changed after the card was written: the card no longer renders from it."""
    records = fixed_records()
    write_run(tmp_path, records)
    audited(tmp_path)
    records["field/field.json"]["states"]["pte"]["field"]["accuracy"]["value"] = 0.1701
    write_run(tmp_path, records)
    problems = card.audit_card(tmp_path)
    assert problems and "16.2 %" in problems[0] and "17.0 %" in problems[0]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        # typed in the template, though 115 is in the JSON (the number of test rows)
        ("Test rows: 115.", "'115' on line"),
        # computed in the template from a JSON value: equal to it, but from no path
        ("Lab: {{ (lab.pte.accuracy.value * 1) | pct }}.", "'29.6' (in '29.6 %') comes from no JSON path"),
        # a JSON number reached through a value the renderer rebuilt: equal, but from no path
        ("Rows: {{ per_class.figures.n_test_rows + 0 }}.", "'115' on line"),
    ],
)
def test_a_template_number_without_a_json_path_is_caught(tmp_path, monkeypatch, line, problem):
    write_run(tmp_path, fixed_records())
    templates = tmp_path / "templates"
    templates.mkdir()
    source = (card.TEMPLATES / "card.md.j2").read_text()
    (templates / "card.md.j2").write_text(source.replace("## Results\n", f"{line}\n\n## Results\n"))
    monkeypatch.setattr(card, "TEMPLATES", templates)
    card.write_card(tmp_path)
    problems = card.audit_card(tmp_path)
    assert len(problems) == 1 and problem in problems[0], problems


def test_card_without_field_cohort_or_abstention_says_so(tmp_path):
    records = fixed_records()
    del records["abstention/abstention.json"]
    field = records["field/field.json"]
    field.update(status="no_field_cohort", reason="this run has no field cohort", cohort=None)
    for state in field["states"].values():
        state["field"] = None
    for swap in field["swap"]["states"].values():
        swap["cells"]["lab_field"] = swap["cells"]["field_field"] = None
        swap["background_share"] = {"value": None, "lo": None, "hi": None, "reason": "no field cells"}
    write_run(tmp_path, records)
    text = audited(tmp_path)
    assert "not tested outside the lab" in text and "cannot abstain" in text
    assert "collapses on field images** (rule" in text and "not measured in this run" in text


# Failure modes: each rule on each state's own figures.  Thresholds in fixed_records: collapse_ratio 0.5,
# background_share 0.5, off_leaf_mass 0.5, paste_changed_rate 0.1.  Quiet figures sit on the boundary
# that does not fire (field accuracy exactly half the lab's: the rule is strict "<"; the ">=" rules just
# below their threshold); a firing figure sits on the boundary that fires.
RULES = {
    "collapse": "collapses on field images",
    "background": "leans on the background",
    "off_leaf": "looks off the leaf",
    "paste": "cut-and-paste alone changes decisions",
}
STATES = ("reference", "compact", "int8", "pte")


def _set_rule(records: dict, rule: str, state: str, fire: bool) -> None:
    field = records["field/field.json"]
    if rule == "collapse":
        entry = field["states"][state]
        lab = entry["lab_test_matched"]["accuracy"]["value"]
        entry["field"]["accuracy"]["value"] = (0.4999 if fire else 0.5) * lab
    elif rule == "background":
        field["swap"]["states"][state]["background_share"]["value"] = 0.5 if fire else 0.4999
    elif rule == "off_leaf":
        field["attribution"]["occlusion"][state]["lab_plain"] = _ci(0.5 if fire else 0.4999, 0.4, 0.6, 16)
    else:
        field["swap"]["states"][state]["changed"]["paste_control"]["rate"]["value"] = 0.1 if fire else 0.0999


def quiet_records() -> dict:
    records = fixed_records()
    for rule in RULES:
        for state in STATES:
            _set_rule(records, rule, state, fire=False)
    return records


def failure_lines(text: str) -> dict[str, str]:
    return {key: re.search(rf"^- \*\*{re.escape(name)}\*\* .*$", text, flags=re.M).group(0)
            for key, name in RULES.items()}


def test_no_rule_fires_on_quiet_figures(tmp_path):
    records = quiet_records()
    write_run(tmp_path, records)
    assert all(f["fires"] == [] and f["measured"] for f in card.failure_modes(card.collect(tmp_path)))
    text = audited(tmp_path)
    assert all(line.endswith("): does not fire.") for line in failure_lines(text).values())
    assert "it collapses there" not in text and "Field photographs: measured above" in text


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("rule", list(RULES))
def test_a_rule_fires_for_the_state_whose_figures_fired_it(tmp_path, rule, state):
    records = quiet_records()
    _set_rule(records, rule, state, fire=True)
    write_run(tmp_path, records)
    fired = {f["key"]: f["fires"] for f in card.failure_modes(card.collect(tmp_path))}
    assert fired == {key: [state] if key == rule else [] for key in RULES}
    text = audited(tmp_path)
    for key, line in failure_lines(text).items():
        assert line.endswith(f"): fires for {state}." if key == rule else "): does not fire."), line
    # the "not intended" sentence says the .pte collapses only when the .pte's own figures fired the rule
    pte = records["field/field.json"]["states"]["pte"]
    collapse = (
        "it collapses there ("
        + card._ci(pte["field"]["accuracy"])
        + " field\n  against "
        + card._ci(pte["lab_test_matched"]["accuracy"])
        + " lab accuracy for the `.pte`)"
    )
    if (rule, state) == ("collapse", "pte"):
        assert collapse in text and "Field photographs: measured above" not in text
    else:
        assert "it collapses there" not in text and "Field photographs: measured above" in text


@pytest.mark.parametrize("rule", list(RULES))
def test_a_state_without_the_rules_figures_is_named_not_counted(tmp_path, rule):
    records = quiet_records()
    _set_rule(records, rule, "pte", fire=True)
    field = records["field/field.json"]
    if rule == "collapse":
        field["states"]["reference"]["field"]["accuracy"]["value"] = None
    elif rule == "background":
        field["swap"]["states"]["reference"]["background_share"]["value"] = None
    elif rule == "off_leaf":
        del field["attribution"]["occlusion"]["reference"]
    else:
        field["swap"]["states"]["reference"]["changed"]["paste_control"] = None
    write_run(tmp_path, records)
    rules = {f["key"]: f for f in card.failure_modes(card.collect(tmp_path))}
    assert rules[rule]["fires"] == ["pte"] and rules[rule]["unmeasured"] == ["reference"]
    line = failure_lines(audited(tmp_path))[rule]
    assert line.endswith("): fires for pte. Not measured for reference."), line


REAL_RUNS = Path(__file__).parent / "real_runs"


@pytest.mark.parametrize("name", ["tomato_smoke_real", "apple_field"])
def test_real_data_cards_pass_the_strict_check(name):
    """Cards of real-data books, as written, with the JSON they were rendered from: the real tomato smoke
    book (smoke_real profile, no field cohort) and the real apple lab sample with the real orchard field
    cohort (runs/apple-field).  Their numbers include bare ones such as "1" (best epoch, n = 1) that the
    old check broke on."""
    run = REAL_RUNS / name
    text = (run / card.CARD).read_text()
    registry = json.loads((run / "registry.json").read_text())["artifacts"]
    for rel in [*card.SOURCES.values(), *card.OPTIONAL_SOURCES.values(), card.CARD]:
        assert sha256_file(run / rel) == registry[rel]["sha256"], rel  # the run's own files, unchanged
    assert card.audit_card(run) == []
    assert re.search(r"(?<![\w.])1(?![\w.])", card._SNIPPET.sub(" ", text))
    # one number changed on the real card is caught
    first = card.NUMBER.search(text[text.index("## Results"):])
    at = text.index("## Results") + first.start()
    changed = text[:at] + str(int(float(first.group())) + 1) + text[at + len(first.group().split(".")[0]):]
    assert changed != text and card.audit_card(run, changed)


def test_missing_source_is_named(tmp_path):
    with pytest.raises(card.CardError, match="field/field.json"):
        card.collect(tmp_path)


@pytest.mark.slow
def test_card_snippet_runs_the_smoke_pte(smoke_book):
    """The card's Python snippet loads the smoke run's .pte and agrees with the book's own scoring."""
    import numpy as np
    import torch
    from PIL import Image

    from cropcop_utils.core.config import reopen_run
    from cropcop_utils.core.imaging import ImageSpec

    run_dir = Path(smoke_book["run_dir"])
    text = (run_dir / card.CARD).read_text()
    snippet = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    image = run_dir / "snippet_input.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(image)
    namespace: dict = {}
    cwd = Path.cwd()
    try:
        import os

        os.chdir(run_dir)
        exec(compile(snippet, "card-snippet", "exec"), namespace)  # noqa: S102 - the card's own code
        name, probability = namespace["classify"](str(image))
    finally:
        os.chdir(cwd)
    assert card.audit_card(run_dir) == []  # the synthetic smoke book's card, as chapter 11 left it
    ctx = reopen_run(run_dir)
    spec = ImageSpec.from_section(ctx.section("image"))
    logits = pte_program.load_verified_pte(run_dir)(spec.load_tensor(image)[None])
    classes = [
        c["name"]
        for c in sorted(
            json.loads((run_dir / "split/class_map.json").read_text())["classes"], key=lambda c: c["index"]
        )
    ]
    assert name == classes[int(logits.argmax())]
    assert probability == pytest.approx(float(torch.softmax(logits, -1).max()), abs=1e-4)


@pytest.mark.slow
def test_the_real_data_smoke_books_card_passes_the_strict_check(apple_field_smoke_book):
    """The card of the real apple field book (chapters 10 and 11 on real lab and orchard photos): every number
    on it, the field block included, maps to a JSON path of that run."""
    run_dir = Path(apple_field_smoke_book["run_dir"])
    assert read_registry(run_dir)[card.CARD]["chapter"] == "abstention"  # as chapter 11 re-rendered it
    assert card.audit_card(run_dir) == []


def test_a_null_deployment_share_is_printed_with_its_reason(tmp_path):
    records = fixed_records()
    lab = records["abstention/abstention.json"]["deployment"]["lab_test"]
    lab.update(selective_risk=None, selective_risk_ci=[None, None],
               reasons={"selective_risk": "no test image was accepted"})
    write_run(tmp_path, records)
    text = card.render(card.collect(tmp_path))
    assert "selective risk n/a (no test image was accepted)" in text
    assert "43.5 % [34.0 %, 53.0 %]" in text


def _cohort(name, relation, source, states, untested):
    return {"name": name, "folder": f"/data/{name}", "primary": name == "orchard", "source": source,
            "field_train_source": "pp2021", "relation": relation, "photos_with_field_train_relative": 0,
            "n": 240, "untested_classes": untested, "files": f"field/cohorts/{name}/",
            "regimes": {"field_adapted": {s: e["field"] for s, e in states.items()}}}


def adapted_records(cross_source: bool) -> dict[str, dict]:
    """The fixed records of a run that shipped the field-adapted regime and scored one in-source cohort
    and, with ``cross_source``, a second cohort from another source."""
    records = fixed_records()
    field, training = records["field/field.json"], records["training/training.json"]
    field["regime"] = "field_adapted"
    field["field_train"] = {"folder": "/data/field-apple-train"}
    training["field_train_splits"] = {"train": 1700, "val": 300,
                                      "train_per_class": {"apple_black_rot": 850, "apple_scab": 850}}
    cohorts = [_cohort("orchard", "in-source", "pp2021", field["states"], [])]
    if cross_source:
        other = {s: {"field": {**e["field"], "accuracy": _ci(0.2083, 0.15, 0.27, 120), "n": 120}}
                 for s, e in field["states"].items()}
        cohorts.append(_cohort("plantdoc", "cross-source", "plantdoc", other, ["apple_healthy"]))
    field["cohorts"] = cohorts
    return records


@pytest.mark.parametrize("cross_source", [False, True])
def test_the_card_names_each_cohort_and_where_no_other_source_was_tested(tmp_path, cross_source):
    write_run(tmp_path, adapted_records(cross_source))
    text = audited(tmp_path)
    claim = text[text.index("**Where the claim stops.**"):].split("\n\n")[0]
    assert "(source `pp2021`)" in claim and "`orchard` (in-source)" in claim
    if cross_source:
        assert "`plantdoc` (cross-source)" in claim and "none of which it trained on" in claim
        assert ("From a source it was not adapted to, it scores 20.8 % [15.0, 27.0] on `plantdoc` (n = 120)"
                in claim)
        table = text[text.index("### Every field cohort"):].split("\n\n")[1]
        rows = [r for r in table.splitlines() if r.startswith("| `")]
        assert len(rows) == 8  # two cohorts x four states
        assert any(r.startswith("| `plantdoc` | cross-source | .pte on the runtime | 20.8 %") and
                   r.endswith("| apple_healthy |") for r in rows)
    else:
        assert "no field cohort from another source" in claim and "which it never trained on" in claim
        assert "### Every field cohort" not in text


def _protection(protects: bool) -> dict:
    checks = [{"target": "far_rejection", "what": "noise rejected", "value": 0.99, "op": ">=", "goal": 0.95,
               "met": True},
              {"target": "field_coverage", "what": "orchard answered",
               "value": 0.633 if not protects else 0.93, "op": ">=", "goal": 0.9, "met": protects}]
    return {"recipe": {"temperature": 0.69, "score": "mahalanobis", "score_threshold": 1.1806,
                       "confidence": "msp", "confidence_threshold": 0.9338, "in_scope_coverage": 0.95,
                       "knn_k": 10,
                       "reference_features": {"path": "abstention/reference_features.parquet", "rows": 2400,
                                              "sha256": "ab" * 32, "split": "train",
                                              "regime": "field_adapted"}},
            "chosen": "mahalanobis", "chosen_label": "Mahalanobis distance (features)",
            "program": {"method": "forward", "outputs": ["logits", "features"], "sha256": SHA["pte"]},
            "fitted_on": {"val_rows": 450, "reference_rows": 2400, "fitting_kinds": ["jigsaw"],
                          "fitting_rows": 450},
            "held_back": ["noise", "orchard"],
            "figures": {"orchard": {"kind": "in_scope", "n": 600, "coverage": 0.633,
                                    "coverage_ci": [0.594, 0.671], "selective_accuracy": 0.966,
                                    "selective_accuracy_ci": [0.942, 0.98]},
                        "noise": {"kind": "far", "n": 200, "rejected": 0.99, "rejected_ci": [0.96, 1.0]}},
            "targets": {"far_rejection": 0.95, "field_coverage": 0.9, "field_selective_accuracy": 0.97},
            "verdict": {"checks": checks, "protects": protects,
                        "unmet": [] if protects else ["orchard answered"], "unmeasured": []},
            "validation": {"field val": {"kind": "field", "n": 300, "coverage": 0.853,
                                         "selective_accuracy": 0.977, "coverage_target": 0.9,
                                         "accuracy_target": 0.97, "reach": 0.93 if protects else 0.862,
                                         "reachable": protects}},
            "hindsight": {"pairs": 40804, "pairs_meeting_all": 310 if protects else 0,
                          "best_slack": 0.012 if protects else -0.043,
                          "shortfall": 0.0 if protects else 0.043,
                          "binding": "orchard answered", "val_kept": 0.97, "confidence_threshold": 0.91}}


@pytest.mark.parametrize("protects", [False, True])
def test_the_card_says_whether_the_abstention_protects(tmp_path, protects):
    """Chapter 11's protection block on the card: the recipe, every held-back set's figures, and the verdict
    in words — "does not protect" with each missed target, or the sets it may be relied on for."""
    records = fixed_records()
    records["abstention/abstention.json"]["deployment"]["protection"] = _protection(protects)
    baseline = _protection(False)
    baseline["figures"]["orchard"].update(selective_accuracy=0.333, selective_accuracy_ci=[0.192, 0.512])
    records["abstention/abstention.json"]["deployment"]["other_regimes"] = {"baseline": baseline}
    write_run(tmp_path, records)
    text = card.render(card.collect(tmp_path))
    assert "| `orchard` | in_scope | 600 | 63.3 % [59.4 %, 67.1 %] | 96.6 % [94.2 %, 98.0 %] |" in text
    assert "| `noise` | far | 200 | – | – | 99.0 % [96.0 %, 100.0 %] |" in text
    assert "rely on the abstention threshold above" not in text
    # the lab-only regime under the same procedure: abstention must not be what makes it look deployable
    assert ("**Abstention does not make it deployable**: of the `orchard` photos it answers it is right on "
            "33.3 % (target ≥ 97 %)") in text
    if protects:
        assert "does not protect" not in text and "rely on the abstention for the sets named above" in text
    else:
        assert "**The abstention does not protect**" in text
        assert "it misses orchard answered 63.3 % (target >= 90 %)" in text
        assert "the abstention above does not protect against them" in text
        assert ("Validation foresaw the field targets' miss before any held-back input was scored: on "
                "`field val`, behind the outlier threshold, no confidence threshold answers more than 86.2 % "
                "of it at ≥ 97 % right (target: answer ≥ 90 %).") in text
    assert ("Validation foresaw" in text) == (not protects)
    if not protects:  # nor could any thresholds on this score, read off the evaluated sets
        assert ("Nor would other thresholds on this score help: not one of 40804 pairs of outlier and "
                "confidence thresholds meets every target even when read off these evaluated sets (the best "
                "falls 4.3 % short on orchard answered).") in text
    else:
        assert "Nor would other thresholds" not in text  # said only where the abstention does not protect
    (tmp_path / card.CARD).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / card.CARD).write_text(text)
    assert card.audit_card(tmp_path) == []  # every number on it maps to its JSON path


@pytest.mark.parametrize("identical", [True, False])
def test_the_card_names_the_device_program_and_what_its_outputs_were_checked_against(tmp_path, identical):
    records = fixed_records()
    runtime = records["runtime/runtime.json"]
    check = {"rows": 115, "identical": identical, "top1_agreement": 1.0,
             "max_abs_diff": {"logits": 0.0 if identical else 0.0125, "features": 0.0}}
    runtime["device_program"] = {"path": "runtime/model_device.pte", "sha256": "d" * 64, "batch": 1,
                                 "check": check}
    runtime["latency_ratios"] = {"memory_ratio": 1.51, "device_memory_ratio": 0.42}
    write_run(tmp_path, records)
    text = audited(tmp_path)
    line = next(line for line in text.splitlines() if line.startswith("On a device, load"))
    assert "`runtime/model_device.pte`" in line and "d" * 64 in line and "batch of 1" in line
    assert ("identical to `runtime/model.pte`" in line) == identical
    assert ("at most 0.0125 in the logits" in line) == (not identical)
    assert "0.42× the eager float model's (the batched program: 1.51×)" in line
    write_run(tmp_path, fixed_records())      # a run made before chapter 7 lowered a device program
    assert "On a device" not in audited(tmp_path)
