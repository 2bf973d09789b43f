"""What makes a chapter fresh: the parameters its kernel read, its code, the folders it read, its files."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from cropcop_utils.core import config, freshness
from cropcop_utils.core.evidence import Chapter

PACKAGE = Path(freshness.__file__).resolve().parents[1]


def test_params_note_each_key_read_only_inside_a_book_kernel(tmp_path, monkeypatch):
    monkeypatch.delenv(freshness.CHAPTER_ENV, raising=False)
    quiet = freshness.ReadParams({"seed": 0, "image": {"size": 64}}, tmp_path)
    assert quiet["seed"] == 0 and freshness.keys_read(tmp_path, "corpus") == []

    monkeypatch.setenv(freshness.CHAPTER_ENV, "corpus")
    params = freshness.ReadParams({"seed": 0, "image": {"size": 64, "mean": [0.5]}, "training": {}}, tmp_path)
    params["seed"], params.get("absent"), "training" in params  # noqa: B018 - reading is what is tested
    assert freshness.keys_read(tmp_path, "corpus") == ["absent", "seed", "training"]
    section = params.get("image")          # a section notes the keys handed out, not itself
    assert isinstance(section, dict) and freshness.keys_read(tmp_path, "corpus") == ["absent", "seed",
                                                                                        "training"]
    assert section["size"] == 64 and params["image"] is section
    assert freshness.keys_read(tmp_path, "corpus") == ["absent", "image.size", "seed", "training"]
    {**section}   # noqa: B018 - unpacking a section reads all of it
    assert "image" in freshness.keys_read(tmp_path, "corpus")
    list(params.items())   # listing the whole mapping reads every key
    assert freshness.keys_read(tmp_path, "corpus") == ["absent", "image", "image.mean", "image.size", "seed",
                                                      "training"]
    assert freshness.lookup(params, "image.size") == 64 and freshness.lookup(params, "image.gone") is None


def test_params_are_read_only_and_copies_are_plain(tmp_path):
    import copy

    params = freshness.ReadParams({"training": {"epochs": 3}, "seed": 0}, tmp_path)
    with pytest.raises(TypeError, match="read-only"):
        params["seed"] = 1
    with pytest.raises(TypeError, match="read-only"):
        params["training"]["epochs"] = 1
    changed = copy.deepcopy(params)
    changed["training"]["epochs"] = 1
    assert type(changed) is dict and type(changed["training"]) is dict
    assert params["training"]["epochs"] == 3 and config.deep_merge(params, {"seed": 2})["seed"] == 2


def test_a_pickled_copy_keeps_noting_into_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setenv(freshness.CHAPTER_ENV, "audit")
    params = freshness.ReadParams({"audit": {"workers": 2}, "seed": 1}, tmp_path)
    params["seed"]  # noqa: B018
    copied = pickle.loads(pickle.dumps(params))
    copied["audit"]["workers"]  # noqa: B018
    section = pickle.loads(pickle.dumps(params["audit"]))
    section.get("batch")
    assert freshness.keys_read(tmp_path, "audit") == ["audit.batch", "audit.workers", "seed"]


def test_folder_listing_sees_a_file_added_or_rewritten(tmp_path):
    (tmp_path / "a").mkdir()
    photo = tmp_path / "a" / "1.jpg"
    photo.write_bytes(b"one")
    first = freshness.path_listing(tmp_path)
    assert freshness.path_listing(tmp_path) == first
    photo.write_bytes(b"two!")
    second = freshness.path_listing(tmp_path)
    (tmp_path / "a" / "2.jpg").write_bytes(b"x")
    assert len({first, second, freshness.path_listing(tmp_path)}) == 3


def test_a_folder_copied_again_with_new_times_is_the_same_input_and_a_same_size_edit_is_not(
        tmp_path, monkeypatch):
    # a fresh checkout of shared data gives every file a new modification time and the same bytes
    (tmp_path / "a").mkdir()
    photo = tmp_path / "a" / "1.jpg"
    photo.write_bytes(b"leaf")
    first = freshness.path_listing(tmp_path)
    os.utime(photo, ns=(10**18, 10**18))
    assert freshness.path_listing(tmp_path) == first
    photo.write_bytes(b"stem")  # the same size: only the bytes (and, as an edit does, the time) moved
    assert freshness.path_listing(tmp_path) != first
    os.utime(photo, ns=(10**18, 10**18))  # even at the old time, a new process reads the new bytes
    monkeypatch.setattr(freshness, "_CONTENT_DIGESTS", {})
    assert freshness.path_listing(tmp_path) != first


def test_named_paths_are_existing_folders_and_files_in_any_value(tmp_path):
    (tmp_path / "cohort").mkdir()
    (tmp_path / "review.csv").write_text("rel_path_a,rel_path_b,verdict\n")
    value = {"near": str(tmp_path / "cohort"), "kinds": ["a/b-missing", "synthetic"], "n": 3,
             "verdicts": str(tmp_path / "review.csv")}
    assert freshness.named_paths(value, tmp_path) == [tmp_path / "cohort", tmp_path / "review.csv"]
    assert freshness.named_paths("cohort/", tmp_path) == [(tmp_path / "cohort").resolve()]


def test_a_file_a_parameter_names_is_listed_so_its_edit_makes_the_chapter_stale(tmp_path):
    verdicts = tmp_path / "review.csv"
    verdicts.write_text("rel_path_a,rel_path_b,verdict\na.png,b.png,\n")
    first = freshness.path_listing(verdicts)
    assert first != freshness.path_listing(tmp_path / "missing-folder")  # a file is not listed as empty
    basis, code = _finished_chapter(tmp_path)
    params = {"seed": 0, "data": str(tmp_path / "lab"), "training": {"epochs": 3},
              "audit": {"review_verdicts": str(verdicts), "phash_radius": 12}}
    basis = {**freshness.chapter_basis(params, ["audit", "data", "seed"], code, tmp_path),
             "record_sha256": basis["record_sha256"]}
    assert str(verdicts) in basis["folders"] and _why(tmp_path, basis, params, code) is None
    verdicts.write_text("rel_path_a,rel_path_b,verdict\na.png,b.png,same\n")  # the reviewer's edit
    assert freshness.path_listing(verdicts) != first
    assert _why(tmp_path, basis, params, code) == f"files in {verdicts} changed"
    verdicts.unlink()
    assert _why(tmp_path, basis, params, code) == f"files in {verdicts} changed"


def _finished_chapter(run: Path, seed: int = 0) -> tuple[dict, str]:
    chapter = Chapter(run, "corpus")
    chapter.write_json("corpus/facts.json", {"seed": seed})
    chapter.finish({})
    (run / "book").mkdir(exist_ok=True)
    (run / "book" / "01_corpus.ipynb").write_text("{}")
    code = "code-sha"
    params = {"seed": seed, "data": str(run / "lab"), "training": {"epochs": 3}}
    (run / "lab").mkdir(exist_ok=True)
    basis = {**freshness.chapter_basis(params, ["data", "seed", "training.epochs"], code, run),
             "record_sha256": freshness.record_sha256(run, "corpus/corpus.json")}
    return basis, code


def _why(run: Path, basis: dict, params: dict, code: str) -> str | None:
    return freshness.why_stale(run, "corpus/corpus.json", run / "book" / "01_corpus.ipynb", basis, params,
                               code, run)


def test_a_finished_chapter_is_fresh_until_what_it_came_from_changes(tmp_path):
    basis, code = _finished_chapter(tmp_path)
    params = {"seed": 0, "data": str(tmp_path / "lab"), "training": {"epochs": 3, "lr": 0.1}}
    assert _why(tmp_path, basis, params, code) is None
    assert _why(tmp_path, basis, {**params, "training": {"epochs": 3, "lr": 0.2}}, code) is None  # unread
    assert _why(tmp_path, basis, {**params, "training": {"epochs": 4}}, code) == \
        "parameter training.epochs changed"
    assert _why(tmp_path, None, params, code) == "it has not finished in this run folder"
    assert _why(tmp_path, basis, {**params, "seed": 1}, code) == "parameter seed changed"
    assert "code" in _why(tmp_path, basis, params, "other-code")
    (tmp_path / "lab" / "new.jpg").write_bytes(b"photo")
    assert "files in" in _why(tmp_path, basis, params, code)
    (tmp_path / "lab" / "new.jpg").unlink()
    assert _why(tmp_path, basis, params, code) is None
    (tmp_path / "corpus" / "facts.json").write_text('{"seed": 9}')
    assert "corpus/facts.json changed" in _why(tmp_path, basis, params, code)


def test_a_chapter_whose_notebook_or_record_is_gone_is_not_fresh(tmp_path):
    basis, code = _finished_chapter(tmp_path)
    params = {"seed": 0, "data": str(tmp_path / "lab"), "training": {"epochs": 3}}
    (tmp_path / "book" / "01_corpus.ipynb").unlink()
    assert "notebook" in _why(tmp_path, basis, params, code)
    (tmp_path / "book" / "01_corpus.ipynb").write_text("{}")
    assert "wrote no record" in _why(tmp_path, {**basis, "record_sha256": None}, params, code)


def test_code_fingerprint_follows_the_notebook_and_the_package_but_not_the_profiles(tmp_path):
    import shutil

    package = tmp_path / "pkg"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    notebook = tmp_path / "01.ipynb"
    notebook.write_text("{}")

    def code(imported: list[str] | None = None) -> str:
        return freshness.code_fingerprint(freshness.code_parts(freshness.package_digests(package), imported),
                                          notebook)

    first = code()
    notebook.write_text('{"cells": []}')
    second = code()
    assert second != first
    (package / "profiles" / "default.yaml").write_text("seed: 1\n")   # values are compared as parameters
    assert code() == second
    (package / "core" / "metrics.py").write_text("# changed\n")
    assert code() != second


def test_a_chapter_counts_the_folders_it_imported_core_and_the_top_level_modules(tmp_path):
    import shutil

    package = tmp_path / "pkg"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    notebook = tmp_path / "01.ipynb"
    notebook.write_text("{}")

    def parts(imported: list[str] | None) -> dict[str, str]:
        return freshness.code_parts(freshness.package_digests(package), imported)

    counted = parts(["corpus"])
    assert {"core", "corpus", "__init__.py", "book.py"} <= set(counted) and "field" not in counted
    everything = {p.name for p in package.iterdir() if p.name not in ("__pycache__", "profiles")}
    assert set(parts(None)) == everything
    before = freshness.code_fingerprint(counted, notebook)
    (package / "field" / "transfer.py").write_text("# changed\n")     # a folder the chapter never imported
    assert freshness.code_fingerprint(parts(["corpus"]), notebook) == before
    (package / "corpus" / "figures.py").write_text("# changed\n")     # one it did
    assert freshness.code_fingerprint(parts(["corpus"]), notebook) != before
    (package / "card" / "templates" / "card.md.j2").write_text("changed")   # a folder counts whole
    shipped = freshness.code_parts(freshness.package_digests(PACKAGE), ["card"])
    assert parts(["card"])["card"] != shipped["card"]
    assert parts(["gone"])["gone"] == "absent"


def test_imports_are_noted_by_folder_only_inside_a_book_kernel(tmp_path, monkeypatch):
    import subprocess
    import sys

    probe = ("import cropcop_utils\n"
             "from cropcop_utils.corpus import taxonomy\n"
             "import cropcop_utils.book\n")

    def run(env: dict[str, str]) -> None:
        done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    monkeypatch.delenv(freshness.CHAPTER_ENV, raising=False)
    monkeypatch.delenv(freshness.RUN_DIR_ENV, raising=False)
    run({})
    assert freshness.code_read(tmp_path, "corpus") is None
    run({freshness.CHAPTER_ENV: "corpus", freshness.RUN_DIR_ENV: str(tmp_path)})
    noted = freshness.code_read(tmp_path, "corpus")
    assert noted is not None and {"core", "corpus"} <= set(noted) and "field" not in noted
    assert all((PACKAGE / folder).is_dir() for folder in noted)   # folders: top-level modules always count
    run({freshness.CHAPTER_ENV: "corpus", freshness.RUN_DIR_ENV: str(tmp_path)})   # a second process appends
    assert freshness.code_read(tmp_path, "corpus") == noted
    freshness.forget_reads(tmp_path, "corpus")
    assert freshness.code_read(tmp_path, "corpus") is None


def test_a_stale_chapter_names_the_part_of_the_package_that_moved(tmp_path):
    basis, _ = _finished_chapter(tmp_path)
    params = {"seed": 0, "data": str(tmp_path / "lab"), "training": {"epochs": 3}}
    then = {"__init__.py": "a", "core": "b", "corpus": "c"}
    keys = ["data", "seed", "training.epochs"]
    basis = {**basis, **freshness.chapter_basis(params, keys, "code-1", tmp_path, then)}
    assert basis["code_parts"] == then
    assert _why(tmp_path, basis, params, "code-1") is None
    now = {**then, "corpus": "c2"}
    assert freshness.why_stale(tmp_path, "corpus/corpus.json", tmp_path / "book" / "01_corpus.ipynb", basis,
                               params, "code-2", tmp_path, now) == "the code it imports changed (corpus/)"
    assert freshness.why_stale(tmp_path, "corpus/corpus.json", tmp_path / "book" / "01_corpus.ipynb", basis,
                               params, "code-2", tmp_path, then) == \
        "the code (package, notebook or library versions) changed"


def test_the_runner_may_change_profile_parameters_but_not_what_the_run_is_about(tmp_path):
    config.open_run(tmp_path / "run", profile="smoke")
    profile = tmp_path / "more.yaml"
    profile.write_text("extends: smoke\nseed: 7\n")
    with pytest.raises(config.RunFolderConflict):      # a chapter kernel still refuses
        config.open_run(tmp_path / "run", profile=str(profile))
    ctx = config.open_run(tmp_path / "run", profile=str(profile), accept_changed_parameters=True)
    assert dict(ctx.params)["seed"] == 7
    assert config.open_run(tmp_path / "run", profile=str(profile)).fingerprint == ctx.fingerprint
    other = tmp_path / "other-lab"
    other.mkdir()
    with pytest.raises(config.RunFolderConflict, match="data"):
        config.open_run(tmp_path / "run", profile=str(profile), data=str(other),
                        accept_changed_parameters=True)
    assert config.changed_parameters({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 0}) == ["b", "d"]


def test_state_round_trips(tmp_path):
    freshness.write_state(tmp_path, {"corpus": {"code": "x"}})
    assert freshness.read_state(tmp_path) == {"corpus": {"code": "x"}}
    assert json.loads((tmp_path / freshness.CHAIN_STATE).read_text())["chapters"]["corpus"]["code"] == "x"
    assert os.environ.get(freshness.CHAPTER_ENV) is None
