"""The field chapter's prose and tables, rendered from ``field/field.json`` (numbers never typed)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..card.render import _ci, _pct
from .composites import CELLS


def headline(facts: dict[str, Any]) -> str:
    level = _pct(facts["params"]["ci_level"], 0)
    if facts["status"] != "measured":
        return f"**No field cohort.** {facts['reason']}."
    cohort = facts["cohort"]
    lines = [
        f"The field cohort holds {cohort['files_seen']} files: {cohort['admitted']} admitted, "
        f"{cohort['quarantined']} quarantined with a reason, {cohort['left_out']} left out (class without "
        f"a lab counterpart: {', '.join(cohort['unmatched_classes']) or 'none'})"
        + (f", {cohort['not_sampled']} not in the content-hash sample (fraction "
           f"{cohort['sample']['fraction']}, listed in `{cohort['sample']['not_sampled_list']}`)"
           if cohort.get("not_sampled") else "")
        + ". Lab classes untested "
        f"outside the lab: {', '.join(cohort['untested_classes']) or 'none'}. Intervals: {level} bootstrap."
    ]
    adapted = facts.get("field_train")
    if adapted:
        lines.append(
            f"The run also has labelled field photos for training (`{adapted['folder']}`); "
            f"{adapted['cohort_photos_with_relative']} of the cohort's {cohort['admitted']} photos may have "
            f"been seen in another shot: {adapted['trusted_relative']} have a trusted relative among them "
            "(a copy, the same leaf shot again: chapter 2's cross-set audit) and "
            f"{adapted['near_miss_relative']} a near miss on the audit's review list. Each field score is "
            "also given on the photos with neither."
        )
    for entry in facts["states"].values():
        field = entry["field"] or {"n": 0}
        kind = "zero-shot" if facts.get("regime") != "field_adapted" else "after field adaptation"
        lines.append(
            f"- **{entry['label']}**: lab test (same classes) {_ci(entry['lab_test_matched']['accuracy'])}"
            f" (n = {entry['lab_test_matched']['n']}); field, {kind} {_ci(field.get('accuracy'))} "
            f"(n = {field['n']}), macro-F1 {_ci(field.get('macro_f1'))}" + relatives_clause(field) + "."
        )
    return "\n".join(lines)


def _points(entry: dict[str, Any]) -> str:
    """A difference of two shares in percentage points with its interval, or ``n/a (reason)``."""
    if entry.get("value") is None:
        return _ci(entry)
    text = f"{100 * entry['value']:+.1f} points"
    if entry.get("lo") is not None:
        text += f" [{100 * entry['lo']:+.1f}, {100 * entry['hi']:+.1f}]"
    return text


def relatives_clause(field: dict[str, Any]) -> str:
    """``; without a field-train relative …`` for a cohort score of a run with field-train, else ''."""
    effect = field.get("field_train_relatives")
    if not effect:
        return ""
    unrelated, gap = effect["without_relative"], effect["accuracy_gap"]
    return (f"; on the {effect['unrelated']} photos with no field-train relative "
            f"{_ci(unrelated.get('accuracy'))}, macro-F1 {_ci(unrelated.get('macro_f1'))} (whole cohort"
            f" minus these: {_points(gap)})")


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
        effect = field.get("field_train_relatives")
        if effect:
            row["field accuracy, no field-train relative"] = _ci(effect["without_relative"]["accuracy"])
            row["field n, no field-train relative"] = effect["unrelated"]
            row["accuracy gap (whole − unrelated)"] = _points(effect["accuracy_gap"])
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


def _change(entry: dict[str, Any] | None) -> str:
    """``regime against baseline, change ±x.x points [lo, hi]``, or ``n/a (reason)``."""
    if not entry or entry.get("value") is None:
        return _ci(entry)
    text = f"{_pct(entry['regime'])} against {_pct(entry['baseline'])}, "
    text += f"change {100 * entry['value']:+.1f} points"
    if entry.get("lo") is not None:
        text += f" [{100 * entry['lo']:+.1f}, {100 * entry['hi']:+.1f}]"
    return text


def regime_text(facts: dict[str, Any]) -> str:
    """Per compared regime, the `.pte`'s and the float compact model's changes against the baseline."""
    comparison = facts.get("comparison") or {}
    if not comparison:
        regime = facts.get("regime", "baseline")
        return f"This run trained one regime (`{regime}`); there is nothing to set beside it."
    lines = [
        f"Shipped regime: **`{facts.get('regime')}`**. Every change is the regime minus the baseline on the "
        "same rows (same images, same composites, same attribution images), with a paired bootstrap "
        "interval in points."
    ]
    for name, entry in comparison.items():
        for state in ("pte", "compact"):
            s = entry["states"].get(state)
            if s is None:
                continue
            field = s["field"] or {}
            cam = (s["off_leaf"].get("gradcam") or {}).get("lab_field")
            occ = (s["off_leaf"].get("occlusion") or {}).get("lab_field")
            lines.append(
                f"- **`{name}`, {facts['states'][state]['label']}**: field accuracy "
                f"{_change(field.get('accuracy'))}; field macro-F1 {_change(field.get('macro_f1'))}; "
                f"lab test macro-F1 {_change(s['lab_test']['macro_f1'])}; background share of the gap "
                f"{_change(s['background_share'])}; off-leaf mass on `lab_field` "
                + (f"(Grad-CAM) {_change(cam)}" if cam else f"(occlusion) {_change(occ)}")
                + "."
            )
    return "\n".join(lines)


def regime_table(facts: dict[str, Any]) -> pd.DataFrame:
    """Every measure of every state, regime against baseline (the chapter's ``regime_changes`` table)."""
    from .figures import change_rows

    table = change_rows(facts.get("comparison") or {})
    if not len(table):
        return table
    for column in ("baseline", "regime_value", "change", "lo", "hi"):
        table[column] = table[column].astype(float).round(4)
    return table
