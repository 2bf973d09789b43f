"""The feature cache (probes.cache): read back, keyed by the split fingerprint, recomputed when tampered."""

from __future__ import annotations

import io

import numpy as np

from cropcop_utils.core import evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.probes.cache import FeatureCache


# --------------------------------------------------------------------------- the feature cache
class Counter:
    def __init__(self, value: np.ndarray):
        self.calls, self.value = 0, value

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"a": self.value, "b": self.value * 2}


def test_cache_is_read_back_and_keyed_by_the_split_fingerprint(tmp_path):
    ch = Chapter(tmp_path, "probes")
    ids = np.array(["r1", "r2", "r3"])
    compute = Counter(np.arange(6, dtype=np.float32).reshape(3, 2))
    first = FeatureCache(ch, "a" * 64).fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 1 and (tmp_path / "probes/cache" / f"a-{'a' * 12}.npz").exists()
    again = FeatureCache(ch, "a" * 64)
    second = again.fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 1 and {e["status"] for e in again.events.values()} == {"hit"}
    assert np.array_equal(first["b"], second["b"])
    other = FeatureCache(ch, "b" * 64)
    other.fetch(["a", "b"], {"size": 8}, ids, compute)
    assert compute.calls == 2 and other.events["a"]["reason"] == "no cache file"
    changed = FeatureCache(ch, "a" * 64)
    changed.fetch(["a", "b"], {"size": 16}, ids, compute)
    assert compute.calls == 3 and "settings" in changed.events["a"]["reason"]
    reordered = FeatureCache(ch, "a" * 64)
    reordered.fetch(["a", "b"], {"size": 16}, ids[::-1], compute)
    assert compute.calls == 4 and "row ids" in reordered.events["a"]["reason"]


def test_a_tampered_cache_file_is_recomputed(tmp_path):
    ch = Chapter(tmp_path, "probes")
    ids = np.array(["r1", "r2", "r3"])
    compute = Counter(np.ones((3, 2), dtype=np.float32))
    cache = FeatureCache(ch, "c" * 64)
    cache.fetch(["a", "b"], {}, ids, compute)
    path = tmp_path / cache.rel("a")
    buffer = io.BytesIO()
    np.savez(buffer, values=np.zeros((3, 2)), row_ids=ids, split_fingerprint=np.array("c" * 64),
             settings_fingerprint=np.array(evidence.sha256_json({})))
    path.write_bytes(buffer.getvalue())  # plausible content, but not what was registered
    again = FeatureCache(ch, "c" * 64)
    values = again.fetch(["a", "b"], {}, ids, compute)
    assert compute.calls == 2 and "unreadable" in again.events["a"]["reason"]
    assert np.array_equal(values["a"], np.ones((3, 2)))
