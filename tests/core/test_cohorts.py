"""``--field`` given once or more and ``SOURCE=PATH`` declarations: what params.yaml records, what a reopened
run sees, and how a cohort's relation to the field-train photos follows from the declarations."""

from __future__ import annotations

import pytest
import yaml

from cropcop_utils.core import cohorts, config


def _folders(tmp_path, *names):
    out = []
    for name in names:
        (tmp_path / name).mkdir(parents=True)
        out.append(tmp_path / name)
    return out


def test_source_is_split_off_only_when_it_is_a_name_and_the_whole_is_not_a_path(tmp_path):
    assert cohorts.split_source("pp2021=/data/field-apple") == ("pp2021", "/data/field-apple")
    assert cohorts.split_source("/data/field-apple") == (None, "/data/field-apple")
    assert cohorts.split_source("../a/b=c") == (None, "../a/b=c")       # '/' before '=': a path
    odd = tmp_path / "x=y"
    odd.mkdir()
    assert cohorts.split_source(str(odd)) == (None, str(odd))          # an existing path wins
    assert cohorts.split_source("name=") == (None, "name=")


def test_names_are_the_folders_own_and_stay_unique():
    assert cohorts.cohort_names(["/a/field-apple", "synthetic", "/b/field-apple", "/c/field-apple"]) == [
        "field-apple", "synthetic", "field-apple-2", "field-apple-3"]


@pytest.mark.parametrize(("cohort", "train", "has_train", "expected"), [
    ("pp", "pp", True, cohorts.IN_SOURCE),
    ("plantdoc", "pp", True, cohorts.CROSS_SOURCE),
    (None, "pp", True, cohorts.UNDECLARED),
    ("pp", None, True, cohorts.UNDECLARED),
    ("pp", None, False, cohorts.NOT_ADAPTED),
])
def test_relation_follows_the_declared_sources(cohort, train, has_train, expected):
    assert cohorts.relation(cohort, train, has_train) == expected


def test_several_cohorts_are_recorded_in_order_with_their_sources_and_reopened(tmp_path):
    lab, orchard, other, photos = _folders(tmp_path, "lab", "field-apple", "plantdoc", "field-apple-train")
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(lab),
                          field=[f"pp={orchard}", f"plantdoc={other}"], field_train=f"pp={photos}")
    assert ctx.fields == [str(orchard), str(other)] and ctx.field == str(orchard)
    assert ctx.field_root == orchard
    assert [(c.name, c.source, c.primary) for c in ctx.field_cohorts] == [
        ("field-apple", "pp", True), ("plantdoc", "plantdoc", False)]
    assert ctx.field_train_source == "pp"
    recorded = yaml.safe_load((tmp_path / "run" / config.PARAMS_NAME).read_text())["params"]
    assert recorded["field"] == [str(orchard), str(other)]
    assert recorded["field_sources"] == {str(orchard): "pp", str(other): "plantdoc", str(photos): "pp"}
    again = config.open_run(tmp_path / "run", profile="smoke", data=str(lab))   # a chapter reopening it
    assert again.fingerprint == ctx.fingerprint and again.field_cohorts == ctx.field_cohorts
    with pytest.raises(config.RunFolderConflict):
        config.open_run(tmp_path / "run", profile="smoke", data=str(lab), field=str(orchard))


def test_one_undeclared_cohort_is_recorded_as_before(tmp_path):
    """A run folder made before several cohorts existed keeps its fingerprint: one string, no sources."""
    lab, orchard = _folders(tmp_path, "lab", "field-apple")
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(lab), field=[str(orchard)])
    recorded = yaml.safe_load((tmp_path / "run" / config.PARAMS_NAME).read_text())["params"]
    assert recorded["field"] == str(orchard) and "field_sources" not in recorded
    assert ctx.field_cohorts[0].source is None


def test_the_same_cohort_twice_and_an_empty_list_are_refused(tmp_path):
    lab, orchard = _folders(tmp_path, "lab", "field-apple")
    with pytest.raises(ValueError, match="given twice"):
        config.open_run(tmp_path / "a", profile="smoke", data=str(lab), field=[str(orchard), f"x={orchard}"])
    with pytest.raises(ValueError, match="empty list"):
        config.open_run(tmp_path / "b", profile="smoke", data=str(lab), field=[])


def test_the_command_line_takes_field_more_than_once():
    from cropcop_utils.__main__ import build_parser

    args = build_parser().parse_args(["book", "--field", "a=/x", "--field", "/y", "--field-train", "a=/z"])
    assert args.field == ["a=/x", "/y"] and args.field_train == "a=/z"
