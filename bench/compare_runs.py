"""Two run folders of the same settings compared figure by figure: a refactor must not move a number.

    .venv/bin/python bench/compare_runs.py runs/before runs/after

Compares every chapter JSON value by value (wall-clock and throughput keys left out, absolute run-folder
paths normalised), every Parquet file frame by frame (prediction records included; timing columns left
out), and the SHA-256 of every artifact in ``registry.json``.  Each artifact whose bytes differ is
explained (a file that carries timestamps or wall-clock times: its content is compared without them)
or reported as UNEXPLAINED.  Exit status 0 when nothing is different or unexplained.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch

# keys and columns that hold measured time, speed or memory, and the sentences built from them
VOLATILE = re.compile(r"(cost_ratio|^reason$|wall|seconds|_s$|latency|_ms|time|date|elapsed|started|finished|"
                      r"duration|per_s|throughput|rss|memory|peak|cpu_s|speed|images_per)", re.I)
LOG_PREFIX = re.compile(r"^[WIE]\d{4} [\d:.]+ \d+ ")   # glog: level, date, time, process id
SKIPPED_DIRS = {"book", "html", "_build"}


def timing_bearing(rel: str) -> bool:
    """Files whose bytes carry wall-clock times or timestamps; each is compared by its content instead."""
    return rel.endswith((".json", "native.log", "history.parquet", "last.pt", "latency.parquet",
                         "latency.png", "identity.parquet"))


def value_differences(a: Any, b: Any, path: str, roots: tuple[str, str],
                      out: list[tuple[str, str]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            here = f"{path}.{key}" if path else str(key)
            if VOLATILE.search(str(key)):
                continue
            if path.split(".")[-1] in ("inputs", "outputs") and timing_bearing(str(key)):
                continue  # the SHA-256 of a timing-bearing file: the file itself is compared by content
            if key not in a or key not in b:
                out.append((here, "present on one side only"))
                continue
            value_differences(a[key], b[key], here, roots, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append((path, f"length {len(a)} vs {len(b)}"))
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            value_differences(x, y, f"{path}[{i}]", roots, out)
    elif isinstance(a, str) and isinstance(b, str):
        if a.replace(roots[0], "<run>") != b.replace(roots[1], "<run>"):
            out.append((path, f"{a[:80]!r} vs {b[:80]!r}"))
    elif a != b:
        out.append((path, f"{a!r} vs {b!r}"[:200]))


def files(root: Path, pattern: str) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(pattern)
                  if not set(p.relative_to(root).parts) & SKIPPED_DIRS)


def comparable_frame(path: Path, root: str) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    frame = frame.drop(columns=[c for c in frame.columns if VOLATILE.search(str(c))])
    for column in frame.columns:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(lambda v: v.replace(root, "<run>") if isinstance(v, str) else v)
    if "path" in frame.columns:  # the identity table: sizes and hashes of timing-bearing files vary
        bearing = frame["path"].map(timing_bearing)
        for column in ("bytes", "sha256", "found_bytes", "found_sha256"):
            if column in frame.columns:
                frame[column] = frame[column].astype(object).where(~bearing, None)
    return frame


def why_bytes_differ(a: Path, b: Path, rel: str) -> str | None:
    if rel.endswith(".json"):
        return "JSON: compared value by value"
    if rel.endswith("native.log"):
        strip = [[LOG_PREFIX.sub("", line) for line in p.read_text().splitlines()] for p in (a, b)]
        return "log: identical apart from timestamps and process ids" if strip[0] == strip[1] else None
    if rel.endswith("last.pt"):
        first, second = (torch.load(p, weights_only=False)["model"] for p in (a, b))
        same = first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
        return "checkpoint: identical weights (its history carries epoch times)" if same else None
    if rel.endswith(".parquet"):
        return "parquet: compared frame by frame without timing columns"
    if rel.endswith("card.md"):
        strip = [[line for line in p.read_text().splitlines() if not line.startswith("- rendered from:")]
                 for p in (a, b)]
        return "card: identical apart from the SHA-256 of the JSON it was rendered from" if (
            strip[0] == strip[1]) else None
    if rel.endswith("latency.png"):
        return "figure of measured latency"
    return None


def compare(a: Path, b: Path) -> int:
    roots = (str(a), str(b))
    problems = 0
    json_a, json_b = files(a, "*.json"), files(b, "*.json")
    print(f"chapter JSON files: {len(json_a)} vs {len(json_b)}; "
          f"on one side only: {sorted(set(json_a) ^ set(json_b))}")
    problems += len(set(json_a) ^ set(json_b))
    for rel in sorted(set(json_a) & set(json_b) - {"registry.json"}):
        out: list[tuple[str, str]] = []
        first, second = (json.loads((root / rel).read_text()) for root in (a, b))
        value_differences(first, second, "", roots, out)
        problems += len(out)
        for key, what in out[:12]:
            print(f"  {rel}: {key}: {what}")
    pq_a, pq_b = files(a, "*.parquet"), files(b, "*.parquet")
    common = sorted(set(pq_a) & set(pq_b))
    same = 0
    for rel in common:
        try:
            pd.testing.assert_frame_equal(comparable_frame(a / rel, roots[0]),
                                          comparable_frame(b / rel, roots[1]), check_exact=True)
            same += 1
        except AssertionError as error:
            problems += 1
            print(f"  {rel}: {str(error).splitlines()[0]}")
    print(f"parquet files: {len(pq_a)} vs {len(pq_b)}; frames identical {same}/{len(common)}")
    problems += len(set(pq_a) ^ set(pq_b))
    reg_a = json.loads((a / "registry.json").read_text())["artifacts"]
    reg_b = json.loads((b / "registry.json").read_text())["artifacts"]
    differ = sorted(k for k in reg_a if k in reg_b and reg_a[k]["sha256"] != reg_b[k]["sha256"])
    print(f"registered artifacts: {len(reg_a)} vs {len(reg_b)}; byte-identical {len(reg_a) - len(differ)}")
    problems += len(set(reg_a) ^ set(reg_b))
    for rel in differ:
        why = why_bytes_differ(a / rel, b / rel, rel)
        problems += why is None
        print(f"  bytes differ: {rel} -> {why or 'UNEXPLAINED'}")
    print(f"differences not explained by timings: {problems}")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(1 if compare(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()) else 0)
