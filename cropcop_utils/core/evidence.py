"""Run-folder evidence: atomic writes, SHA-256 fingerprints, chapter records and the identity registry.

Every artifact a chapter writes is registered in ``registry.json`` (path relative to the run folder,
bytes, SHA-256, chapter).  A later chapter reads an artifact only through :class:`Chapter`, which
re-hashes the file and refuses to continue when it no longer matches what was registered.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REGISTRY_NAME = "registry.json"
_CHUNK = 1 << 20


class FingerprintMismatch(RuntimeError):
    """An input artifact is missing or differs from the fingerprint recorded when it was written."""


class NonFiniteValue(ValueError):
    """A JSON record holds NaN or ±inf; an undefined statistic must be ``null`` with a reason instead."""


# --------------------------------------------------------------------------- hashing
def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal content always hashes equally."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj).encode())


def row_id(rel_path: str) -> str:
    """Stable row identity of an image: a hash of its corpus-relative POSIX path."""
    return sha256_bytes(rel_path.encode("utf-8"))[:16]


# --------------------------------------------------------------------------- atomic writes
def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write to a temp file in the same folder, fsync, then ``os.replace`` (as timm's saver does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def non_finite_paths(obj: Any, prefix: str = "") -> Iterator[str]:
    """Key paths (``figures.support_bins[2].macro_f1_pte``) of every NaN / ±inf inside ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from non_finite_paths(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from non_finite_paths(value, f"{prefix}[{index}]")
    elif isinstance(obj, (float, np.floating)):
        if not math.isfinite(float(obj)):
            yield prefix or "(top level)"
    elif hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy arrays, pandas series
        yield from non_finite_paths(obj.tolist(), prefix)


def check_finite(obj: Any, where: str) -> None:
    """Raise :class:`NonFiniteValue` naming the key path of every non-finite number in ``obj``."""
    bad = list(non_finite_paths(obj))
    if bad:
        shown = ", ".join(bad[:10]) + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else "")
        raise NonFiniteValue(
            f"{where}: {len(bad)} non-finite value(s) (NaN or inf) at {shown}. JSON has no NaN: report an "
            "undefined statistic as null with a reason.")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Indented JSON, atomically; refuses NaN / inf with the key path of each (:class:`NonFiniteValue`)."""
    check_finite(obj, f"refusing to write {path}")
    text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def atomic_write_parquet(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return atomic_write_bytes(path, buffer.getvalue())


def atomic_save_figure(figure: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    buffer = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".") or "png"
    figure.savefig(buffer, format=fmt, bbox_inches="tight", **kwargs)
    return atomic_write_bytes(path, buffer.getvalue())


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays and paths appear in figures; JSON needs plain Python values.
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# --------------------------------------------------------------------------- registry
def read_registry(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    path = Path(run_dir) / REGISTRY_NAME
    if not path.exists():
        return {}
    return json.loads(path.read_text())["artifacts"]


def register(run_dir: str | os.PathLike, rel_path: str, chapter: str) -> dict[str, Any]:
    """Hash ``run_dir/rel_path`` and record it as written by ``chapter``."""
    run_dir = Path(run_dir)
    target = run_dir / rel_path
    entry = {
        "bytes": target.stat().st_size,
        "sha256": sha256_file(target),
        "chapter": chapter,
        "written_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    artifacts = read_registry(run_dir)
    artifacts[rel_path] = entry
    # One artifact a line.  The registry is rewritten at every registration (~1,200 in a field book), and
    # json's indenting encoder is pure Python: 19 ms a rewrite at 1,200 entries, against ~8 ms for lines
    # each encoded by the C encoder (its values are byte counts and strings: nothing non-finite to check).
    lines = ",\n".join(f"  {json.dumps(path)}: {json.dumps(artifacts[path])}" for path in sorted(artifacts))
    atomic_write_text(run_dir / REGISTRY_NAME, '{"artifacts": {\n' + lines + "\n}}\n")
    return entry


def verify_artifact(run_dir: str | os.PathLike, rel_path: str, expected_sha256: str | None = None) -> str:
    """Re-hash an artifact and compare it with the registry (or ``expected_sha256``).

    Returns the SHA-256.  Raises :class:`FingerprintMismatch` naming the file, who wrote it and what
    to rerun, when the file is missing, unregistered or changed.
    """
    run_dir = Path(run_dir)
    target = run_dir / rel_path
    entry = read_registry(run_dir).get(rel_path)
    if expected_sha256 is None:
        if entry is None:
            raise FingerprintMismatch(
                f"{rel_path} is not in {run_dir / REGISTRY_NAME}: no earlier chapter wrote it "
                "in this run folder; run the chain from the chapter that produces it."
            )
        expected_sha256 = entry["sha256"]
    writer = entry["chapter"] if entry else "an earlier chapter"
    if not target.exists():
        raise FingerprintMismatch(f"{rel_path} is missing from {run_dir}; rerun chapter '{writer}'.")
    found = sha256_file(target)
    if found != expected_sha256:
        raise FingerprintMismatch(
            f"{rel_path} changed since chapter '{writer}' froze it: recorded SHA-256 "
            f"{expected_sha256[:16]}…, found {found[:16]}…. Refusing to run on unverified input; "
            f"rerun chapter '{writer}' and the chapters after it."
        )
    return found


def verify_registry(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Re-hash every registered artifact; a table with one row per artifact and a ``matches`` column."""
    rows = []
    for rel_path, entry in read_registry(run_dir).items():
        target = Path(run_dir) / rel_path
        found = sha256_file(target) if target.exists() else None
        rows.append({"path": rel_path, "chapter": entry["chapter"], "bytes": entry["bytes"],
                     "sha256": entry["sha256"], "found_sha256": found,
                     "matches": found == entry["sha256"]})
    return pd.DataFrame(rows, columns=["path", "chapter", "bytes", "sha256", "found_sha256", "matches"])


def native_output_note(record: dict[str, Any], run_dir: str | os.PathLike | None = None) -> str:
    """The one line a chapter shows in place of captured native output: where it is and how long.  An
    empty log (still registered) gets no sentence: "0 lines ... not shown here" tells a reader nothing.
    Given ``run_dir``, the logs of the other regimes' records that ``record["regimes"]`` points to are
    named too (chapters 6 and 7 write one record per regime; the shipped one links the others)."""
    logs = dict(record.get("native_output", {}))
    if run_dir is not None:
        for entry in (record.get("regimes") or {}).values():
            if "record" in entry:
                logs |= json.loads((Path(run_dir) / entry["record"]).read_text()).get("native_output", {})
    return " ".join(f"Native library output ({entry['lines']:,} line{'' if entry['lines'] == 1 else 's'} of "
                    "C/C++ and library logging) is in "
                    f"`{path}` in the run folder, registered with its SHA-256; it is not shown here."
                    for path, entry in logs.items() if entry["lines"])


# --------------------------------------------------------------------------- chapter record
@contextmanager
def _python_streams_to(fd: int) -> Iterator[None]:
    """Point Python's ``sys.stdout`` / ``sys.stderr`` and the console handlers of loggers at ``fd``.

    In a Jupyter kernel these are not descriptors 1 and 2: ExecuTorch's bindings hand its C++ log
    lines to ``sys.stderr.write`` piece by piece, and torch logs import-time notices through a handler
    that holds the kernel's stderr object, so the descriptor capture alone would miss both.
    """
    consoles = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    handlers = [h for logger in loggers for h in logger.handlers
                if type(h) is logging.StreamHandler and h.stream in consoles]
    with os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace") as stream:
        previous = [h.setStream(stream) for h in handlers]
        try:
            with redirect_stdout(stream), redirect_stderr(stream):
                yield
        finally:
            for handler, old in zip(handlers, previous, strict=True):
                handler.setStream(old)


@contextmanager
def capture_native_output(sink: list[bytes]) -> Iterator[None]:
    """Catch what native code and libraries write to stdout / stderr inside the block; the bytes are
    appended to ``sink`` on leaving it, whatever happened inside.

    C/C++ libraries (ExecuTorch's cpuinfo lines, XNNPACK) write to file descriptors 1 and 2, which a
    Jupyter kernel forwards into the book.  ``wurlitzer`` points both descriptors at a scratch file for
    the block, and Python's own streams and console log handlers follow (ExecuTorch's bindings route
    their C++ log through ``sys.stderr``).
    """
    from wurlitzer import STDOUT, pipes

    for stream in (sys.stdout, sys.stderr):  # Python's buffered text stays where it was headed
        stream.flush()
    with tempfile.TemporaryFile() as capture:
        try:
            with pipes(stdout=capture, stderr=STDOUT), _python_streams_to(capture.fileno()):
                yield
        finally:
            capture.seek(0)
            sink.append(capture.read())


class Chapter:
    """One chapter's view of the run folder: verified reads, registered atomic writes, one JSON record.

    ``inputs`` maps every artifact the chapter read to the SHA-256 it verified; ``outputs`` maps every
    artifact it wrote to its SHA-256.  :meth:`finish` writes ``<name>/<name>.json`` with both plus the
    chapter's figures.  ``folder`` defaults to ``name`` (the analysis chapters share ``analysis/``).
    """

    def __init__(self, run_dir: str | os.PathLike, name: str, folder: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.folder_name = folder or name
        self.folder = self.run_dir / self.folder_name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.inputs: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.native_logs: dict[str, bytes] = {}

    def path(self, rel_path: str) -> Path:
        return self.run_dir / rel_path

    # reads
    def verify(self, rel_path: str, expected_sha256: str | None = None) -> Path:
        self.inputs[rel_path] = verify_artifact(self.run_dir, rel_path, expected_sha256)
        return self.path(rel_path)

    def read_parquet(self, rel_path: str, expected_sha256: str | None = None) -> pd.DataFrame:
        return pd.read_parquet(self.verify(rel_path, expected_sha256))

    def read_json(self, rel_path: str, expected_sha256: str | None = None) -> Any:
        return json.loads(self.verify(rel_path, expected_sha256).read_text())

    # writes
    def record_output(self, rel_path: str) -> str:
        """Register a file the chapter wrote by other means (a checkpoint, a .pte, a figure)."""
        self.outputs[rel_path] = register(self.run_dir, rel_path, self.name)["sha256"]
        return self.outputs[rel_path]

    def write_parquet(self, rel_path: str, frame: pd.DataFrame) -> str:
        atomic_write_parquet(self.path(rel_path), frame)
        return self.record_output(rel_path)

    def write_json(self, rel_path: str, obj: Any) -> str:
        atomic_write_json(self.path(rel_path), obj)
        return self.record_output(rel_path)

    def save_figure(self, figure: Any, rel_path: str, **kwargs: Any) -> str:
        atomic_save_figure(figure, self.path(rel_path), **kwargs)
        return self.record_output(rel_path)

    @contextmanager
    def native_output(self, rel_path: str | None = None) -> Iterator[None]:
        """Capture what native code and libraries write to stdout / stderr inside the block
        (:func:`capture_native_output`) and append it to a log, by default ``<folder>/native.log``."""
        caught: list[bytes] = []
        try:
            with capture_native_output(caught):
                yield
        finally:
            self.add_native_output(rel_path, b"".join(caught))

    def add_native_output(self, rel_path: str | None, data: bytes) -> str:
        """Append ``data`` (native output caught here or in a worker process) to a log, written atomically
        and registered like every artifact; the record counts its lines."""
        rel_path = rel_path or f"{self.folder_name}/native.log"
        self.native_logs[rel_path] = self.native_logs.get(rel_path, b"") + data
        atomic_write_bytes(self.path(rel_path), self.native_logs[rel_path])
        return self.record_output(rel_path)

    def finish(self, figures: dict[str, Any], **extra: Any) -> dict[str, Any]:
        record = {"chapter": self.name, "inputs": dict(self.inputs), "outputs": dict(self.outputs),
                  "figures": figures, **extra}
        if self.native_logs:
            record["native_output"] = {path: {"lines": len(data.splitlines()), "bytes": len(data)}
                                       for path, data in self.native_logs.items()}
        record_path = f"{self.folder_name}/{self.name}.json"
        check_finite(record, f"chapter '{self.name}' record {record_path}")
        atomic_write_json(self.path(record_path), record)
        register(self.run_dir, record_path, self.name)
        return record
