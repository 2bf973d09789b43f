"""The one door to the locked test split.

Every read of the test rows for a model goes through :func:`read_test_rows`, which appends one line to
``<run_dir>/test_access.jsonl`` naming the reader and the model state (the SHA-256 of the checkpoint,
converted graph or ``.pte`` that will be scored).  A model state may see the test split once: a second
read for the same state raises :class:`LockedTestError` unless the caller overrides with a reason, and
the override and its reason are written into the log, so the evidence shows every repeated look.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.evidence import Chapter, sha256_file

ACCESS_LOG = "test_access.jsonl"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class LockedTestError(PermissionError):
    """The locked test split was asked for again for a model state that has already seen it."""


def read_accesses(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Every logged access, in order (an empty frame when the test split was never read)."""
    path = Path(run_dir) / ACCESS_LOG
    columns = ["time", "reader", "model_state", "access", "override", "reason", "rows", "split_sha256"]
    if not path.exists():
        return pd.DataFrame(columns=columns)
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    frame = pd.DataFrame(entries, columns=columns)
    # pandas' string column turns a missing reason into NaN once another access gave one; JSON wants null
    frame["reason"] = frame["reason"].astype(object).where(frame["reason"].notna(), None)
    return frame


def accesses_for(run_dir: str | os.PathLike, model_state: str) -> list[dict[str, Any]]:
    frame = read_accesses(run_dir)
    return frame[frame["model_state"] == model_state].to_dict("records")


def _append(path: Path, entry: dict[str, Any]) -> None:
    # One line per write with O_APPEND, flushed and fsynced: concurrent readers see whole lines only.
    line = json.dumps(entry, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_test_rows(run_dir: str | os.PathLike, model_state_sha: str, reader: str, override: bool = False,
                   reason: str | None = None) -> pd.DataFrame:
    """The locked test rows (the frozen split's ``test`` rows) for one model state, logged.

    ``model_state_sha`` is the SHA-256 of the artifact to be scored; ``reader`` names who reads (e.g.
    ``"training/compact"``, ``"ptq"``).  The frozen split is verified (``split.load_frozen``) before any
    row is handed out.  A second access for the same state raises :class:`LockedTestError` unless
    ``override=True`` with a non-empty ``reason``; the override is logged with its reason.
    """
    from .frozen import load_frozen

    run_dir = Path(run_dir)
    if not isinstance(model_state_sha, str) or not _SHA256.match(model_state_sha):
        raise ValueError(f"model_state_sha must be a lower-case hex SHA-256 of the scored artifact, "
                         f"got {model_state_sha!r}")
    if not reader:
        raise ValueError("reader must name who reads the locked test split (e.g. 'training/compact')")
    if override and not (reason and reason.strip()):
        raise ValueError("an override of the locked test needs a reason; it is written into the evidence")
    earlier = accesses_for(run_dir, model_state_sha)
    if earlier and not override:
        first = earlier[0]
        raise LockedTestError(
            f"model state {model_state_sha[:16]}… already read the locked test split "
            f"({len(earlier)} time(s); first by {first['reader']!r} at {first['time']}). Each model state "
            "is scored on the test split once; reuse the predictions already written, or pass "
            "override=True with a reason (it is logged in test_access.jsonl).")
    frozen = load_frozen(Chapter(run_dir, "locked_test", folder="split"))
    rows = frozen.rows_for("test")
    _append(run_dir / ACCESS_LOG, {
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "reader": reader,
        "model_state": model_state_sha,
        "access": len(earlier) + 1,
        "override": bool(override),
        "reason": reason if override else None,
        "rows": len(rows),
        "split_sha256": sha256_file(run_dir / "split" / "split.parquet"),
    })
    return rows
