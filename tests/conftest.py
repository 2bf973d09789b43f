"""Shared fixtures. The whole book runs once per session on the smoke profile, on the synthetic corpus
(``smoke_book``) and on a sample of the real apple corpus with a sample of its real orchard field cohort
(``apple_field_smoke_book``, rendered: the whole chain on real photographs); chapters 1-3 run on a
content-hash sample of the real tomato corpus (``tomato_smoke_book``: its inherited partition with real
copies across it)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOMATO = SHARED_DATA / "plantvillage-tomato"
APPLE, FIELD_APPLE = SHARED_DATA / "plantvillage-apple", SHARED_DATA / "field-apple"
FIELD_APPLE_TRAIN = SHARED_DATA / "field-apple-train"
ORCHARD_SOURCE = "plant-pathology-2021"

os.environ.setdefault("MPLBACKEND", "Agg")

BOOK_FIXTURES = ("smoke_book", "tomato_smoke_book", "apple_field_smoke_book")


# Session fixtures other than the books that take seconds to build: their users share a worker too.
SHARED_BUILDS = ("ptq_run",)


def _in_tests(func) -> bool:
    source = inspect.getsourcefile(func)
    return source is not None and Path(source).resolve().is_relative_to(Path(__file__).parent)


def _build_keys(item) -> list[str]:
    """The expensive fixtures ``item`` needs, as keys a worker builds once: the shared session builds,
    and every module-scoped fixture of the test tree (per module: pytest builds one per module)."""
    keys = [name for name in SHARED_BUILDS if name in item.fixturenames]
    for name in item.fixturenames:
        definitions = item._fixtureinfo.name2fixturedefs.get(name) or ()
        if definitions and definitions[-1].scope == "module" and _in_tests(definitions[-1].func):
            keys.append(f"{item.module.__name__}::{name}")
    return keys


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """``make test`` spreads the suite over the cores (pytest-xdist, ``--dist loadgroup``).  Each worker
    builds its own session and module fixtures, so every test that reads one smoke book is sent to one
    worker (each book runs once, and the books run side by side), and so are the tests that share another
    expensive fixture (joined transitively: a module whose fixtures all rest on ``ptq_run`` is one group).
    Without this, a module's tests spread over both workers and both build its fixtures (a 40 s .pte
    lowered twice)."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    pending = []
    for item in items:
        books = [name for name in BOOK_FIXTURES if name in item.fixturenames]
        if books:
            item.add_marker(pytest.mark.xdist_group("+".join(books)))
            continue
        keys = _build_keys(item)
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
        if keys:
            pending.append((item, keys[0]))
    for item, key in pending:
        item.add_marker(pytest.mark.xdist_group(root(key)))


@pytest.fixture
def fresh_squares(monkeypatch):
    """An empty process-wide store of decoded squares (``core.squares.SquareCache``) for one test."""
    from collections import OrderedDict

    from cropcop_utils.core import squares

    monkeypatch.setattr(squares.SquareCache, "_shared", OrderedDict())
    monkeypatch.setattr(squares.SquareCache, "_shared_bytes", 0)
    return squares.SquareCache


@pytest.fixture
def decodes(monkeypatch, fresh_squares):
    """How often each file was decoded (path → count) by ``imaging.load_array``, from an empty store."""
    from collections import Counter

    from cropcop_utils.core import imaging

    counts: Counter = Counter()
    load = imaging.load_array

    def counting(path, size):
        counts[str(path)] += 1
        return load(path, size)

    monkeypatch.setattr(imaging, "load_array", counting)
    return counts


@pytest.fixture(scope="session")
def tomato_root() -> Path:
    if not TOMATO.is_dir():
        pytest.skip(f"real PlantVillage tomato data not present at {TOMATO}")
    return TOMATO


SECOND_SOURCE = "generator-b"


def write_second_cohort(folder: Path, profile: str = "smoke") -> Path:
    """A second synthetic field cohort, drawn by the field generator from another seed (another "source"),
    for a book given ``--field`` twice."""
    from cropcop_utils.core.config import load_profile
    from cropcop_utils.synthetic.field import render_cohort

    synthetic = load_profile(profile)["synthetic"]
    files, _ = render_cohort(int(synthetic["seed"]) + 1, int(synthetic["image_px"]),
                             int(synthetic["field_per_class"]))
    for rel, blob in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(blob)
    return folder


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """The whole chain executed headless (papermill) on the synthetic corpus and rendered with -W, with two
    field cohorts: the generated one (primary) and a second one from another generator seed, declared as
    another source (``--field synthetic --field generator-b=PATH``)."""
    from cropcop_utils.book import run_book

    base = tmp_path_factory.mktemp("smoke_book")
    second = write_second_cohort(base / "field-b")
    lines: list[str] = []
    result = run_book(base / "run", profile="smoke", data="synthetic", html=True, log=lines.append,
                      field=["synthetic", f"{SECOND_SOURCE}={second}"])
    result["log"] = lines
    result["second_cohort"] = second
    return result


@pytest.fixture(scope="session")
def tomato_smoke_book(tmp_path_factory, tomato_root):
    """Chapters 1-3 on the real PlantVillage tomato corpus, read in place: the smoke_real profile's
    ``corpus.sample_fraction`` keeps ~5 % of it (byte-identical copies together, the inherited train/test
    folders as they are), executed headless.  What only this corpus has is its inherited partition with
    real copies across it, which these chapters judge and repair; the whole chain on real photographs, and
    its render, is the apple field book's (chapters 4-11 here cost ~200 s of a 2-core suite and proved
    nothing the apple book does not)."""
    from cropcop_utils.book import run_book

    base = tmp_path_factory.mktemp("tomato_smoke_book")
    lines: list[str] = []
    result = run_book(base / "run", profile="smoke_real", data=str(tomato_root), until="split", html=False,
                      log=lines.append)
    return {**result, "log": lines}


@pytest.fixture(scope="session")
def apple_field_roots() -> tuple[Path, Path]:
    """The real apple lab corpus, its real orchard field cohort and the labelled orchard photos for
    training (skips when any is absent)."""
    for path in (APPLE, FIELD_APPLE, FIELD_APPLE_TRAIN):
        if not path.is_dir():
            pytest.skip(f"real apple data not present at {path}")
    return APPLE, FIELD_APPLE, FIELD_APPLE_TRAIN


@pytest.fixture(scope="session")
def apple_field_smoke_book(tmp_path_factory, apple_field_roots):
    """The whole chain on the real PlantVillage apple corpus with ``--field`` the real orchard photos and
    ``--field-train`` the labelled orchard photos for training, all read in place: the smoke_field profile
    keeps a content-hash sample of each (``corpus.sample_fraction`` for the lab folder,
    ``corpus.field_train_sample_fraction`` for the field-train folder,
    ``field_transfer.sample_fraction`` for the cohort), trains the baseline and the field-adapted regime
    side by side, and so runs chapters 2-11 across real field photographs.  Executed headless and rendered
    with -W; a figure of an "earlier run" is planted under ``RUN_DIR/html`` first: the render must not keep
    it."""
    from cropcop_utils.book import run_book

    lab, orchard, orchard_train = apple_field_roots
    base = tmp_path_factory.mktemp("apple_field_smoke_book")
    stale = base / "run" / "html" / "_images" / "earlier_run_figure.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"a figure of an earlier run")
    lines: list[str] = []
    # both declared as Plant Pathology 2021 photographs: the cohort is in-source
    result = run_book(base / "run", profile="smoke_field", data=str(lab), field=f"{ORCHARD_SOURCE}={orchard}",
                      field_train=f"{ORCHARD_SOURCE}={orchard_train}", html=True, log=lines.append)
    return {**result, "log": lines, "field_root": orchard, "field_train_root": orchard_train,
            "stale_figure": stale}
