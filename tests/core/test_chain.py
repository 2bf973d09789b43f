"""The one definition of the chain: names, notebooks, records and headings."""

from pathlib import Path

from cropcop_utils.core.chain import CHAPTERS

REPO = Path(__file__).resolve().parents[2]


def test_names_notebooks_and_records_are_unique():
    for field in ("name", "notebook", "record"):
        values = [getattr(c, field) for c in CHAPTERS]
        assert len(set(values)) == len(values), field


def test_every_notebook_exists_and_is_numbered_in_chain_order():
    for number, spec in enumerate(CHAPTERS, start=1):
        assert (REPO / "notebooks" / f"{spec.notebook}.ipynb").is_file(), spec.notebook
        assert spec.notebook.startswith(f"{number:02d}_")
        assert spec.number == number and spec.heading == f"Chapter {number}: {spec.title}"


def test_records_are_json_files_inside_the_run_folder():
    for spec in CHAPTERS:
        assert spec.record.endswith(".json") and not spec.record.startswith("/")
        assert ".." not in Path(spec.record).parts
