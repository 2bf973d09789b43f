"""Chapter 10's "every field cohort" section, rendered from ``field.json``'s ``cohorts`` list."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..card.render import _ci
from ..core.cohorts import CROSS_SOURCE, IN_SOURCE, NOT_ADAPTED, UNDECLARED
from .prose import relatives_clause


def relation_sentence(entry: dict[str, Any]) -> str:
    """What the cohort is to the adapted model, in words, with the audit's evidence where nobody declared
    the sources."""
    relation, related = entry["relation"], entry.get("photos_with_field_train_relative")
    if relation == NOT_ADAPTED:
        return "the run has no field-train photos, so every model scored it zero-shot"
    if relation == IN_SOURCE:
        return (f"**in-source**: from the source (`{entry['source']}`) of the field-train photos the adapted "
                f"model learnt from ({related} of its photos have a relative among them in chapter 2's "
                "audit)")
    if relation == CROSS_SOURCE:
        return (f"**cross-source**: source `{entry['source']}`, not the field-train photos' "
                f"`{entry['field_train_source']}`: the adapted model never trained on this source "
                f"({related} of its photos have a relative among the field-train photos in chapter 2's "
                "audit)")
    assert relation == UNDECLARED, relation
    evidence = (f"the audit found {related} of its photos related to field-train photos (a copy, the same "
                "leaf shot again, or a near miss), evidence that it comes from the same source"
                if related else "the audit found none of its photos related to a field-train photo, which "
                "does not prove another source")
    return ("**source undeclared** (name both with `--field SOURCE=PATH` and `--field-train SOURCE=PATH` to "
            f"call it in- or cross-source); {evidence}")


def cohorts_text(facts: dict[str, Any]) -> str:
    """Per cohort: where it is, what it is to the adapted model, its classes left untested, and the shipped
    regime's figures per state; a run with one cohort says that no other source was tested."""
    scored = facts.get("cohorts") or []
    if not scored:
        return "This run scored no field cohort: nothing is known about these models outside the lab."
    regime = facts.get("regime", "baseline")
    lines = []
    if len(scored) == 1:
        lines.append(f"This run scored one field cohort, `{scored[0]['name']}`; no cohort from any other "
                     "source was given (`--field` once more adds one), so how the models do on photographs "
                     "from another source is untested.")
    else:
        lines.append(f"This run scored {len(scored)} field cohorts, each on its own (nothing is pooled). "
                     f"`{scored[0]['name']}` is primary: attribution, the background swap, the learning "
                     "curve and chapter 11's field figures use it. Figures below: the shipped regime "
                     f"(`{regime}`).")
    for entry in scored:
        untested = ", ".join(entry["untested_classes"] or []) or "none"
        source = f"source `{entry['source']}`; " if entry["source"] else ""
        lines.append(f"- **`{entry['name']}`** (`{entry['folder']}`; {source}{entry['n']} photos admitted): "
                     f"{relation_sentence(entry)}. Lab classes untested by it: {untested}.")
        for state, result in (entry["regimes"].get(regime) or {}).items():
            if result is None:
                continue
            label = facts["states"][state]["label"] if state in facts.get("states", {}) else state
            lines.append(f"  - {label}: accuracy {_ci(result.get('accuracy'))}, macro-F1 "
                         f"{_ci(result.get('macro_f1'))} (n = {result['n']})" + relatives_clause(result)
                         + ".")
    return "\n".join(lines)


def cohorts_frame(facts: dict[str, Any]) -> pd.DataFrame:
    """Every cohort, regime and state: n, accuracy and macro-F1 with intervals, and the "no relative"
    accuracy."""
    rows = []
    for entry in facts.get("cohorts") or []:
        for regime, states in entry["regimes"].items():
            for state, result in states.items():
                result = result or {}
                effect = result.get("field_train_relatives") or {}
                rows.append({
                    "cohort": entry["name"], "relation": entry["relation"], "regime": regime, "state": state,
                    "n": result.get("n"), "accuracy": _ci(result.get("accuracy")),
                    "macro-F1": _ci(result.get("macro_f1")),
                    "accuracy, no field-train relative": _ci((effect.get("without_relative") or {})
                                                             .get("accuracy")) if effect else "–",
                    "untested classes": ", ".join(entry["untested_classes"] or []) or "none",
                })
    return pd.DataFrame(rows)
