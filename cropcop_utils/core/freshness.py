"""Reruns that redo only what changed: which chapters of a finished run folder are still fresh.

A chapter is *fresh* when nothing it was computed from has changed since it last finished:

* its **code** — the chapter's notebook; every folder of the ``cropcop_utils`` package that its kernel
  (or a process the kernel started) imported a module from, noted as it happens by :func:`note_imports`
  in ``RUN_DIR/chain/<chapter>.code-read``, with ``core/`` and the package's top-level modules always
  (a folder is hashed whole: its entry points and templates too); and the Python / torch / timm /
  executorch versions.  A chapter with no such note (one finished before the runner kept them) counts
  the whole package but its profiles;
* the **parameters it read** — each top-level key of ``params.yaml``, or key of a section
  (``field_transfer.bootstrap``), the chapter's kernel touched, noted as it happens by
  :class:`ReadParams` (a record of reads, not a list kept by hand that could fall behind the code),
  compared by the SHA-256 of its value;
* the **folders and files those parameters name** (the corpus, field cohorts, field-train, out-of-scope
  folders; a file such as a reviewer's verdicts, ``audit.review_verdicts``), by a listing of every file's
  path, size and contents (not modification times: the same bytes copied again are the same input);
* its **files** — its chapter record and every artifact the record lists as read or written re-hash to
  the registry's SHA-256, and its executed notebook is in the book.

The runner (:mod:`cropcop_utils.book`) runs the chain from the first chapter that is not fresh; the ones
before it are verified and reused, not rewritten.  What each chapter was computed from is kept in
``RUN_DIR/chain.json``; the keys a kernel read, in ``RUN_DIR/chain/<chapter>.params-read``, and the
package folders it imported from, in ``RUN_DIR/chain/<chapter>.code-read``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.abc
import json
import os
import platform
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from .evidence import FingerprintMismatch, atomic_write_json, sha256_file, sha256_json, verify_artifact

CHAIN_STATE = "chain.json"
READS_DIR = "chain"
CHAPTER_ENV = "CROPCOP_CHAPTER"   # set by the runner for the kernel of the chapter it executes
RUN_DIR_ENV = "CROPCOP_RUN_DIR"   # ... with the run folder, where the kernel notes the code it imports
ALWAYS_IMPORTED = ("core",)       # the ground floor: every chapter stands on it (and on top-level modules)
_VERSIONED = ("torch", "torchvision", "timm", "executorch", "torchao", "numpy", "scikit-learn")


class ReadParams(dict):
    """The run's parameters, noting what a chapter reads into ``RUN_DIR/chain/<chapter>.params-read``.

    Only inside a book kernel (``CROPCOP_CHAPTER`` set): elsewhere nothing is written.  A section (a
    mapping under a top-level key, ``ctx.section("field_transfer")``) notes each of its keys it hands out
    (``field_transfer.bootstrap``), so a chapter that reads one value of a section another chapter owns
    is rerun only when that value changes; listing, copying or unpacking a mapping notes all of it.
    Lines are appended (``O_APPEND``), so worker processes that received the context by pickling add to
    the same file.  The mapping is read-only: a chapter that changed it would run on other parameters
    than the ones recorded (``dict(section)`` or ``copy.deepcopy`` give a plain copy to change).
    """

    def __init__(self, values: dict[str, Any], run_dir: str | os.PathLike | None = None, *,
                 prefix: str = "", sink: str | None = None, noted: set[str] | None = None) -> None:
        super().__init__(values)
        chapter = os.environ.get(CHAPTER_ENV)
        if sink is None and not prefix and run_dir is not None and chapter:
            sink = str(Path(run_dir) / READS_DIR / f"{chapter}.params-read")
        self._sink, self._prefix = sink, prefix
        self._noted = set() if noted is None else noted
        self._sections: dict[str, ReadParams] = {}

    def _note(self, *keys: str) -> None:
        self._write([f"{self._prefix}{k}" for k in keys])

    def _note_all(self) -> None:
        # a whole section is noted under its own key; the whole top level, key by key
        self._write([self._prefix[:-1]] if self._prefix else list(dict.keys(self)))

    def _write(self, keys: list[str]) -> None:
        if self._sink is not None:
            _append_new(Path(self._sink), keys, self._noted)

    def _value(self, key: str, value: Any) -> Any:
        if isinstance(value, dict) and not self._prefix:  # a section: its keys are noted one by one
            if key not in self._sections:
                self._sections[key] = ReadParams(value, prefix=f"{key}.", sink=self._sink, noted=self._noted)
            return self._sections[key]
        self._note(key)
        return value

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        return self._value(key, value)

    def get(self, key: str, default: Any = None) -> Any:
        if not super().__contains__(key):
            self._note(key)
            return default
        return self._value(key, super().__getitem__(key))

    def __contains__(self, key: object) -> bool:
        self._note(str(key))
        return super().__contains__(key)

    def __len__(self) -> int:
        self._note_all()
        return super().__len__()

    def __iter__(self) -> Iterator[str]:
        self._note_all()
        return super().__iter__()

    def keys(self):  # noqa: ANN201 - dict's own view types
        self._note_all()
        return super().keys()

    def items(self):  # noqa: ANN201
        self._note_all()
        return super().items()

    def values(self):  # noqa: ANN201
        self._note_all()
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._note_all()
        return copy.deepcopy(dict(super().items()))

    def __copy__(self) -> dict[str, Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict) -> dict[str, Any]:
        return self.copy()

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the run's parameters are read-only (they are what params.yaml records); change a "
                        "copy: dict(section) or copy.deepcopy(params)")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        # A pickled copy (a worker pool's) keeps noting into the same file.
        return (_rebuild, (dict(super().items()), self._sink, self._prefix))


def _rebuild(values: dict[str, Any], sink: str | None, prefix: str) -> ReadParams:
    return ReadParams(values, prefix=prefix, sink=sink)


def lookup(params: dict[str, Any], key: str) -> Any:
    """The value a noted key names: ``seed`` or ``field_transfer.bootstrap`` (``None`` when absent);
    read without noting anything."""
    value: Any = params
    for part in key.split(".", 1):
        value = dict.get(value, part) if isinstance(value, dict) else None
    return value


def _append_new(sink: Path, lines: list[str], noted: set[str]) -> None:
    """Append the lines not yet in ``noted`` to ``sink`` (``O_APPEND``: worker processes that note into
    the same file add to it)."""
    new = [line for line in lines if line not in noted]
    if not new:
        return
    noted.update(new)
    sink.parent.mkdir(parents=True, exist_ok=True)
    with open(sink, "a", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in new))


# --------------------------------------------------------------------------- what a chapter came from
def _noted(run_dir: str | os.PathLike, chapter: str, kind: str) -> list[str]:
    path = Path(run_dir) / READS_DIR / f"{chapter}.{kind}"
    return sorted({line for line in path.read_text().splitlines() if line}) if path.exists() else []


def keys_read(run_dir: str | os.PathLike, chapter: str) -> list[str]:
    return _noted(run_dir, chapter, "params-read")


def forget_reads(run_dir: str | os.PathLike, chapter: str) -> None:
    for kind in ("params-read", "code-read"):
        (Path(run_dir) / READS_DIR / f"{chapter}.{kind}").unlink(missing_ok=True)


# --------------------------------------------------------------------------- the code a chapter imports
class _ImportNotes(importlib.abc.MetaPathFinder):
    """Notes the package folder of every ``cropcop_utils`` module imported after it is installed; finds
    nothing itself (the import goes on to the next finder)."""

    def __init__(self, sink: Path, package: Path) -> None:
        self.sink, self.package, self.noted = sink, package, set()

    def note(self, module: str) -> None:
        parts = module.split(".")
        # a top-level module is not a folder: every chapter counts those anyway
        if parts[0] == self.package.name and len(parts) > 1 and (self.package / parts[1]).is_dir():
            _append_new(self.sink, [parts[1]], self.noted)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        self.note(fullname)
        return None


def note_imports(package: Path) -> None:
    """Inside a book kernel (``CROPCOP_CHAPTER`` and ``CROPCOP_RUN_DIR`` set, also in every process it
    starts: pools, latency interpreters, torchrun), note each package folder a module is imported from
    into ``RUN_DIR/chain/<chapter>.code-read``: what was imported before this call, and from then on as
    it happens.  A record of imports, like the parameters' record of reads: a list kept by hand would
    fall behind the code.  Elsewhere nothing is noted."""
    chapter, run_dir = os.environ.get(CHAPTER_ENV), os.environ.get(RUN_DIR_ENV)
    if not chapter or not run_dir or any(isinstance(f, _ImportNotes) for f in sys.meta_path):
        return
    notes = _ImportNotes(Path(run_dir) / READS_DIR / f"{chapter}.code-read", package)
    for module in list(sys.modules):
        notes.note(module)
    sys.meta_path.insert(0, notes)


def code_read(run_dir: str | os.PathLike, chapter: str) -> list[str] | None:
    """The package folders a chapter's kernel imported from (None: nothing was noted)."""
    return _noted(run_dir, chapter, "code-read") or None


def package_digests(package: Path) -> dict[str, str]:
    """SHA-256 per part of the package: each top-level module file (``book.py``) and each folder
    (``field``: every file under it).  Bytecode caches and the profiles are left out: a profile's values
    reach a chapter as the parameters it reads, compared one by one, so editing one value of a shipped
    profile reruns only what read it."""
    skipped = {"__pycache__", "profiles"}
    files: dict[str, list[Path]] = {}
    for path in sorted(p for p in package.rglob("*")
                       if p.is_file() and not skipped & set(p.relative_to(package).parts)):
        files.setdefault(path.relative_to(package).parts[0], []).append(path)
    digests = {}
    for part, paths in files.items():
        digest = hashlib.sha256()
        for path in paths:
            digest.update(f"{path.relative_to(package).as_posix()}\0{sha256_file(path)}\n".encode())
        digests[part] = digest.hexdigest()
    return digests


def code_parts(digests: dict[str, str], imported: Iterable[str] | None) -> dict[str, str]:
    """The parts of the package a chapter's code is: the top-level modules, ``core`` and the parts it
    imported from (every part when ``imported`` is None); a part that is gone counts as ``absent``."""
    if imported is None:
        return dict(sorted(digests.items()))
    wanted = {p for p in digests if p.endswith(".py")} | set(ALWAYS_IMPORTED) | set(imported)
    return {p: digests.get(p, "absent") for p in sorted(wanted)}


def code_fingerprint(parts: dict[str, str], notebook: Path) -> str:
    """SHA-256 over the chapter's parts of the package (:func:`code_parts`), its notebook and the
    library versions."""
    digest = hashlib.sha256()
    for part, sha in parts.items():
        digest.update(f"{part}\0{sha}\n".encode())
    digest.update(f"notebook\0{sha256_file(notebook)}\n".encode())
    digest.update(f"python\0{platform.python_version()}\n".encode())
    for name in _VERSIONED:
        try:
            digest.update(f"{name}\0{metadata.version(name)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}\0absent\n".encode())
    return digest.hexdigest()


def named_paths(value: Any, base: Path) -> list[Path]:
    """Every existing folder or file a parameter value names (a string with a path separator; relative
    ones from ``base``, where the kernels run)."""
    if isinstance(value, dict):
        return [f for v in value.values() for f in named_paths(v, base)]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in named_paths(v, base)]
    if isinstance(value, str) and "/" in value:
        path = Path(value) if os.path.isabs(value) else (base / value).resolve()
        return [path] if path.is_dir() or path.is_file() else []
    return []


_CONTENT_DIGESTS: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def path_listing(path: Path) -> str:
    """SHA-256 of every file's relative path, size and contents under ``path``, or of the one file it is.

    Contents, not modification times: a data folder copied or checked out again (new times, the same
    bytes) is the same input, so its chapters stay fresh; an edit of the same size is seen.  Reading is
    cheap next to a chapter (the 201 MB PlantVillage tomato folder hashes in about a second) and happens
    once per folder in a process while its files' sizes and times stay as they were (the runner checks
    every chapter from one process)."""
    if path.is_file():  # os.walk lists nothing for a file: its edit would go unseen
        files = [(path.name, path)]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            files += [(os.path.relpath(os.path.join(root, n), path), Path(root, n)) for n in sorted(names)]
    stats = tuple((rel, (st := file.stat()).st_size, st.st_mtime_ns) for rel, file in files)
    key = (str(path), stats)
    if key not in _CONTENT_DIGESTS:
        digest = hashlib.sha256()
        for (rel, file), (_, size, _) in zip(files, stats, strict=True):
            digest.update(f"{rel}\0{size}\0{sha256_file(file)}\n".encode())
        _CONTENT_DIGESTS[key] = digest.hexdigest()
    return _CONTENT_DIGESTS[key]


def chapter_basis(params: dict[str, Any], keys: list[str], code: str, base: Path,
                  parts: dict[str, str] | None = None) -> dict[str, Any]:
    """What a chapter was computed from: code (and, under ``code_parts``, the digest of each part of the
    package it counts), the value of each parameter it read, the folders and files they name (under
    ``folders``)."""
    folders = sorted({str(f) for k in keys for f in named_paths(lookup(params, k), base)})
    basis = {"code": code, "params": {k: sha256_json(lookup(params, k)) for k in keys},
             "folders": {f: path_listing(Path(f)) for f in folders}}
    return basis if parts is None else {**basis, "code_parts": parts}


# --------------------------------------------------------------------------- the chain's state
def read_state(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / CHAIN_STATE
    return json.loads(path.read_text())["chapters"] if path.exists() else {}


def write_state(run_dir: str | os.PathLike, chapters: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / CHAIN_STATE, {"chapters": chapters})


def record_sha256(run_dir: Path, record: str) -> str | None:
    """The chapter record's SHA-256 as it finished (None: the chapter wrote no record, so it never counts
    as fresh)."""
    path = Path(run_dir) / record
    return sha256_file(path) if path.exists() else None


def why_stale(run_dir: Path, record: str, notebook: Path, recorded: dict[str, Any] | None,
              params: dict[str, Any], code: str, base: Path,
              parts: dict[str, str] | None = None) -> str | None:
    """``None`` when the chapter is fresh; otherwise the first reason it must run, in words.  ``parts``:
    the digests of the package parts the recorded chapter counted, as they are now (names what moved)."""
    if recorded is None:
        return "it has not finished in this run folder"
    if not notebook.exists():
        return f"its executed notebook {notebook.name} is missing"
    if recorded["code"] != code:
        before = recorded.get("code_parts")
        moved = [] if before is None or parts is None else sorted(
            p for p in set(before) | set(parts) if before.get(p) != parts.get(p))
        if moved:
            return "the code it imports changed (" + ", ".join(
                p if p.endswith(".py") else f"{p}/" for p in moved) + ")"
        return "the code (package, notebook or library versions) changed"
    changed = sorted(k for k, sha in recorded["params"].items() if sha256_json(lookup(params, k)) != sha)
    if changed:
        return f"parameter{'s' if len(changed) > 1 else ''} {', '.join(changed)} changed"
    now = chapter_basis(params, list(recorded["params"]), code, base)["folders"]
    moved = sorted(f for f in set(now) | set(recorded["folders"]) if now.get(f) != recorded["folders"].get(f))
    if moved:
        return f"files in {', '.join(moved)} changed"
    if recorded["record_sha256"] is None:
        return f"it wrote no record {record}"
    try:
        if verify_artifact(run_dir, record) != recorded["record_sha256"]:
            return f"its record {record} was rewritten since"
        chapter_record = json.loads((run_dir / record).read_text())
        files = {**chapter_record.get("inputs", {}), **chapter_record.get("outputs", {})}
        for rel_path, sha in files.items():
            verify_artifact(run_dir, rel_path, sha)
    except FingerprintMismatch as error:
        return str(error).split(";")[0].split(". Refusing")[0]
    return None
