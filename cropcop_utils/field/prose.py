"""The field chapter's prose and tables, rendered from ``field/field.json`` (numbers never typed)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..card import _ci, _pct
from .composites import CELLS


def headline(facts: dict[str, Any]) -> str:
    level = _pct(facts["params"]["ci_level"], 0)
    if facts["status"] != "measured":
        return f"**No field cohort.** {facts['reason']}."
    cohort = facts["cohort"]
    lines = [
        f"The field cohort holds {cohort['files_seen']} files: {cohort['admitted']} admitted, "
        f"{cohort['quarantined']} quarantined with a reason, {cohort['left_out']} left out (class without "
        f"a lab counterpart: {', '.join(cohort['unmatched_classes']) or 'none'}). Lab classes untested "
        f"outside the lab: {', '.join(cohort['untested_classes']) or 'none'}. Intervals: {level} bootstrap."
    ]
    for entry in facts["states"].values():
        field = entry["field"] or {"n": 0}
        lines.append(
            f"- **{entry['label']}**: lab test (same classes) {_ci(entry['lab_test_matched']['accuracy'])}"
            f" (n = {entry['lab_test_matched']['n']}); field, zero-shot {_ci(field.get('accuracy'))} "
            f"(n = {field['n']}), macro-F1 {_ci(field.get('macro_f1'))}."
        )
    return "\n".join(lines)


def state_table(facts: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for name, entry in facts["states"].items():
        field = entry["field"] or {}
        row = {
            "state": name,
            "lab test accuracy": _ci(entry["lab_test"]["accuracy"]),
            "lab test n": entry["lab_test"]["n"],
            "lab (field classes) accuracy": _ci(entry["lab_test_matched"]["accuracy"]),
            "field accuracy": _ci(field.get("accuracy")),
            "field macro-F1": _ci(field.get("macro_f1")),
            "field n": field.get("n"),
        }
        for source, mapped in (field.get("by_source_label") or {}).items():
            row[f"{source} (by symptom)"] = f"{_ci(mapped['accuracy'])} (n = {mapped['accuracy']['n']})"
        rows.append(row)
    return pd.DataFrame(rows)


def recall_table(facts: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for name, entry in facts["states"].items():
        for cls, recall in ((entry["field"] or {}).get("per_class_recall") or {}).items():
            lab = entry["lab_test_matched"].get("per_class_recall", {}).get(cls)
            rows.append(
                {
                    "state": name,
                    "class": cls,
                    "field recall": _ci(recall),
                    "field n": recall["n"],
                    "lab recall": _ci(lab),
                    "lab n": lab["n"] if lab else 0,
                }
            )
    return pd.DataFrame(rows)


def masks_text(facts: dict[str, Any]) -> str:
    masks = facts["masks"]
    if masks["iou"] is None:
        return f"Leaf masks were estimated for {masks['n_estimated']} lab test photos. {masks['reason']}."
    verdict = "meets" if masks["meets_target"] else "misses"
    return (
        f"Leaf masks were estimated for {masks['n_estimated']} lab test photos. Against the synthetic true "
        f"masks the mean IoU is {_ci(masks['iou'])} (n = {masks['iou']['n']}, median "
        f"{masks['iou_median']:.3f}, lowest {masks['iou_min']:.3f}); {_pct(masks['share_at_target'])} "
        f"of masks reach the target {masks['target']:.2f}, and the mean {verdict} it."
    )


def attribution_table(facts: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for method in ("gradcam", "occlusion"):
        for state, cells in facts["attribution"].get(method, {}).items():
            rows.append(
                {
                    "method": method,
                    "state": state,
                    **{
                        cell: f"{_ci(cells.get(cell))} (n = {cells[cell]['n']})" if cells.get(cell) else "–"
                        for cell in CELLS
                    },
                }
            )
    return pd.DataFrame(rows)


def swap_table(facts: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for state, entry in facts["swap"]["states"].items():
        row: dict[str, Any] = {"state": state}
        for cell in CELLS:
            value = entry["cells"].get(cell)
            row[cell] = f"{_ci(value['accuracy'])} (n = {value['n']})" if value else "–"
        for cell, changed in entry["changed"].items():
            row[f"changed: {cell}"] = _ci(changed["rate"]) if changed else "–"
        row["background share of the gap"] = _ci(entry["background_share"])
        rows.append(row)
    return pd.DataFrame(rows)
