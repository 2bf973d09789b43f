"""Chapters 8 and 9 and the error explorer as notebooks, executed headless on a fixture run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import build_run


# --------------------------------------------------------------------------- notebooks
def _execute(notebook: str, target: Path, parameters: dict) -> dict:
    import nbformat
    import papermill

    repo = Path(__file__).resolve().parents[2]
    papermill.execute_notebook(str(repo / "notebooks" / f"{notebook}.ipynb"), str(target),
                               parameters=parameters, kernel_name="python3", cwd=str(repo),
                               progress_bar=False, execution_timeout=600)
    return nbformat.read(target, as_version=4)


@pytest.mark.slow
def test_notebooks_execute_headless(tmp_path: Path) -> None:
    """Chapters 8 and 9 and the explorer run under papermill on a fixture run folder."""
    run = build_run(tmp_path)
    chapter = {"run_dir": str(run.run_dir), "profile": run.profile, "data": run.ctx.data}
    per_class = _execute("08_per_class", tmp_path / "08.ipynb", chapter)
    assert per_class.cells[0].source.startswith("# Chapter 8: Per-class analysis")
    assert (run.run_dir / "analysis/per_class.json").exists()
    fruit = _execute("09_fruit_slice", tmp_path / "09.ipynb", chapter)
    assert fruit.cells[0].source.startswith("# Chapter 9: Fruit-label slice")
    assert "Exploratory" in fruit.cells[0].source
    shown = _execute("explore_errors", tmp_path / "explore.ipynb", {"run_dir": str(run.run_dir)})
    first = next(c for c in shown.cells if c.cell_type == "code" and "first_class" in c.source)
    kinds = {key for output in first.outputs for key in output.get("data", {})}
    assert "image/png" in kinds and "text/markdown" in kinds  # the first class, rendered statically
