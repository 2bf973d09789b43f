"""The study's identity table and the evidence rows read from every chapter's record.

``identity_table`` re-hashes every artifact in ``registry.json`` from disk (bytes, SHA-256, the chapter
that wrote it); ``check`` raises :class:`RegistryMismatch` when any differs.  ``evidence_summary``
reads the chapters' JSON records and returns one row per number with the file and the JSON key it
came from, the curated :data:`HEADLINES` first.  Keys a record does not have are skipped, never filled
in.  The page rendered from these rows is :mod:`.summary`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from .chain import CHAPTERS
from .evidence import REGISTRY_NAME, FingerprintMismatch, verify_registry


class RegistryMismatch(FingerprintMismatch):
    """A registered artifact is missing or its bytes / SHA-256 differ from what its chapter recorded."""


# --------------------------------------------------------------------------- identity table
_KINDS: tuple[tuple[str, str], ...] = (
    (r"^corpus/manifest\.parquet$", "manifest"),
    (r"(^|/)class_map\.json$", "class map"),
    (r"^audit/relationships\.parquet$", "relationships"),
    (r"^audit/groups\.parquet$", "groups"),
    (r"^audit/hashes\.parquet$", "perceptual hashes"),
    (r"^split/split\.parquet$", "split"),
    (r"quarantine\.parquet$", "quarantine"),
    (r"(^|/)predictions_[^/]*\.parquet$", "prediction records"),
    (r"\.pte$", "runtime program (.pte)"),
    (r"\.pt2$", "converted graph"),
    (r"\.(pt|pth|ckpt|safetensors)$", "checkpoint"),
    (r"\.json$", "metrics JSON"),
    (r"\.png$", "figure"),
    (r"\.parquet$", "table"),
)
IDENTITY_COLUMNS = ["path", "kind", "chapter", "bytes", "sha256", "found_bytes", "found_sha256", "matches"]


def artifact_kind(rel_path: str) -> str:
    for pattern, kind in _KINDS:
        if re.search(pattern, rel_path):
            return kind
    return "other"


def identity_table(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Every registered artifact re-hashed from disk: recorded vs found bytes and SHA-256."""
    table = verify_registry(run_dir)
    if table.empty:
        return pd.DataFrame(columns=IDENTITY_COLUMNS)
    found_bytes = [(Path(run_dir) / p).stat().st_size if (Path(run_dir) / p).exists() else None
                   for p in table["path"]]
    table = table.assign(kind=[artifact_kind(p) for p in table["path"]],
                         found_bytes=pd.array(found_bytes, dtype="Int64"))
    table["matches"] = table["matches"] & (table["found_bytes"] == table["bytes"]).fillna(False)
    return table[IDENTITY_COLUMNS].sort_values("path", kind="stable").reset_index(drop=True)


def check(run_dir: str | os.PathLike) -> pd.DataFrame:
    """The identity table, or :class:`RegistryMismatch` naming every artifact that no longer matches."""
    run_dir = Path(run_dir)
    if not (run_dir / REGISTRY_NAME).exists():
        raise RegistryMismatch(f"{run_dir / REGISTRY_NAME} is missing: no chapter has registered an artifact "
                               "in this run folder; run the chain from chapter 01.")
    table = identity_table(run_dir)
    bad = table[~table["matches"].astype(bool)]
    if len(bad):
        details = "; ".join(
            f"{r.path} (written by '{r.chapter}'): "
            + ("missing" if pd.isna(r.found_sha256) else
               f"recorded {r.bytes} bytes / SHA-256 {r.sha256[:16]}…, found {r.found_bytes} bytes / "
               f"{r.found_sha256[:16]}…")
            for r in bad.head(10).itertuples())
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise RegistryMismatch(
            f"{len(bad)} of {len(table)} registered artifacts in {run_dir} no longer match registry.json: "
            f"{details}{more}. The evidence is not what its chapters wrote; rerun the chapters named "
            "(and those after them) or restore the files.")
    return table


# --------------------------------------------------------------------------- evidence summary
# Curated headline numbers: (record path, dotted JSON key, claim).  A key a record lacks is skipped.
_PAIR = "figures.paired.reference_to_pte"
_PROBE = "figures.class_probes.frozen_linear.test"
HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("corpus/corpus.json", "figures.files_seen", "files seen in the corpus folder"),
    ("corpus/corpus.json", "figures.admitted", "images admitted"),
    ("corpus/corpus.json", "figures.quarantined", "files quarantined, each with a reason"),
    ("corpus/corpus.json", "figures.n_classes_admitted", "classes admitted"),
    ("corpus/corpus.json", "figures.largest_to_smallest", "largest / smallest admitted class"),
    ("split/split.json", "rows_split", "rows in the frozen split"),
    ("split/split.json", "totals.train", "train rows"),
    ("split/split.json", "totals.val", "validation rows"),
    ("split/split.json", "totals.test", "locked test rows"),
    ("split/split.json", "rows_quarantined", "rows quarantined by the split"),
    ("split/split.json", "groups.multi_row", "leakage groups with more than one image"),
    ("split/split.json", "crossings.verdict", "leakage groups across splits (read back from disk)"),
    ("split/split.json", "crossings.groups_across_splits", "leakage groups that span two splits"),
    ("split/split.json", "train_support_ratio.ratio", "largest / smallest class, training rows"),
    ("probes/probes.json", f"{_PROBE}.accuracy.value", "frozen-feature linear probe: test accuracy"),
    ("probes/probes.json", f"{_PROBE}.macro_f1.value", "frozen-feature linear probe: test macro-F1"),
    ("probes/probes.json", "figures.membership.membership_frozen.roc_auc.value",
     "train-vs-test membership probe (frozen features): ROC AUC"),
    ("training/training.json", "models.reference.arch", "reference model architecture"),
    ("training/training.json", "models.compact.arch", "compact model architecture"),
    ("training/training.json", "models.compact.params", "compact model parameters"),
    ("training/training.json", "models.reference.test_macro_f1", "float reference: test macro-F1"),
    ("training/training.json", "models.compact.test_macro_f1", "float compact: test macro-F1"),
    ("ptq/ptq.json", "selected", "selected quantisation candidate"),
    ("ptq/ptq.json", "figures.selected_passed_gate", "selected candidate passed the validation gate"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta", "float compact → INT8 graph: test macro-F1 change"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta_lo", "float compact → INT8 graph: change, interval low"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta_hi", "float compact → INT8 graph: change, interval high"),
    ("runtime/runtime.json", "figures.pte_mib", ".pte size (MiB)"),
    ("runtime/runtime.json", "figures.size_reduction", "size reduction of the .pte against the float state"),
    ("runtime/runtime.json", "figures.test_agreement_with_int8_graph",
     ".pte agrees with the INT8 graph (test)"),
    ("runtime/runtime.json", "figures.test_disagreements", "test rows where .pte and INT8 graph differ"),
    ("runtime/runtime.json", "figures.latency_p50_ratio", "median latency, .pte / float eager"),
    ("analysis/per_class.json", "figures.n_test_rows", "test rows every model state was scored on"),
    ("analysis/per_class.json", "figures.n_classes_scored", "classes with test rows"),
    *[("analysis/per_class.json", f"figures.states.{state}.{metric}.value", f"{label}: {metric_label}")
      for state, label in (("reference", "float reference"), ("pte", ".pte on the runtime"))
      for metric, metric_label in (("accuracy", "accuracy"), ("macro_f1", "macro-F1"))],
    *[("analysis/per_class.json", f"{_PAIR}.{metric}.{part}", f"reference → .pte, {label} {what}")
      for metric, label in (("accuracy", "accuracy"), ("macro_f1", "macro-F1"),
                            ("balanced_accuracy", "balanced accuracy"))
      for part, what in (("delta", "change"), ("lo", "change, interval low"),
                         ("hi", "change, interval high"))],
    ("analysis/per_class.json", f"{_PAIR}.mcnemar.p_value", "reference → .pte, exact McNemar p-value"),
    ("analysis/per_class.json", "figures.unstable_classes", "classes flagged unstable (few test rows)"),
    ("analysis/fruit_slice.json", "figures.n_slice_classes", "fruit-label slice: classes (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.delta",
     "fruit-label slice: mean recall change, reference → .pte (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.lo",
     "fruit-label slice: change, interval low (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.hi",
     "fruit-label slice: change, interval high (exploratory)"),
    ("field/field.json", "figures.pte_lab_accuracy", ".pte: lab test accuracy, field cohort's classes"),
    ("field/field.json", "figures.pte_field_accuracy", ".pte: zero-shot accuracy on the field cohort"),
    ("field/field.json", "figures.pte_background_share", ".pte: share of the lab-to-field gap, background"),
    ("field/field.json", "figures.pte_off_leaf_occlusion_lab", ".pte: occlusion mass off the leaf, lab test"),
)
_MAX_TEXT = 80


def lookup(record: Any, key: str) -> Any:
    """Value at a dotted key, or KeyError (lists are indexed by position)."""
    value = record
    for part in key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(key)
    return value


def _scalar(value: Any) -> bool:
    if isinstance(value, bool) or isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and 0 < len(value) <= _MAX_TEXT


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}")
    elif _scalar(value):
        yield prefix, value


def chapter_status(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Which chapters left a record in the run folder (and the extra analysis records found)."""
    run_dir = Path(run_dir)
    rows = [{"chapter": c.name, "title": c.heading, "record": c.record, "ran": (run_dir / c.record).exists()}
            for c in CHAPTERS]
    known = {c.record for c in CHAPTERS}
    for extra in sorted((run_dir / "analysis").glob("*.json")) if (run_dir / "analysis").is_dir() else []:
        rel = extra.relative_to(run_dir).as_posix()
        if rel not in known:
            rows.append({"chapter": extra.stem, "title": f"Analysis: {extra.stem}", "record": rel,
                         "ran": True})
    return pd.DataFrame(rows)


def _read(run_dir: Path, rel_path: str) -> Any:
    try:
        return json.loads((run_dir / rel_path).read_text())
    except json.JSONDecodeError as error:
        raise RegistryMismatch(f"{run_dir / rel_path} is not valid JSON ({error}); rerun its chapter") \
            from None


def evidence_summary(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per number: claim, value, source file, JSON key — the curated headlines first, then every
    scalar in each record's ``figures``.  Only chapters that ran contribute."""
    run_dir = Path(run_dir)
    status = chapter_status(run_dir)
    records = {r.record: _read(run_dir, r.record) for r in status.itertuples() if r.ran}
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for source, key, claim in HEADLINES:
        if source not in records:
            continue
        try:
            value = lookup(records[source], key)
        except KeyError:
            continue
        if _scalar(value):
            rows.append({"claim": claim, "value": value, "source": source, "key": key, "headline": True})
            seen.add((source, key))
    for source, record in records.items():
        chapter = record.get("chapter", Path(source).stem) if isinstance(record, dict) else Path(source).stem
        figures = record.get("figures", {}) if isinstance(record, dict) else {}
        for key, value in _flatten(figures, "figures"):
            if (source, key) not in seen:
                rows.append({"claim": f"{chapter}: {key.removeprefix('figures.')}", "value": value,
                             "source": source, "key": key, "headline": False})
    return rows
