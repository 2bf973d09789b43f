import json
import subprocess
from pathlib import Path

import pytest
import yaml

from cropcop_utils import book
from cropcop_utils.__main__ import build_parser
from cropcop_utils.core import freshness

REPO = Path(__file__).resolve().parents[1]


def test_the_book_frame_is_config_stylesheet_and_front_page_only():
    # executed notebooks and generated pages go to the run folder, never into the checkout
    frame = sorted(p.relative_to(book.BOOK_FRAME).as_posix() for p in book.BOOK_FRAME.rglob("*")
                   if p.is_file())
    assert frame == ["_config.yml", "_static/cropcop.css", "intro.md"]


def test_every_chapter_has_a_clean_source_notebook_with_parameters():
    import nbformat

    for spec in book.CHAPTERS:
        notebook = nbformat.read(REPO / "notebooks" / f"{spec.notebook}.ipynb", as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert any("parameters" in c.metadata.get("tags", []) for c in code), spec.notebook
        assert all(not c.get("outputs") for c in code), f"{spec.notebook} is committed with outputs"


def test_until_selects_a_prefix_of_the_chain():
    assert [c.name for c in book.chapters_until("audit")] == ["corpus", "audit"]
    assert len(book.chapters_until(None)) == len(book.CHAPTERS)
    with pytest.raises(ValueError, match="not a chapter"):
        book.chapters_until("nonsense")


def test_cli_defaults():
    args = build_parser().parse_args(["book"])
    assert (args.data, args.profile, args.until, args.field) == ("synthetic", "default", None, None)
    args = build_parser().parse_args(["book", "--data", "lab", "--field", "orchard"])
    assert (args.data, args.field) == ("lab", ["orchard"])


def test_review_verdicts_reach_the_runner(monkeypatch):
    from cropcop_utils.__main__ import main

    assert build_parser().parse_args(["book"]).review_verdicts is None
    seen = {}
    monkeypatch.setattr(book, "run_book", lambda run_dir, **kwargs: seen.update(kwargs))
    assert main(["book", "--review-verdicts", "review.csv", "--no-html"]) == 0
    assert seen["review_verdicts"] == "review.csv"


def test_run_facts_name_the_field_cohort(tmp_path):
    from cropcop_utils.core import config

    ctx = config.open_run(tmp_path / "run", profile="smoke")
    assert "synthetic field cohort" in book.render_run_facts(ctx, [])


def _plant_corpus_chapter(tmp_path: Path, monkeypatch, body: str) -> Path:
    """A one-cell stand-in for chapter 1, so the runner's failure paths run in seconds."""
    import nbformat

    planted = tmp_path / "notebooks"
    planted.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell('run_dir = ""\nprofile = ""\ndata = ""')
    params.metadata["tags"] = ["parameters"]
    notebook.cells = [params, nbformat.v4.new_code_cell(body)]
    nbformat.write(notebook, planted / "01_corpus.ipynb")
    monkeypatch.setattr(book, "NOTEBOOKS_DIR", planted)
    return tmp_path / "run" / "book" / "01_corpus.ipynb"


def test_failing_chapter_stops_with_its_error_and_notebook_path(tmp_path, monkeypatch):
    executed = _plant_corpus_chapter(tmp_path, monkeypatch, "raise ValueError('planted failure')")
    with pytest.raises(book.ChapterFailed, match="planted failure") as failure:
        book.run_book(tmp_path / "run", profile="smoke", until="corpus", html=False, log=lambda _: None)
    assert str(executed) in str(failure.value)
    assert executed.exists()


def test_a_cell_over_the_profile_timeout_fails_its_chapter(tmp_path, monkeypatch):
    executed = _plant_corpus_chapter(tmp_path, monkeypatch, "import time\ntime.sleep(120)")
    profile = yaml.safe_load((REPO / "cropcop_utils/profiles/smoke.yaml").read_text())
    profile["book"]["cell_timeout_s"] = 3
    (tmp_path / "quick.yaml").write_text(yaml.safe_dump(profile))
    with pytest.raises(book.ChapterFailed, match="cell_timeout_s = 3") as failure:
        book.run_book(tmp_path / "run", profile=str(tmp_path / "quick.yaml"), until="corpus", html=False,
                      log=lambda _: None)
    assert "CellTimeoutError" in str(failure.value) and str(executed) in str(failure.value)


def test_a_profile_given_as_a_file_reaches_the_chapter_kernels(tmp_path, monkeypatch):
    # The kernels open the run with the profile they are given: a profile file's name alone is unknown there.
    _plant_corpus_chapter(tmp_path, monkeypatch, "from cropcop_utils.core import config\n"
                          "config.load_profile(profile)\nraise ValueError('kernel profile: ' + profile)")
    profile = tmp_path / "mine.yaml"
    profile.write_text("extends: smoke\nname: mine\n")
    with pytest.raises(book.ChapterFailed, match=f"kernel profile: {profile}"):
        book.run_book(tmp_path / "run", profile=str(profile), until="corpus", html=False, log=lambda _: None)


def test_a_render_holds_only_the_run_it_renders(tmp_path, monkeypatch):
    """Figures and pages an earlier render left (RUN_DIR/html, an interrupted _build) are gone before
    jupyter-book runs; what it builds becomes RUN_DIR/html and its _build is removed."""
    stale = [tmp_path / "html/_images/earlier_run_figure.png", tmp_path / "html/old.html",
             tmp_path / "_build/.doctrees/environment.pickle",
             tmp_path / "_build/jupyter_execute/08_per_class_0.png"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"earlier run")
    seen = {}

    def fake_build(command, **kwargs):
        seen["left"] = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                              if p.is_file())
        seen["output"] = command[command.index("--path-output") + 1]
        (tmp_path / "_build/html").mkdir(parents=True)
        (tmp_path / "_build/html/index.html").write_text("this render")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(book.subprocess, "run", fake_build)
    index = book.build_html(tmp_path, tmp_path / "toc.yml")
    assert seen["left"] == [] and seen["output"] == str(tmp_path)
    assert index == tmp_path / "html/index.html" and index.read_text() == "this render"
    assert not (tmp_path / "_build").exists()


def test_two_books_side_by_side_keep_their_own_pages(tmp_path, monkeypatch):
    _plant_corpus_chapter(tmp_path, monkeypatch, "print('chapter of', run_dir)")
    frame_before = sorted(p.name for p in book.BOOK_FRAME.rglob("*"))
    for name in ("one", "two"):
        result = book.run_book(tmp_path / name, profile="smoke", until="corpus", html=False,
                               log=lambda _: None)
        assert result["book_dir"] == (tmp_path / name / "book").resolve()
    for name in ("one", "two"):
        text = (tmp_path / name / "book" / "01_corpus.ipynb").read_text()
        assert f"chapter of {(tmp_path / name).resolve()}" in text
        assert yaml.safe_load((tmp_path / name / "book" / "_toc.yml").read_text())["chapters"][1:] == [
            {"file": "01_corpus"}]
    assert sorted(p.name for p in book.BOOK_FRAME.rglob("*")) == frame_before


@pytest.mark.slow
def test_smoke_book_runs_every_chapter_and_renders(smoke_book):
    assert smoke_book["chapters"] == [c.name for c in book.CHAPTERS]
    index = Path(smoke_book["index"])
    assert index.exists()
    html = index.parent
    assert index == Path(smoke_book["run_dir"]) / "html" / "index.html"
    assert any(line == f"front page: {index}" for line in smoke_book["log"])
    toc = yaml.safe_load((smoke_book["book_dir"] / "_toc.yml").read_text())
    assert [entry["file"] for entry in toc["chapters"]] == (
        ["summary"] + [c.notebook for c in book.CHAPTERS] + ["card"])
    for spec in book.CHAPTERS:
        assert (html / f"{spec.notebook}.html").exists(), spec.notebook
    # what each chapter cost (bench/book_bench.py reads it): every chapter and the HTML build, with CPU
    from cropcop_utils.core import timings

    spent = {s["step"]: s for s in timings.read_timings(smoke_book["run_dir"])}
    assert list(spent) == [c.name for c in book.CHAPTERS] + ["html"]
    assert all(s["finished"] and s["cpu_s"] > 0 for s in spent.values())
    assert spent["training"]["cpu_s"] > spent["corpus"]["cpu_s"]
    intro = (html / "intro.html").read_text()
    assert "smoke" in intro and "synthetic corpus" in intro
    assert any(f"[1/{len(book.CHAPTERS)}] corpus: done" in line for line in smoke_book["log"])
    # the model card is a page of its own, as chapter 11 left it: with the deployment recipe
    card = (html / "card.html").read_text()
    assert "Deployed state" in card and "The model cannot abstain" not in card
    run_card = (Path(smoke_book["run_dir"]) / "field" / "card.md").read_text()
    assert "Deployed state" in run_card
    from cropcop_utils.core.evidence import read_registry

    assert read_registry(smoke_book["run_dir"])["field/card.md"]["chapter"] == "abstention"


def test_executed_chapters_carry_no_progress_bars(smoke_book):
    import nbformat

    for spec in book.CHAPTERS:
        notebook = nbformat.read(smoke_book["book_dir"] / f"{spec.notebook}.ipynb", as_version=4)
        streams = [o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream"]
        assert not any("%|" in text for text in streams), f"{spec.notebook} shows a progress bar"
        assert not any("findfont" in text for text in streams), f"{spec.notebook} shows font-cache noise"
        # library notices and native logging go to the chapter's log, from its kernel and from every worker
        # process it starts (chapter 7's lowering workers once showed torchao's import notice here)
        noise = [o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs
                 if o.output_type == "stream" and o.get("name") == "stderr"]
        assert not noise, f"{spec.notebook} shows stderr: {noise[0][:200]}"


def test_matplotlib_font_lookups_stay_out_of_the_chapters(caplog):
    import logging

    import matplotlib.font_manager as font_manager

    import cropcop_utils  # noqa: F401  (the package quiets the font manager's fallback notices)

    with caplog.at_level(logging.WARNING):
        font_manager.findfont("A font family no machine has")
    assert "findfont" not in caplog.text


@pytest.mark.slow
def test_real_data_smoke_book_judges_and_repairs_a_sample_that_keeps_real_leakage(tomato_smoke_book):
    run = Path(tomato_smoke_book["run_dir"])
    assert tomato_smoke_book["chapters"] == [c.name for c in book.chapters_until("split")]
    corpus = json.loads((run / "corpus/corpus.json").read_text())["figures"]
    assert corpus["sample"]["fraction"] == 0.05 and corpus["not_sampled"] > 0
    assert corpus["files_seen"] == corpus["admitted"] + corpus["quarantined"] + corpus["not_sampled"]
    assert set(corpus["per_split"]) == {"train", "test"}  # the inherited partition, as found
    audit = json.loads((run / "audit/audit.json").read_text())["figures"]
    assert audit["crossings"]["exact_bytes"] >= 1  # real byte-identical copies across train/test
    assert audit["inherited_partition"]["rejected"]
    split = json.loads((run / "split/split.json").read_text())
    assert split["crossings"]["groups_across_splits"] == 0  # repaired by the frozen split


@pytest.mark.slow
def test_the_real_photo_book_runs_and_renders_every_chapter(apple_field_smoke_book):
    from cropcop_utils.analysis import per_class as analysis
    from cropcop_utils.core.summary import render_summary_markdown

    run = Path(apple_field_smoke_book["run_dir"])
    assert apple_field_smoke_book["chapters"] == [c.name for c in book.CHAPTERS]
    html = Path(apple_field_smoke_book["index"]).parent
    for spec in book.CHAPTERS:
        assert (html / f"{spec.notebook}.html").exists(), spec.notebook
    assert not apple_field_smoke_book["stale_figure"].exists()  # the render holds only this run
    bins = json.loads((run / "analysis/per_class.json").read_text())["figures"]["support_bins"]
    empty = [b for b in bins.values() if b["classes"] == 0]
    assert empty and all(b["note"] == analysis.EMPTY_BIN and b["delta"] is None for b in empty)

    summary = render_summary_markdown(run)
    assert "its record lacks" not in summary  # every chapter's headline sentence found its keys
    for folder, notebook in (("ptq", "06_ptq"), ("runtime", "07_runtime")):  # one record per regime
        page = (html / f"{notebook}.html").read_text()
        assert "cpuinfo_utils.cpp" not in page  # the native lines stay in their logs ...
        logs = {path: entry["lines"] for record in (run / folder).rglob(f"{folder}.json")
                for path, entry in json.loads(record.read_text()).get("native_output", {}).items()}
        assert any(logs.values()), folder
        # ... which the page names, every regime's (an empty log needs no word)
        for path in (path for path, lines in logs.items() if lines):
            assert path in page, path


_RECORDING_CHAPTER = """from cropcop_utils.core import config
from cropcop_utils.core.evidence import Chapter
ctx = config.open_run(run_dir, profile=profile, data=data)
chapter = Chapter(ctx.run_dir, "corpus")
chapter.write_json("corpus/seed.json", {"seed": ctx.params["seed"]})
chapter.finish({})
"""


def test_a_rerun_reuses_a_chapter_until_a_parameter_it_read_changes(tmp_path, monkeypatch):
    _plant_corpus_chapter(tmp_path, monkeypatch, _RECORDING_CHAPTER)
    run = tmp_path / "run"
    lines: list[str] = []

    def again(profile: str, **kwargs) -> dict:
        return book.run_book(run, profile=profile, until="corpus", html=False, log=lines.append, **kwargs)

    assert again("smoke")["ran"] == ["corpus"]
    assert freshness.keys_read(run, "corpus") == ["seed"]  # what the kernel read, noted as it read it
    second = again("smoke")
    assert (second["ran"], second["reused"]) == ([], ["corpus"])
    assert any("corpus: unchanged" in line for line in lines)
    unread = tmp_path / "epochs.yaml"      # a parameter the chapter never read
    unread.write_text("extends: smoke\ntraining: {epochs: 1}\n")
    assert again(str(unread))["reused"] == ["corpus"]
    seeded = tmp_path / "seed.yaml"
    seeded.write_text("extends: smoke\nseed: 5\n")
    assert again(str(seeded))["ran"] == ["corpus"]
    assert any("runs because parameter seed changed" in line for line in lines)
    assert json.loads((run / "corpus" / "seed.json").read_text()) == {"seed": 5}
    assert again(str(seeded), force=True)["ran"] == ["corpus"]
    (run / "corpus" / "seed.json").write_text('{"seed": 6}')    # a file changed after the chapter wrote it
    assert again(str(seeded))["ran"] == ["corpus"]
    assert json.loads((run / "corpus" / "seed.json").read_text()) == {"seed": 5}


@pytest.mark.slow
def test_a_finished_book_reruns_only_the_chapters_after_a_changed_parameter(smoke_book, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(smoke_book["run_dir"], run)
    same = book.run_book(run, profile="smoke", html=False, log=lambda _: None)
    assert same["ran"] == [] and same["reused"] == [c.name for c in book.CHAPTERS]
    changed = tmp_path / "field-bootstrap.yaml"     # one parameter only chapter 10 (and after) reads
    changed.write_text("extends: smoke\nfield_transfer: {bootstrap: 150}\n")
    lines: list[str] = []
    again = book.run_book(run, profile=str(changed), html=False, log=lines.append)
    assert again["ran"] == ["field", "abstention"] and again["reused"] == [c.name for c in book.CHAPTERS[:9]]
    assert any("field: runs because parameter" in line and "field_transfer.bootstrap" in line
               for line in lines)
    assert json.loads((run / "field" / "field.json").read_text())["params"]["bootstrap"] == 150
    facts = (run / "book" / "_run_facts.md").read_text()
    assert "Chapters reused from an earlier invocation" in facts and "Per-class analysis" in facts


def test_a_rerun_reuses_a_chapter_until_code_it_imports_changes(tmp_path, monkeypatch):
    import shutil

    _plant_corpus_chapter(tmp_path, monkeypatch, _RECORDING_CHAPTER)
    package = tmp_path / "package"   # the runner fingerprints a copy; the kernel imports the real package
    shutil.copytree(book.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(book, "PACKAGE_DIR", package)
    run = tmp_path / "run"
    lines: list[str] = []

    def again() -> dict:
        return book.run_book(run, profile="smoke", until="corpus", html=False, log=lines.append)

    assert again()["ran"] == ["corpus"]
    imported = freshness.code_read(run, "corpus")
    assert imported is not None and "core" in imported and "field" not in imported
    recorded = freshness.read_state(run)["corpus"]["code_parts"]
    assert "field" not in recorded and {"core", "book.py"} <= set(recorded)
    (package / "field" / "transfer.py").write_text("# a change the chapter never imported\n")
    assert again()["reused"] == ["corpus"]
    (package / "core" / "metrics.py").write_text("# a change to the ground floor\n")
    assert again()["ran"] == ["corpus"]
    assert any("corpus: runs because the code it imports changed (core/)" in line for line in lines)
