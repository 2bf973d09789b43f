"""The model card: rendered from fixed JSON, every number on it traces to that JSON; its .pte snippet runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cropcop_utils.card import render as card
from cropcop_utils.core.evidence import atomic_write_json, register
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


def _walk(obj, strings: set[str], numbers: list[float]) -> None:
    if isinstance(obj, dict):
        for value in obj.values():
            _walk(value, strings, numbers)
    elif isinstance(obj, list):
        for value in obj:
            _walk(value, strings, numbers)
    elif isinstance(obj, str):
        strings.add(obj)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        numbers.append(obj)


def renderings(numbers: list[float]) -> set[str]:
    """Every way the card's formatters (card.FORMATS) print a JSON number."""
    out: set[str] = set()
    for v in numbers:
        out.add(str(v))
        for digits in (0, 1, 2, 3):
            out.update({f"{v:.{digits}f}", f"{100 * v:.{digits}f}"})
    return out


def untraced_numbers(text: str, sources: list[dict]) -> list[str]:
    strings: set[str] = set()
    numbers: list[float] = []
    for obj in sources:
        _walk(obj, strings, numbers)
    prose = re.sub(r"```.*?```", " ", text, flags=re.S)  # the code block is checked by running it
    for s in sorted((s for s in strings if re.search(r"\d", s)), key=len, reverse=True):
        prose = prose.replace(s, " ")  # hashes, paths, architecture names
    prose = prose.replace("SHA-256", " ")
    tokens = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])", prose)
    allowed = renderings(numbers)
    return [t for t in tokens if t.lstrip("-") not in allowed and t not in allowed]


def test_every_number_on_the_card_is_in_its_json(tmp_path):
    records = fixed_records()
    write_run(tmp_path, records)
    text = card.render(card.collect(tmp_path))
    registry = json.loads((tmp_path / "registry.json").read_text())
    assert untraced_numbers(text, [*records.values(), registry]) == []
    # the headline, the symptom-mapped source, the abstention and the identities made it onto the card
    assert (
        "zero-shot, it scores\n16.2 % [12.2, " in text and "frog_eye_leaf_spot" in text and "85.4 %" in text
    )
    assert SHA["pte"] in text and SHA["split"] in text
    assert "collapses on field images** (rule" in text and "fires for reference, compact, int8, pte" in text


def test_a_number_not_in_the_json_is_caught(tmp_path):
    records = fixed_records()
    write_run(tmp_path, records)
    text = card.render(card.collect(tmp_path)) + "\nInvented: 77.7 %\n"
    assert untraced_numbers(text, list(records.values())) == ["77.7"]


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
    text = card.render(card.collect(tmp_path))
    assert "not tested outside the lab" in text and "cannot abstain" in text
    assert "collapses on field images** (rule" in text and "not measured in this run" in text
    assert untraced_numbers(text, list(records.values())) == []


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


def test_a_null_deployment_share_is_printed_with_its_reason(tmp_path):
    records = fixed_records()
    lab = records["abstention/abstention.json"]["deployment"]["lab_test"]
    lab.update(selective_risk=None, selective_risk_ci=[None, None],
               reasons={"selective_risk": "no test image was accepted"})
    write_run(tmp_path, records)
    text = card.render(card.collect(tmp_path))
    assert "selective risk n/a (no test image was accepted)" in text
    assert "43.5 % [34.0 %, 53.0 %]" in text
