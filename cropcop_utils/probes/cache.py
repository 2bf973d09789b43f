"""The feature cache: feature arrays kept in the run folder, reused only for the same split and settings.

Its own module: the chapter's one piece of state between runs, with its own keying and verification.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.evidence import (
    Chapter,
    FingerprintMismatch,
    atomic_write_bytes,
    sha256_json,
    verify_artifact,
)


# --------------------------------------------------------------------------- feature cache
class FeatureCache:
    """Feature arrays in ``probes/cache/<name>-<splitfp[:12]>.npz``, keyed by the split fingerprint.

    A file is reused only when its recorded split fingerprint, settings fingerprint and row ids all
    match and it still matches its registry hash; otherwise it is recomputed (the reason is logged in
    ``events``).  A split with another fingerprint never even looks at it (another file name).
    """

    def __init__(self, ch: Chapter, split_fingerprint: str) -> None:
        self.ch = ch
        self.split_fingerprint = split_fingerprint
        self.events: dict[str, dict[str, Any]] = {}

    def rel(self, name: str) -> str:
        return f"{self.ch.folder_name}/cache/{name}-{self.split_fingerprint[:12]}.npz"

    def load(self, name: str, settings: dict[str, Any], row_ids: np.ndarray) -> np.ndarray | None:
        rel = self.rel(name)
        path = self.ch.path(rel)
        if not path.exists():
            self.events[name] = {"path": rel, "status": "computed", "reason": "no cache file"}
            return None
        try:
            verify_artifact(self.ch.run_dir, rel)
            with np.load(path, allow_pickle=False) as data:
                checks = {
                    "split fingerprint": str(data["split_fingerprint"]) == self.split_fingerprint,
                    "settings": str(data["settings_fingerprint"]) == sha256_json(settings),
                    "row ids": np.array_equal(data["row_ids"].astype(str), row_ids.astype(str)),
                }
                values = data["values"]
        except (FingerprintMismatch, KeyError, ValueError, OSError) as error:
            self.events[name] = {"path": rel, "status": "computed", "reason": f"unreadable cache: {error}"}
            return None
        stale = [what for what, ok in checks.items() if not ok]
        if stale:
            self.events[name] = {"path": rel, "status": "computed", "reason": f"{', '.join(stale)} differ"}
            return None
        self.events[name] = {"path": rel, "status": "hit", "sha256": self.ch.record_output(rel)}
        return values

    def save(self, name: str, settings: dict[str, Any], row_ids: np.ndarray, values: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, values=values, row_ids=row_ids.astype(str),
                 split_fingerprint=np.array(self.split_fingerprint),
                 settings_fingerprint=np.array(sha256_json(settings)))
        atomic_write_bytes(self.ch.path(self.rel(name)), buffer.getvalue())
        event = self.events.setdefault(name, {"path": self.rel(name), "status": "computed"})
        event["sha256"] = self.ch.record_output(self.rel(name))

    def fetch(self, names: Sequence[str], settings: dict[str, Any], row_ids: np.ndarray,
              compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """All of ``names`` from the cache, or one ``compute()`` (which returns them all) and save."""
        found = {name: self.load(name, settings, row_ids) for name in names}
        if all(value is not None for value in found.values()):
            return found  # type: ignore[return-value]
        tick = time.perf_counter()
        computed = compute()
        seconds = round(time.perf_counter() - tick, 2)
        for name in names:
            self.save(name, settings, row_ids, computed[name])
            self.events[name]["seconds"] = seconds  # one pass computes them all
        return {name: computed[name] for name in names}
