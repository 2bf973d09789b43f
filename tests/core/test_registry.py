"""Identity table, mismatch detection and the evidence rows read from the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_fixtures import analysed_run, build_run  # noqa: F401

from cropcop_utils.core import evidence, registry, summary


def test_identity_table_names_every_kind(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    table = registry.check(run.run_dir).set_index("path")
    assert table["matches"].all()
    expected = {"corpus/manifest.parquet": "manifest", "corpus/class_map.json": "class map",
                "split/class_map.json": "class map", "audit/relationships.parquet": "relationships",
                "audit/groups.parquet": "groups", "split/split.parquet": "split",
                "training/reference/best.pt": "checkpoint", "ptq/selected.pt2": "converted graph",
                "runtime/model.pte": "runtime program (.pte)",
                "runtime/predictions_test.parquet": "prediction records", "split/split.json": "metrics JSON"}
    for path, kind in expected.items():
        assert table.loc[path, "kind"] == kind, path
    manifest = run.run_dir / "corpus/manifest.parquet"
    assert table.loc["corpus/manifest.parquet", "sha256"] == evidence.sha256_file(manifest)
    assert table.loc["corpus/manifest.parquet", "found_bytes"] == manifest.stat().st_size
    assert table.loc["split/split.parquet", "chapter"] == "split"


def test_mismatch_fails_loudly(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    target = run.run_dir / "runtime/model.pte"
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01  # same size, different content
    target.write_bytes(bytes(data))
    table = registry.identity_table(run.run_dir).set_index("path")
    assert not table.loc["runtime/model.pte", "matches"]
    assert table.drop(index="runtime/model.pte")["matches"].all()
    with pytest.raises(registry.RegistryMismatch, match=r"runtime/model\.pte \(written by 'runtime'\)"):
        registry.check(run.run_dir)
    with pytest.raises(registry.RegistryMismatch):
        summary.render_summary_markdown(run.run_dir)
    (run.run_dir / "ptq/selected.pt2").unlink()
    with pytest.raises(registry.RegistryMismatch, match=r"ptq/selected\.pt2.*missing"):
        registry.check(run.run_dir)


def test_check_without_registry(tmp_path: Path) -> None:
    with pytest.raises(registry.RegistryMismatch, match="registry.json is missing"):
        registry.check(tmp_path)


def test_every_summary_number_traces_to_its_file(analysed_run) -> None:  # noqa: F811
    run, _, _ = analysed_run
    rows = registry.evidence_summary(run.run_dir)
    assert rows and all(set(r) >= {"claim", "value", "source", "key"} for r in rows)
    for row in rows:
        record = json.loads((run.run_dir / row["source"]).read_text())
        assert registry.lookup(record, row["key"]) == row["value"], row
    headline = {(r["source"], r["key"]) for r in rows if r["headline"]}
    assert ("analysis/per_class.json", "figures.paired.reference_to_pte.macro_f1.delta") in headline
    assert ("analysis/fruit_slice.json",
            "figures.slice.paired.reference_to_pte.mean_recall.delta") in headline
    assert ("split/split.json", "totals.test") in headline


def test_missing_keys_are_skipped_not_invented(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    rows = registry.evidence_summary(run.run_dir)
    assert not any(r["source"].startswith("analysis/") for r in rows)
    keys = {r["key"] for r in rows if r["source"] == "split/split.json"}
    assert "totals.test" in keys and "train_support_ratio.ratio" not in keys  # the fixture lacks it
