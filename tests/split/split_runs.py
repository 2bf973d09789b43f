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


# --------------------------------------------------------------------------- field-train
FIELD_CLASSES = {"Tomato___healthy": 60, "Tomato___Late_blight": 50, "Tomato___Early_blight": 40,
                 "Tomato___Leaf_Mold": 30}


def field_train_tables(admitted: pd.DataFrame, seed: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Admitted field-train rows (chapter 1's columns) and cross-set groups (chapter 2's columns).

    Field photos come in series (groups of 1-4); every fifth series also holds a lab photo of its class
    (its lab group joins the cross group), one photo shares a group with lab photos of two lab groups,
    two photos are of a class the lab split quarantines (two groups only), and a cohort photo joins one
    series (a relative in the scored cohort changes nothing here)."""
    rng = np.random.default_rng(seed)
    lab_groups = admitted.groupby("class_name")["group_id"].unique()
    rows, cross_of_field, k = [], [], 0
    for name, n in FIELD_CLASSES.items():
        left, series = n, 0
        while left > 0:
            size = min(left, int(rng.integers(1, 5)))
            lab_group = lab_groups[name][series % len(lab_groups[name])] if series % 5 == 0 else None
            for _ in range(size):
                rows.append({"rel_path": f"{name}/ft_{k}.jpg", "class_name": name})
                cross_of_field.append(f"lab{lab_group}" if lab_group is not None else f"ft{name}{series}")
                k += 1
            left, series = left - size, series + 1
    for j in range(2):
        rows.append({"rel_path": f"Tomato___one_leaf/ft_one_{j}.jpg", "class_name": "Tomato___one_leaf"})
        cross_of_field.append(f"ftone{j}")
    field = pd.DataFrame(rows)
    field["row_id"] = field["rel_path"].map(lambda rel: evidence.row_id(f"field_train/{rel}"))
    names = sorted(set(admitted["class_name"]))
    field["label"] = field["class_name"].map({n: i for i, n in enumerate(names)}).astype("int64")
    field["source_label"] = field["class_name"]
    field["sha256"], field["width"], field["height"] = "0" * 64, 64, 64
    lab_cross = admitted.assign(set="lab", group_id="lab" + admitted["group_id"].astype(str))
    # one field photo ties two lab groups of its class together
    bridge = field.index[field["class_name"] == "Tomato___healthy"][-1]
    first, second = lab_groups["Tomato___healthy"][:2]
    cross_of_field[bridge] = f"lab{first}"
    lab_cross.loc[lab_cross["group_id"] == f"lab{second}", "group_id"] = f"lab{first}"
    cross = pd.concat([
        lab_cross[["row_id", "set", "rel_path", "group_id"]],
        pd.DataFrame({"row_id": field["row_id"], "set": "field_train", "rel_path": field["rel_path"],
                      "group_id": cross_of_field}),
        pd.DataFrame({"row_id": [evidence.row_id("field/Tomato___healthy/c.jpg")], "set": ["cohort:orchard"],
                      "rel_path": ["Tomato___healthy/c.jpg"], "group_id": [cross_of_field[0]]}),
    ], ignore_index=True)
    return field[["row_id", "rel_path", "class_name", "label", "source_label", "sha256", "width",
                  "height"]], cross


def make_field_run(run_dir: Path, photos: Path, overrides: dict | None = None) -> config.RunContext:
    """A planted run opened with --field-train, with chapter 1's and chapter 2's field-train tables."""
    photos.mkdir(parents=True, exist_ok=True)
    ctx = config.open_run(run_dir, profile="smoke", overrides=overrides, field_train=str(photos))
    admitted, rejected = planted_corpus()
    write_upstream(ctx.run_dir, admitted, rejected)
    field, cross = field_train_tables(admitted)
    Chapter(ctx.run_dir, "corpus").write_parquet("corpus/field_train.parquet", field)
    Chapter(ctx.run_dir, "audit").write_parquet("audit/cross_groups.parquet", cross)
    return ctx
