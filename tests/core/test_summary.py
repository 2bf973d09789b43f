"""The evidence summary page: valid MyST, headline paragraph and sentences, units, Jupyter Book build."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_fixtures import analysed_run, build_run  # noqa: F401

from cropcop_utils.core import evidence, summary

REPO = Path(__file__).resolve().parents[2]


def _assert_valid_myst(text: str) -> None:
    """One top heading, no skipped levels, and docutils + MyST (the book's extensions) raise no warning."""
    from docutils.core import publish_doctree
    from myst_parser.parsers.docutils_ import Parser

    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert sum(h.startswith("# ") for h in headings) == 1 and headings[0].startswith("# ")
    levels = [len(h) - len(h.lstrip("#")) for h in headings]
    assert all(b - a <= 1 for a, b in zip(levels, levels[1:], strict=False))
    publish_doctree(text, parser=Parser(), settings_overrides={
        "halt_level": 2, "report_level": 2, "myst_enable_extensions": ["dollarmath", "colon_fence"]})


def test_summary_markdown_partial_run(tmp_path: Path) -> None:
    run = build_run(tmp_path, states=("reference", "compact"))
    text = summary.render_summary_markdown(run.run_dir)
    _assert_valid_myst(text)
    assert "Chapter 8: Per-class analysis" in text and "did not run" in text
    assert "Chapters that did not run in this run folder:" in text
    assert "Chapter 4: Probes" in text.split("Chapters that did not run")[1]
    assert "training/training.json" in text  # the fixture's training record ran


def test_summary_markdown_full_run(analysed_run) -> None:  # noqa: F811
    run, record, _ = analysed_run
    text = summary.render_summary_markdown(run.run_dir)
    _assert_valid_myst(text)
    assert "## Headline results" in text and "## Artifact identity" in text
    sha = evidence.read_registry(run.run_dir)["runtime/model.pte"]["sha256"]
    assert "<wbr>".join(sha[i:i + 16] for i in range(0, 64, 16)) in text  # wraps in a narrow cell
    assert "figures.<wbr>paired.<wbr>reference_to_pte.<wbr>macro_f1.<wbr>delta" in text
    delta = record["figures"]["paired"]["reference_to_pte"]["macro_f1"]["delta"]
    assert summary.format_value(delta, "figures.paired.reference_to_pte.macro_f1.delta") in text
    assert f"{100 * delta:+.2f} points" in text


def test_summary_opens_with_a_headline_paragraph(analysed_run) -> None:  # noqa: F811
    run, record, slice_record = analysed_run
    text = summary.render_summary_markdown(run.run_dir)
    paragraph = text.split("\n\n")[1]
    f = record["figures"]
    reference = f["states"]["reference"]["macro_f1"]
    change = f["paired"]["reference_to_pte"]["macro_f1"]
    assert f"float reference scored macro-F1 {100 * reference['value']:.1f} %" in paragraph
    assert f"(95 % interval {100 * reference['lo']:.1f} % to {100 * reference['hi']:.1f} %)" in paragraph
    assert f"paired change of {100 * change['delta']:+.1f} points" in paragraph
    recall = slice_record["figures"]["slice"]["paired"]["reference_to_pte"]["mean_recall"]["delta"]
    assert f"{100 * recall:+.1f} points" in paragraph
    # the fixture's upstream records are skeletons: each lacking key is named, not guessed around
    assert "(Chapter 3: Split: its record lacks 'trusted_pairs_across_splits'" in paragraph


def test_field_and_abstention_headlines_read_their_records() -> None:
    field = {"status": "measured", "figures": {"pte_field_accuracy": 0.195, "pte_lab_accuracy": 0.998,
                                               "pte_background_share": 0.626}}
    sentence = summary.HEADLINE_SENTENCES["field"](field)
    assert "19.5 % of the field photographs" in sentence and "99.8 % of the lab test" in sentence
    assert "explains 62.6 % of that gap" in sentence
    undefined = summary.HEADLINE_SENTENCES["field"]({**field, "figures": {**field["figures"],
                                                                           "pte_background_share": None}})
    assert "gap" not in undefined.split("same classes")[1]
    none = {"status": "no_field_cohort", "reason": "this run has no field cohort"}
    assert summary.HEADLINE_SENTENCES["field"](none) == "Field transfer was not measured: this run has " \
                                                         "no field cohort."
    deployment = {"temperature": 1.5, "target_risk": 0.02,
                  "lab_test": {"coverage": 0.8, "selective_risk": None},
                  "field": {"abstained_share": 0.6, "accuracy_accepted": 0.4},
                  "out_of_scope": {"rejection_rate": 0.9}}
    sentence = summary.HEADLINE_SENTENCES["abstention"]({"deployment": deployment})
    assert "T = 1.50" in sentence and "accepts 80.0 %" in sentence and "selective risk of n/a" in sentence
    assert "abstains on 60.0 % of the field" in sentence and "rejects 90.0 %" in sentence
    sentence = summary.HEADLINE_SENTENCES["abstention"]({"deployment": {**deployment, "field": None}})
    assert "field" not in sentence


def test_every_headline_sentence_belongs_to_a_chapter_of_the_chain() -> None:
    from cropcop_utils.core.chain import CHAPTERS

    assert set(summary.HEADLINE_SENTENCES) <= {c.name for c in CHAPTERS}


def test_a_record_without_a_headline_key_is_named_not_guessed(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    record_path = run.run_dir / "split/split.json"
    record = json.loads(record_path.read_text())
    del record["crossings"]
    evidence.atomic_write_json(record_path, record)
    evidence.register(run.run_dir, "split/split.json", "split")
    assert "its record lacks 'crossings'" in summary.headline_paragraph(run.run_dir)


def test_units_follow_the_chapters() -> None:
    assert summary.unit_of("figures.states.pte.macro_f1.value") == "percent"
    assert summary.unit_of("figures.paired.reference_to_pte.accuracy.lo") == "points"
    assert summary.unit_of("figures.test_macro_f1_delta_hi") == "points"
    assert summary.unit_of("figures.test_agreement_with_int8_graph") == "percent"
    assert summary.unit_of("figures.latency_p50_ratio") is None
    assert summary.format_value(0.25, "figures.size_reduction") == "25.00 %"
    assert summary.format_value(0.25, "figures.ratio") == "0.25"


@pytest.mark.slow
def test_summary_builds_with_jupyter_book(tmp_path: Path, analysed_run) -> None:  # noqa: F811
    """The page as the runner places it (book/summary.md) renders with Jupyter Book -W."""
    run, _, _ = analysed_run
    root = tmp_path / "book_root"
    (root / "book").mkdir(parents=True)
    shutil.copy(REPO / "book" / "_config.yml", root / "_config.yml")
    (root / "book" / "intro.md").write_text("# CropCop\n\nIntro.\n")
    (root / "book" / "summary.md").write_text(summary.render_summary_markdown(run.run_dir))
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/summary\n")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    done = subprocess.run([str(jupyter_book), "build", str(root), "-W", "--keep-going"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (root / "_build" / "html" / "book" / "summary.html").exists()
