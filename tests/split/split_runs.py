"""Runs for the split tests: a planted corpus with its corpus/ and audit/ artifacts, written like the real
chapters, and fresh copies of a frozen run.

Imported as ``split.split_runs`` (``tests/`` is on the path); the frozen run itself is the ``frozen``
fixture in ``conftest.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter

TARGET = {"train": 0.70, "val": 0.15, "test": 0.15}


# --------------------------------------------------------------------------- fixtures
def planted_corpus(seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Admitted rows with planted leakage groups: singletons, pairs, some large groups, one
    label-conflict group, a two-image class (cannot reach three splits) and one unreadable file."""
    rng = np.random.default_rng(seed)
    sizes = {"Tomato___healthy": 420, "Tomato___Late_blight": 300, "Tomato___Early_blight": 180,
             "Tomato___Leaf_Mold": 90, "Tomato___Target_Spot": 40, "Tomato___mosaic_virus": 14,
             "Tomato___rare_pest": 8}
    rows, group = [], 0
    for name, n in sizes.items():
        left = n
        large = [40, 25] if n >= 300 else ([12] if n >= 90 else [])
        for size in large + [int(s) for s in rng.geometric(0.55, size=n)]:
            size = min(size, left)
            if size <= 0:
                break
            for k in range(size):
                rows.append((f"train/{name}/{name}_{group}_{k}.jpg", name, group))
            group, left = group + 1, left - size
    # A label-conflict group: the same leaf filed under two classes (majority Late_blight).
    rows += [(f"test/Tomato___Late_blight/dup_{k}.jpg", "Tomato___Late_blight", group) for k in range(5)]
    rows += [(f"test/Tomato___Early_blight/dup_{k}.jpg", "Tomato___Early_blight", group) for k in range(2)]
    group += 1
    rows += [(f"train/Tomato___one_leaf/{k}.jpg", "Tomato___one_leaf", group + k) for k in range(2)]
    frame = pd.DataFrame(rows, columns=["rel_path", "class_name", "group_id"])
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    return frame[["row_id", "rel_path", "class_name", "group_id"]], pd.DataFrame(
        [{"row_id": evidence.row_id("train/Tomato___healthy/broken.jpg"),
          "rel_path": "train/Tomato___healthy/broken.jpg", "class_name": "Tomato___healthy"}])


def write_upstream(run_dir: Path, admitted: pd.DataFrame, rejected: pd.DataFrame,
                   audit_record: dict | None = None, shuffle: int | None = None) -> None:
    """Write corpus/ and audit/ artifacts in the contract's schemas, registered like the real chapters."""
    seen = pd.concat([admitted.assign(admitted=True, quarantine_reason=None),
                      rejected.assign(admitted=False, quarantine_reason="truncated")], ignore_index=True)
    manifest = pd.DataFrame({
        "row_id": seen["row_id"], "rel_path": seen["rel_path"], "class_name": seen["class_name"],
        "inherited_split": seen["rel_path"].str.split("/").str[0], "bytes": 1000, "sha256": "0" * 64,
        "format": "JPEG", "width": 64, "height": 64, "mode": "RGB", "exif_orientation": 1,
        "exif_make": None, "exif_model": None,
        "decode_status": np.where(seen["admitted"], "ok", "error"), "error": None,
        "admitted": seen["admitted"], "quarantine_reason": seen["quarantine_reason"]})
    groups = admitted[["row_id", "group_id"]].copy()
    groups["group_size"] = groups["group_id"].map(groups["group_id"].value_counts())
    if shuffle is not None:  # the same content in another order must give the same split
        manifest = manifest.sample(frac=1, random_state=shuffle)
        groups = groups.sample(frac=1, random_state=shuffle)
    pairs = []
    for _, members in admitted.groupby("group_id"):
        for a, b in zip(members.itertuples(), members.iloc[1:].itertuples(), strict=False):
            pairs.append({"row_id_a": a.row_id, "row_id_b": b.row_id, "rel_path_a": a.rel_path,
                          "rel_path_b": b.rel_path, "kind": "exact_pixels", "phash_distance": 0,
                          "dhash_distance": 0, "verify_score": 1.0, "trusted": True,
                          "class_a": a.class_name, "class_b": b.class_name,
                          "label_conflict": a.class_name != b.class_name})
    singles = admitted.drop_duplicates("group_id").iloc[:6]  # untrusted near pairs between groups
    for a, b in zip(singles.iloc[::2].itertuples(), singles.iloc[1::2].itertuples(), strict=False):
        pairs.append({"row_id_a": a.row_id, "row_id_b": b.row_id, "rel_path_a": a.rel_path,
                      "rel_path_b": b.rel_path, "kind": "near", "phash_distance": 9, "dhash_distance": 11,
                      "verify_score": 0.4, "trusted": False, "class_a": a.class_name,
                      "class_b": b.class_name, "label_conflict": a.class_name != b.class_name})
    relationships = pd.DataFrame(pairs)
    relationships["split_a"] = relationships["rel_path_a"].str.split("/").str[0]
    relationships["split_b"] = relationships["rel_path_b"].str.split("/").str[0]
    relationships["crosses_split"] = relationships["split_a"] != relationships["split_b"]
    support = admitted["class_name"].value_counts()
    classes = [{"index": i, "name": name, "crop": "tomato", "condition": name.split("___")[1].lower(),
                "type": "healthy" if name.endswith("healthy") else "specific", "pest": "pest" in name,
                "fruit": False, "naming": "plantvillage", "support": int(support[name])}
               for i, name in enumerate(sorted(support.index))]
    corpus = Chapter(run_dir, "corpus")
    corpus.write_parquet("corpus/manifest.parquet", manifest)
    corpus.write_json("corpus/class_map.json", {
        "fingerprint": evidence.sha256_json(classes), "classes": classes,
        "quarantined_classes": [{"name": "Tomato___single", "reason": "class_below_min_support",
                                 "support": 1}]})
    audit = Chapter(run_dir, "audit")
    audit.write_parquet("audit/relationships.parquet", relationships)
    audit.write_parquet("audit/groups.parquet", groups)
    audit.write_json("audit/audit.json", audit_record if audit_record is not None else {
        "chapter": "audit", "figures": {"inherited_partition": {
            "decision": "reject", "rejected": True, "reason": "trusted relationships cross"}}})


def make_run(run_dir: Path, overrides: dict | None = None, **upstream) -> config.RunContext:
    ctx = config.open_run(run_dir, profile="smoke", overrides=overrides)
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected, **upstream)
    return ctx


def fresh_copy(frozen, tmp_path: Path) -> Path:
    ctx, _ = frozen
    target = tmp_path / "run"
    shutil.copytree(ctx.run_dir, target)
    return target
