"""The book runner: execute the chapter notebooks in order with papermill, then render with Jupyter Book."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .card import CARD
from .chain import CHAPTERS, ChapterSpec
from .config import SYNTHETIC, RunContext, open_run
from .evidence import atomic_write_text

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
RUN_TOC_NAME = "_toc.run.yml"


class ChapterFailed(RuntimeError):
    """A chapter notebook raised; the partly executed notebook is kept for reading."""


def chapters_until(until: str | None) -> list[ChapterSpec]:
    names = [c.name for c in CHAPTERS]
    if until is None:
        return list(CHAPTERS)
    if until not in names:
        raise ValueError(f"--until {until!r}: not a chapter; choose one of {', '.join(names)}")
    return list(CHAPTERS[: names.index(until) + 1])


def _kernel_profile(profile: str | None, ctx: RunContext) -> str:
    """A profile file is passed on as its absolute path (kernels run in the repository root); a profile
    name as its name."""
    if profile is not None and Path(str(profile)).suffix:
        return str(Path(profile).resolve())
    return ctx.profile


def execute_chapter(spec: ChapterSpec, ctx: RunContext, book_dir: Path, profile: str | None = None) -> Path:
    """Run one chapter notebook headless; returns the executed notebook's path.  ``profile`` is the
    profile as the caller named it (a path to a YAML file stays a path: the kernel must find it too)."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    source = NOTEBOOKS_DIR / f"{spec.notebook}.ipynb"
    target = book_dir / f"{spec.notebook}.ipynb"
    if not source.exists():
        raise ChapterFailed(f"chapter '{spec.name}': notebook {source} is missing")
    book_dir.mkdir(parents=True, exist_ok=True)
    parameters = {"run_dir": str(ctx.run_dir), "profile": _kernel_profile(profile, ctx), "data": ctx.data}
    # The runner prints one progress line per chapter; bars inside a kernel would only clutter the book.
    os.environ.setdefault("TQDM_DISABLE", "1")
    limits = ctx.params.get("book", {})
    try:
        papermill.execute_notebook(
            str(source), str(target), parameters=parameters, kernel_name="python3",
            cwd=str(REPO_ROOT), progress_bar=False, log_output=False,
            # A hung kernel must fail its chapter, not stall a headless run until CI gives up.
            execution_timeout=limits.get("cell_timeout_s"),
            start_timeout=int(limits.get("start_timeout_s") or 120),
        )
    except papermill.PapermillExecutionError as error:
        raise ChapterFailed(
            f"chapter '{spec.name}' failed: {error.ename}: {error.evalue}\n"
            f"  partly executed notebook: {target}"
        ) from None
    # nbclient raises a plain RuntimeError when the kernel does not answer within start_timeout_s.
    except (CellTimeoutError, DeadKernelError, RuntimeError) as error:
        raise ChapterFailed(
            f"chapter '{spec.name}' stopped: {type(error).__name__}: {error}\n"
            f"  (book.cell_timeout_s = {limits.get('cell_timeout_s')}, book.start_timeout_s = "
            f"{limits.get('start_timeout_s')}); partly executed notebook: {target}"
        ) from None
    fold_code_cells(target)
    return target


def fold_code_cells(path: Path) -> None:
    """Tag every code cell ``hide-input``: the book shows results, with the code one click away."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            tags = cell.metadata.setdefault("tags", [])
            if "hide-input" not in tags:
                tags.append("hide-input")
    atomic_write_text(path, nbformat.writes(notebook))


def prepare_book_root(book_root: Path) -> Path:
    """A book root other than the repository gets the repository's config and framing pages."""
    book_root = Path(book_root).resolve()
    (book_root / "book").mkdir(parents=True, exist_ok=True)
    if book_root != REPO_ROOT:
        shutil.copy2(REPO_ROOT / "_config.yml", book_root / "_config.yml")
        shutil.copy2(REPO_ROOT / "book" / "intro.md", book_root / "book" / "intro.md")
        shutil.copytree(REPO_ROOT / "_static", book_root / "_static", dirs_exist_ok=True)
    return book_root


def write_run_pages(ctx: RunContext, ran: list[ChapterSpec], book_root: Path) -> Path:
    """Write the generated pages (run facts for the intro, evidence summary) and this run's toc."""
    from . import registry

    book_dir = book_root / "book"
    atomic_write_text(book_dir / "_run_facts.md", render_run_facts(ctx, ran))
    front = []
    summary = registry.render_summary_markdown(ctx.run_dir)
    atomic_write_text(book_dir / "summary.md", summary)
    front.append("book/summary")
    back = []
    card_path = ctx.run_dir / CARD
    if any(c.name == "field" for c in ran) and card_path.exists():
        # The card as its own page, as the run left it (chapter 11 re-renders it with its recipe).
        atomic_write_text(book_dir / "card.md", card_path.read_text())
        back.append("book/card")
    toc = {
        "format": "jb-book",
        "root": "book/intro",
        "chapters": [{"file": f} for f in front] + [{"file": f"book/{c.notebook}"} for c in ran]
                    + [{"file": f} for f in back],
    }
    toc_path = book_dir / RUN_TOC_NAME
    atomic_write_text(toc_path, yaml.safe_dump(toc, sort_keys=False))
    return toc_path


def render_run_facts(ctx: RunContext, ran: list[ChapterSpec]) -> str:
    params = ctx.params
    corpus = ("the embedded synthetic corpus (generated from seed "
              f"{params['synthetic']['seed']} into the run folder)" if ctx.data == SYNTHETIC
              else f"the image-folder corpus at `{ctx.data}`")
    field = ("none (chapter 10 has no field cohort)" if ctx.field is None
             else "the synthetic field cohort (generated with the corpus)" if ctx.field == SYNTHETIC
             else f"the field-photograph folder at `{ctx.field}`")
    skipped = [c.title for c in CHAPTERS if c not in ran]
    lines = [
        "| | |", "|---|---|",
        f"| Corpus | {corpus} |",
        f"| Field cohort | {field} |",
        f"| Profile | `{params['name']}`: {params.get('description', '')} |",
        f"| Model input size | {params['image']['size']} × {params['image']['size']} px |",
        f"| Run folder | `{ctx.run_dir}` |",
        f"| Parameters fingerprint | `{ctx.fingerprint}` (SHA-256 of the resolved `params.yaml`) |",
        f"| Chapters executed | {', '.join(c.title for c in ran)} |",
    ]
    if skipped:
        lines.append(f"| Chapters not executed in this run | {', '.join(skipped)} |")
    return "\n".join(lines) + "\n"


def clear_previous_render(book_root: Path) -> None:
    """Remove the last render (HTML, Sphinx's environment, extracted notebook outputs).

    Sphinx builds incrementally and never deletes: figures and pages of an earlier run (another run
    folder, another chain) would stay under ``_build/html`` beside this run's.  Each render starts empty,
    so it holds only the run it renders.
    """
    build = Path(book_root) / "_build"
    for part in ("html", ".doctrees", "jupyter_execute"):
        shutil.rmtree(build / part, ignore_errors=True)


def build_html(book_root: Path, toc: Path) -> Path:
    """Render the book with Jupyter Book 1.x from an empty ``_build``; warnings are errors (-W)."""
    clear_previous_render(book_root)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book), "build", str(book_root), "--toc", str(toc), "-W", "--keep-going"]
    completed = subprocess.run(command, cwd=book_root, capture_output=True, text=True)
    if completed.returncode != 0:
        problems = [line for line in completed.stdout.splitlines() if "WARNING" in line or "ERROR" in line]
        raise ChapterFailed("jupyter-book build failed (warnings are errors):\n" + "\n".join(problems[-20:])
                            + "\n" + completed.stderr[-2000:])
    return book_root / "_build" / "html" / "index.html"


def run_book(run_dir: str | os.PathLike, profile: str = "default", data: str = SYNTHETIC,
             field: str | os.PathLike | None = None, until: str | None = None, html: bool = True,
             log: Any = print, book_root: str | os.PathLike = REPO_ROOT) -> dict[str, Any]:
    """Execute the chain (or its prefix up to ``until``) and render what ran.

    Executed notebooks go to ``<book_root>/book/``, the HTML to ``<book_root>/_build/html/``; the
    default book root is the repository (what ``make book`` renders); tests pass a temporary one.
    """
    ctx = open_run(run_dir, profile=profile, data=data, field=field)
    root = prepare_book_root(Path(book_root))
    chain = chapters_until(until)
    log(f"CropCop book: profile {ctx.profile}, data {ctx.data}, field {ctx.field}, run folder {ctx.run_dir}")
    ran: list[ChapterSpec] = []
    started = time.perf_counter()
    for number, spec in enumerate(chain, start=1):
        log(f"[{number}/{len(chain)}] {spec.name}: running {spec.notebook}.ipynb …")
        tick = time.perf_counter()
        execute_chapter(spec, ctx, root / "book", profile)
        ran.append(spec)
        log(f"[{number}/{len(chain)}] {spec.name}: done in {time.perf_counter() - tick:.1f} s")
    toc = write_run_pages(ctx, ran, root)
    index = None
    if html:
        log("rendering the book with jupyter-book (-W) …")
        index = build_html(root, toc)
        log(f"book: {index}")
    total = time.perf_counter() - started
    log(f"total wall time {total:.1f} s")
    return {"run_dir": str(ctx.run_dir), "chapters": [c.name for c in ran], "index": index,
            "wall_seconds": total}
