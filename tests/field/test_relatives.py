"""Field-train photos never reach a scored cohort's "no relative" figures: a field-train photo planted in
the cohort (its bytes, or its pixels re-saved) is found by chapter 2's cross-set audit, flagged as related
and left out of the score on the photos without a relative."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, PngImagePlugin
from scipy.ndimage import gaussian_filter

from cropcop_utils.audit import cross_sets
from cropcop_utils.core.config import load_profile
from cropcop_utils.core.evidence import row_id, sha256_file
from cropcop_utils.corpus.field_sets import field_row_id, scan_field
from cropcop_utils.field.relatives import relatives_in_audit
from cropcop_utils.field.scores import field_results

CFG = {**load_profile("default")["audit"], "workers": 1}
CLASSES = ["Apple_rust", "Apple_scab"]
PARAMS = {"ci_level": 0.95, "bootstrap": 200, "seed": 0}


def _png(seed: int, note: str | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(96, 96, 3)), (4, 4, 0))
    field = (30 + 200 * (field - field.min()) / (field.max() - field.min())).astype(np.uint8)
    info = PngImagePlugin.PngInfo()
    if note:
        info.add_text("Comment", note)
    buffer = io.BytesIO()
    Image.fromarray(field).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_a_field_train_photo_planted_in_the_cohort_is_flagged_and_left_out(tmp_path: Path) -> None:
    lab = _folder(tmp_path / "lab", {"Apple_rust/l1.png": _png(1), "Apple_scab/l2.png": _png(2)})
    train = _folder(tmp_path / "train", {"Apple_rust/t3.png": _png(3), "Apple_scab/t4.png": _png(4),
                                         "Apple_scab/t5.png": _png(5)})
    cohort = _folder(tmp_path / "orchard", {
        "Apple_rust/planted_bytes.png": _png(3),                # t3's bytes
        "Apple_scab/planted_pixels.png": _png(4, "re-saved"),   # t4's pixels, other metadata
        **{f"Apple_{'rust' if k % 2 else 'scab'}/c{k}.png": _png(10 + k) for k in range(6)},
    })
    rels = sorted(p.relative_to(lab).as_posix() for p in lab.rglob("*.png"))
    lab_rows = pd.DataFrame({"row_id": [row_id(r) for r in rels], "rel_path": rels,
                             "class_name": [r.split("/")[0] for r in rels],
                             "sha256": [sha256_file(lab / r) for r in rels]})
    scanned = scan_field(cohort, CLASSES).rows
    train_rows = scan_field(train, CLASSES, row_prefix="field_train").rows
    audit = cross_sets.audit_sets([cross_sets.AuditSet("lab", lab, lab_rows),
                                   cross_sets.AuditSet("field_train", train, train_rows),
                                   cross_sets.AuditSet("cohort:orchard", cohort, scanned)], CFG, workers=1)
    related = relatives_in_audit(audit.groups, audit.table, CFG)
    planted = {field_row_id("Apple_rust/planted_bytes.png"), field_row_id("Apple_scab/planted_pixels.png")}
    assert related["trusted"] == planted and not related["near_miss"]

    # the model is right on every planted photo and wrong on half the others: the unrelated score drops
    label = scanned["label"].to_numpy()
    pred = np.where(scanned["row_id"].isin(planted) | (np.arange(len(scanned)) % 2 == 0), label, 1 - label)
    record = pd.DataFrame({"row_id": scanned["row_id"], "label": label, "pred": pred})
    effect = field_results(record, scanned, CLASSES, PARAMS, related["trusted"] | related["near_miss"])[
        "field_train_relatives"]
    assert (effect["related"], effect["unrelated"]) == (2, len(scanned) - 2)
    unrelated = ~scanned["row_id"].isin(planted).to_numpy()
    assert effect["without_relative"]["accuracy"]["value"] == (label == pred)[unrelated].mean()
    assert effect["accuracy_gap"]["value"] > 0


def test_each_cohort_gets_its_own_relatives_though_row_ids_repeat_across_cohorts(tmp_path: Path) -> None:
    """Two cohorts with the same file names (row ids apart by their prefixes, as chapter 2 scans them): a
    field-train photo planted in one is that cohort's relative only."""
    lab = _folder(tmp_path / "lab", {"Apple_rust/l1.png": _png(1), "Apple_scab/l2.png": _png(2)})
    train = _folder(tmp_path / "train", {"Apple_rust/t3.png": _png(3), "Apple_scab/t4.png": _png(4)})
    names = ["Apple_rust/a.png", "Apple_scab/b.png", "Apple_rust/c.png"]
    planted = _folder(tmp_path / "planted", dict(zip(names, [_png(3), _png(20), _png(21)], strict=True)))
    clean = _folder(tmp_path / "clean", dict(zip(names, [_png(30), _png(31), _png(32)], strict=True)))
    rels = sorted(p.relative_to(lab).as_posix() for p in lab.rglob("*.png"))
    lab_rows = pd.DataFrame({"row_id": [row_id(r) for r in rels], "rel_path": rels,
                             "class_name": [r.split("/")[0] for r in rels],
                             "sha256": [sha256_file(lab / r) for r in rels]})
    audit = cross_sets.audit_sets([
        cross_sets.AuditSet("lab", lab, lab_rows),
        cross_sets.AuditSet("field_train", train, scan_field(train, CLASSES, row_prefix="field_train").rows),
        cross_sets.AuditSet("cohort:planted", planted, scan_field(planted, CLASSES).rows),
        cross_sets.AuditSet("cohort:clean", clean,
                            scan_field(clean, CLASSES, row_prefix="field@clean").rows)],
        CFG, workers=1)
    first = relatives_in_audit(audit.groups, audit.table, CFG, "cohort:planted")
    second = relatives_in_audit(audit.groups, audit.table, CFG, "cohort:clean")
    assert first["trusted"] == {field_row_id("Apple_rust/a.png")}
    assert second == {"trusted": set(), "near_miss": set()}
    # without a cohort named, every cohort's rows count
    assert relatives_in_audit(audit.groups, audit.table, CFG)["trusted"] == first["trusted"]
