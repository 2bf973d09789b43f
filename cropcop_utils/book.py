"""The book runner: execute the chapter notebooks in order with papermill, then render with Jupyter Book.

Everything a run renders lives in its run folder, beside its evidence: the executed notebooks and the
generated pages in ``RUN_DIR/book/`` (the Jupyter Book source, started from a copy of the checkout's
``book/`` frame: ``_config.yml``, ``_static/``, the front page), the HTML in ``RUN_DIR/html/``.  Two books
run side by side in one checkout never touch each other's pages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .card.render import CARD
from .core import freshness, timings
from .core.chain import CHAPTERS, ChapterSpec
from .core.config import (
    PACKAGE_DIR,
    PARAMS_NAME,
    REPO_ROOT,
    SYNTHETIC,
    RunContext,
    changed_parameters,
    open_run,
)
from .core.evidence import atomic_write_text

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
BOOK_FRAME = REPO_ROOT / "book"   # _config.yml, _static/, intro.md: what every run's book starts from
BOOK_DIR = "book"    # RUN_DIR/book: the executed notebooks and generated pages (the Jupyter Book source)
HTML_DIR = "html"    # RUN_DIR/html: the rendered book
RUN_TOC_NAME = "_toc.yml"


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


def prepare_book_dir(run_dir: Path) -> Path:
    """``RUN_DIR/book``, started from a copy of the checkout's ``book/`` (config, stylesheet, front page)."""
    book_dir = Path(run_dir).resolve() / BOOK_DIR
    shutil.copytree(BOOK_FRAME, book_dir, dirs_exist_ok=True)
    return book_dir


def write_run_pages(ctx: RunContext, ran: list[ChapterSpec], book_dir: Path,
                    reused: list[ChapterSpec] | None = None) -> Path:
    """Write the generated pages (run facts for the intro, evidence summary) and this run's toc.  ``ran``
    is every chapter in the book, ``reused`` those of them an earlier invocation computed."""
    from .core.summary import render_summary_markdown

    atomic_write_text(book_dir / "_run_facts.md", render_run_facts(ctx, ran, reused or []))
    front = []
    summary = render_summary_markdown(ctx.run_dir)
    atomic_write_text(book_dir / "summary.md", summary)
    front.append("summary")
    back = []
    card_path = ctx.run_dir / CARD
    if any(c.name == "field" for c in ran) and card_path.exists():
        # The card as its own page, as the run left it (chapter 11 re-renders it with its recipe).
        atomic_write_text(book_dir / "card.md", card_path.read_text())
        back.append("card")
    toc = {
        "format": "jb-book",
        "root": "intro",
        "chapters": [{"file": f} for f in front] + [{"file": c.notebook} for c in ran]
                    + [{"file": f} for f in back],
    }
    toc_path = book_dir / RUN_TOC_NAME
    atomic_write_text(toc_path, yaml.safe_dump(toc, sort_keys=False))
    return toc_path


def render_run_facts(ctx: RunContext, ran: list[ChapterSpec], reused: list[ChapterSpec] | None = None) -> str:
    params = ctx.params
    corpus = ("the embedded synthetic corpus (generated from seed "
              f"{params['synthetic']['seed']} into the run folder)" if ctx.data == SYNTHETIC
              else f"the image-folder corpus at `{ctx.data}`")
    field = "; ".join(
        ("the synthetic field cohort (generated with the corpus)" if c.folder == SYNTHETIC
         else f"`{c.name}`, the field-photograph folder at `{c.folder}`")
        + (f" (source `{c.source}`)" if c.source else "") + (" — primary" if c.primary and len(ctx.fields) > 1
                                                             else "")
        for c in ctx.field_cohorts) or "none (chapter 10 has no field cohort)"
    adapted = (f"the labelled field photos at `{ctx.field_train}`"
               + (f" (source `{ctx.field_train_source}`)" if ctx.field_train_source else "")
               if ctx.field_train else "none (no model is adapted to field photos)")
    skipped = [c.title for c in CHAPTERS if c not in ran]
    lines = [
        "| | |", "|---|---|",
        f"| Corpus | {corpus} |",
        f"| Field cohort{'s' if len(ctx.fields) > 1 else ''} | {field} |",
        f"| Field-train | {adapted} |",
        f"| Profile | `{params['name']}`: {params.get('description', '')} |",
        f"| Model input size | {params['image']['size']} × {params['image']['size']} px |",
        f"| Run folder | `{ctx.run_dir}` |",
        f"| Parameters fingerprint | `{ctx.fingerprint}` (SHA-256 of the resolved `params.yaml`) |",
        f"| Chapters in this book | {', '.join(c.title for c in ran)} |",
    ]
    if reused:
        lines.append(f"| Chapters reused from an earlier invocation | {', '.join(c.title for c in reused)} "
                     "(same code, parameters read and input folders; files verified) |")
    if skipped:
        lines.append(f"| Chapters not executed in this run | {', '.join(skipped)} |")
    return "\n".join(lines) + "\n"


def clear_previous_render(run_dir: Path) -> None:
    """Remove the run's last render (HTML, and Sphinx's environment if a render was interrupted).

    Sphinx builds incrementally and never deletes: figures and pages of an earlier render (another
    chain prefix of the same run folder) would stay beside this one's.  Each render starts empty.
    """
    shutil.rmtree(Path(run_dir) / HTML_DIR, ignore_errors=True)
    shutil.rmtree(Path(run_dir) / "_build", ignore_errors=True)


def build_html(run_dir: Path, toc: Path) -> Path:
    """Render ``RUN_DIR/book`` with Jupyter Book 1.x into ``RUN_DIR/html``; warnings are errors (-W)."""
    run_dir = Path(run_dir)
    clear_previous_render(run_dir)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    # --path-output puts Sphinx's _build (html, doctrees, extracted outputs) in the run folder; only the
    # HTML is kept, as RUN_DIR/html.
    command = [str(jupyter_book), "build", str(run_dir / BOOK_DIR), "--toc", str(toc), "--path-output",
               str(run_dir), "-W", "--keep-going"]
    completed = subprocess.run(command, cwd=run_dir, capture_output=True, text=True)
    if completed.returncode != 0:
        problems = [line for line in completed.stdout.splitlines() if "WARNING" in line or "ERROR" in line]
        raise ChapterFailed("jupyter-book build failed (warnings are errors):\n" + "\n".join(problems[-20:])
                            + "\n" + completed.stderr[-2000:])
    (run_dir / "_build" / "html").rename(run_dir / HTML_DIR)
    shutil.rmtree(run_dir / "_build", ignore_errors=True)
    return run_dir / HTML_DIR / "index.html"


def run_book(run_dir: str | os.PathLike, profile: str = "default", data: str = SYNTHETIC,
             field: str | os.PathLike | list | None = None, until: str | None = None, html: bool = True,
             log: Any = print, field_train: str | os.PathLike | None = None,
             force: bool = False, review_verdicts: str | os.PathLike | None = None) -> dict[str, Any]:
    """Execute the chain (or its prefix up to ``until``) and render it.

    In a run folder that already holds a book, the chapters before the first one that is not fresh
    (:mod:`cropcop_utils.core.freshness`: same code, same parameters read, same input folders, its files
    verified) are reused as they are; that chapter and every one after it run.  A profile whose parameters
    differ from the recorded ones is accepted: the chapters that read a changed parameter, and those
    after them, run again.  ``force`` runs every chapter.  ``review_verdicts``: a reviewer's filled-in
    ``audit/review.csv`` for chapter 2 (``audit.review_verdicts``, kept by the run folder like field-train).

    Executed notebooks go to ``RUN_DIR/book/``, the HTML to ``RUN_DIR/html/`` (the runner prints the
    front page's path).
    """
    before = _recorded_params(run_dir)
    ctx = open_run(run_dir, profile=profile, data=data, field=field, field_train=field_train,
                   accept_changed_parameters=True, review_verdicts=review_verdicts)
    book_dir = prepare_book_dir(ctx.run_dir)
    chain = chapters_until(until)
    verdicts = freshness.lookup(ctx.params, "audit.review_verdicts")
    log(f"CropCop book: profile {ctx.profile}, data {ctx.data}, field {', '.join(ctx.fields) or None}"
        + (f", field-train {ctx.field_train}" if ctx.field_train else "")
        + (f", review verdicts {verdicts}" if verdicts else "") + f", run folder {ctx.run_dir}")
    changed = changed_parameters(before, ctx.params) if before is not None else []
    if changed:
        log(f"parameters changed since the last run in this folder: {', '.join(changed)}")
    ran: list[ChapterSpec] = []
    reused: list[ChapterSpec] = []
    spent: list[dict[str, Any]] = []   # wall and CPU seconds per chapter (RUN_DIR/timings.json)
    states = freshness.read_state(ctx.run_dir)
    started = time.perf_counter()
    stale_from: str | None = "forced (--force)" if force else None
    digests = freshness.package_digests(PACKAGE_DIR)   # the code as it is when this invocation starts
    try:
        for number, spec in enumerate(chain, start=1):
            notebook = NOTEBOOKS_DIR / f"{spec.notebook}.ipynb"
            recorded = states.get(spec.name)
            # the parts of the package the chapter counted when it last ran (all of it, if not noted)
            parts = freshness.code_parts(digests, (recorded or {}).get("code_parts"))
            if stale_from is None:
                stale_from = freshness.why_stale(
                    ctx.run_dir, spec.record, book_dir / f"{spec.notebook}.ipynb", recorded,
                    ctx.params, freshness.code_fingerprint(parts, notebook), REPO_ROOT, parts)
                if stale_from is None:
                    reused.append(spec)
                    log(f"[{number}/{len(chain)}] {spec.name}: unchanged (same code, parameters, input "
                        "folders; its files verified): reused, not rerun")
                    continue
                log(f"[{number}/{len(chain)}] {spec.name}: runs because {stale_from}; so do the chapters "
                    "after it")
            # forgotten first, so a chapter that fails leaves no claim that it is fresh
            states.pop(spec.name, None)
            freshness.write_state(ctx.run_dir, states)
            freshness.forget_reads(ctx.run_dir, spec.name)
            log(f"[{number}/{len(chain)}] {spec.name}: running {spec.notebook}.ipynb …")
            with timings.measured(spec.name, spent), _kernel_knows_its_chapter(spec.name, ctx.run_dir):
                execute_chapter(spec, ctx, book_dir, profile)
            ran.append(spec)
            keys = freshness.keys_read(ctx.run_dir, spec.name)
            parts = freshness.code_parts(digests, freshness.code_read(ctx.run_dir, spec.name))
            states[spec.name] = {**freshness.chapter_basis(ctx.params, keys,
                                                           freshness.code_fingerprint(parts, notebook),
                                                           REPO_ROOT, parts),
                                 "record_sha256": freshness.record_sha256(ctx.run_dir, spec.record)}
            freshness.write_state(ctx.run_dir, states)
            log(f"[{number}/{len(chain)}] {spec.name}: done in {spent[-1]['wall_s']:.1f} s "
                f"({spent[-1]['cpu_s']:.1f} CPU s)")
        toc = write_run_pages(ctx, chain, book_dir, reused)
        index = None
        if html:
            log("rendering the book with jupyter-book (-W) …")
            with timings.measured("html", spent):
                index = build_html(ctx.run_dir, toc)
            log(f"front page: {index}")
    finally:
        timings.write_timings(ctx.run_dir, spent)
    if not html:
        log(f"executed notebooks: {book_dir} (not rendered: --no-html)")
    total = time.perf_counter() - started
    log(f"total wall time {total:.1f} s")
    return {"run_dir": str(ctx.run_dir), "book_dir": book_dir, "chapters": [c.name for c in chain],
            "ran": [c.name for c in ran], "reused": [c.name for c in reused],
            "index": index, "wall_seconds": total}


def _recorded_params(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(run_dir) / PARAMS_NAME
    return yaml.safe_load(path.read_text())["params"] if path.exists() else None


@contextmanager
def _kernel_knows_its_chapter(name: str, run_dir: Path) -> Iterator[None]:
    """The chapter's kernel inherits ``CROPCOP_CHAPTER`` and ``CROPCOP_RUN_DIR``: its parameters note the
    keys it reads, and the package the folders it imports from."""
    settings = {freshness.CHAPTER_ENV: name, freshness.RUN_DIR_ENV: str(Path(run_dir).resolve())}
    previous = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
