"""Chapter 10's "every field cohort" section: each cohort's relation in words (declared, or the audit's
evidence where nobody declared a source), its figures from its own block, and a one-cohort run saying that
no other source was tested."""

from __future__ import annotations

from cropcop_utils.core import cohorts as run_cohorts
from cropcop_utils.field import cohorts_frame, cohorts_text
from cropcop_utils.field.cohort_prose import relation_sentence
from cropcop_utils.field.cohorts import cohort_table


def _score(value, n):
    return {"value": value, "lo": value - 0.05, "hi": value + 0.05, "n": n}


def _entry(name, relation, accuracy, related=0, source=None):
    result = {"n": 100, "accuracy": _score(accuracy, 100), "macro_f1": _score(accuracy - 0.01, 100)}
    return {"name": name, "folder": f"/data/{name}", "primary": name == "orchard", "source": source,
            "field_train_source": "pp", "relation": relation, "photos_with_field_train_relative": related,
            "n": 100, "untested_classes": ["Apple_healthy"] if name != "orchard" else [],
            "regimes": {"field_adapted": {"pte": result}, "baseline": {"pte": {**result, "accuracy":
                                                                             _score(0.3, 100)}}}}


FACTS = {"regime": "field_adapted", "states": {"pte": {"label": ".pte on the runtime"}},
         "cohorts": [_entry("orchard", run_cohorts.IN_SOURCE, 0.9, 12, "pp"),
                     _entry("plantdoc", run_cohorts.CROSS_SOURCE, 0.55, 0, "plantdoc")]}


def test_each_relation_is_said_plainly_and_undeclared_sources_show_the_audits_evidence():
    assert "**in-source**" in relation_sentence(FACTS["cohorts"][0]) and "(`pp`)" in relation_sentence(
        FACTS["cohorts"][0])
    assert "never trained on this source" in relation_sentence(FACTS["cohorts"][1])
    related = relation_sentence(_entry("x", run_cohorts.UNDECLARED, 0.5, related=7))
    assert "source undeclared" in related and "found 7 of its photos related" in related
    unrelated = relation_sentence(_entry("x", run_cohorts.UNDECLARED, 0.5, related=0))
    assert "does not prove another source" in unrelated
    assert "zero-shot" in relation_sentence(_entry("x", run_cohorts.NOT_ADAPTED, 0.5))


def test_every_cohort_is_shown_with_its_own_figures_under_the_shipped_regime():
    text = cohorts_text(FACTS)
    assert "scored 2 field cohorts" in text and "`orchard` is primary" in text
    orchard, plantdoc = text.index("**`orchard`**"), text.index("**`plantdoc`**")
    assert "accuracy 90.0 % [85.0, 95.0]" in text[orchard:plantdoc]
    assert "accuracy 55.0 % [50.0, 60.0]" in text[plantdoc:]
    assert "untested by it: Apple_healthy" in text[plantdoc:]
    assert "30.0 %" not in text  # the baseline's figures are not the shipped regime's
    frame = cohorts_frame(FACTS)
    assert len(frame) == 4 and set(frame["regime"]) == {"field_adapted", "baseline"}
    table = cohort_table(FACTS["cohorts"], "field_adapted")
    assert table["accuracy"].tolist() == [0.9, 0.55] and table["cohort"].tolist() == ["orchard", "plantdoc"]


def test_a_run_with_one_cohort_says_no_other_source_was_tested():
    text = cohorts_text({**FACTS, "cohorts": FACTS["cohorts"][:1]})
    assert "one field cohort" in text and "is untested" in text
    assert cohorts_text({**FACTS, "cohorts": []}).startswith("This run scored no field cohort")
