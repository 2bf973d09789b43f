"""Chapter 7 (runtime): the disagreement classifier, .pte integrity, and lower + execute end to end.

The end-to-end tests run chapter 7 on the tiny run folder of ``test_quant`` (chapter 6 executed on an
untrained ``test_efficientnet`` at 32 px): lower the selected graph, write the .pte, load it back from
disk after checking its SHA-256, execute it on the locked test rows, time it against the eager model.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from test_quant import ptq_run  # noqa: F401  (the shared fixture: chapter 6 on the tiny run)

from cropcop_utils import evidence, locked_test, quant, runtime


# --------------------------------------------------------------------------- disagreement classifier
def test_classify_disagreement_covers_the_three_kinds():
    assert runtime.classify_disagreement(label=2, before=1, after=2) == "corrected error"
    assert runtime.classify_disagreement(label=2, before=2, after=0) == "reversed correct"
    assert runtime.classify_disagreement(label=2, before=1, after=0) == "wrong-to-wrong"
    with pytest.raises(ValueError, match="not a disagreement"):
        runtime.classify_disagreement(label=2, before=1, after=1)


def _record(preds: list[int], labels: list[int], margins: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"row_id": [f"r{i}" for i in range(len(preds))], "label": labels, "pred": preds,
                         "margin": margins, "model_state": "x"})


def test_disagreement_table_lists_changed_rows_only_in_any_row_order():
    labels = [0, 1, 2, 0, 1]
    graph = _record([0, 0, 1, 0, 1], labels, [0.9, 0.1, 0.2, 0.8, 0.7])
    pte = _record([0, 1, 2, 2, 1], labels, [0.9, 0.05, 0.3, 0.4, 0.7]).iloc[::-1]
    table = runtime.disagreement_table(graph, pte, ["a", "b", "c"],
                                       pd.Series({"r1": "x/1.jpg", "r2": "x/2.jpg", "r3": "x/3.jpg"}))
    assert list(table["row_id"]) == ["r1", "r2", "r3"]
    assert list(table["kind"]) == ["corrected error", "corrected error", "reversed correct"]
    assert list(table["graph_margin"]) == [0.1, 0.2, 0.8] and list(table["pte_margin"]) == [0.05, 0.3, 0.4]
    assert list(table["pte_pred_name"]) == ["b", "c", "c"] and list(table["rel_path"])[0] == "x/1.jpg"
    assert runtime.disagreement_counts(table) == {"corrected error": 2, "reversed correct": 1,
                                                  "wrong-to-wrong": 0}
    with pytest.raises(ValueError, match="same rows"):
        runtime.disagreement_table(graph, pte.iloc[1:], ["a", "b", "c"])


def test_params_refuse_unknown_options(tmp_path):
    from cropcop_utils import config

    ctx = config.open_run(tmp_path / "run", profile="smoke")
    with pytest.raises(runtime.RuntimeConfigError, match="not accepted"):
        runtime.runtime_params(ctx, threads=4)


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runtime_run(ptq_run):  # noqa: F811
    run, ptq_record, _ = ptq_run
    return run, ptq_record, runtime.run_chapter(run.ctx)


@pytest.mark.slow
def test_chapter_lowers_executes_from_disk_and_audits(runtime_run):
    run, ptq_record, record = runtime_run
    run_dir = run.run_dir
    assert json.loads((run_dir / "runtime/runtime.json").read_text()) == json.loads(json.dumps(record))
    pte = run_dir / runtime.PTE
    assert evidence.verify_artifact(run_dir, runtime.PTE) == record["pte"]["sha256"]
    assert record["pte"]["pte_bytes"] == pte.stat().st_size
    assert record["pte"]["pte_mib"] == pytest.approx(pte.stat().st_size / 2**20)
    state = torch.load(run_dir / quant.CHECKPOINT, weights_only=True)["model"]
    assert record["pte"]["state_bytes"] == len(runtime.state_dict_bytes(state))
    assert record["pte"]["ratio"] == pytest.approx(pte.stat().st_size / record["pte"]["state_bytes"])
    delegation = pd.read_parquet(run_dir / "runtime/delegation.parquet")
    assert delegation["delegated"].sum() == record["delegation"]["delegated_nodes"] > 0
    # A new record for the .pte, read through the locked test under the .pte's own SHA-256.
    test = pd.read_parquet(run_dir / runtime.TEST_RECORD)
    assert len(test) == 12 and (test["model_state"] == record["pte"]["sha256"]).all()
    accesses = locked_test.read_accesses(run_dir)
    assert list(accesses["reader"]) == ["training/compact", "ptq", "runtime"]
    graph = pd.read_parquet(run_dir / quant.TEST_RECORD)
    merged = graph.merge(test, on="row_id", suffixes=("_graph", "_pte"))
    changed = merged[merged["pred_graph"] != merged["pred_pte"]]
    audit = pd.read_parquet(run_dir / runtime.DISAGREEMENTS)
    assert len(audit) == len(changed) == record["test"]["disagreements"]
    assert set(audit["row_id"]) == set(changed["row_id"])
    assert record["test"]["agreement_with_int8_graph"] == pytest.approx(1 - len(changed) / 12)
    # Latency and memory: both models measured in their own subprocess.
    latency = pd.read_parquet(run_dir / "runtime/latency.parquet").set_index("kind")
    assert set(latency.index) == {"pte", "eager"}
    assert (latency["p50_ms"] > 0).all() and (latency["p95_ms"] >= latency["p50_ms"]).all()
    assert (latency["peak_rss_mib"] >= latency["rss_before_load_mib"]).all()
    assert record["latency_ratios"]["p50_ratio"] == pytest.approx(
        latency.loc["pte", "p50_ms"] / latency.loc["eager", "p50_ms"])


@pytest.mark.slow
def test_the_pte_computes_what_the_int8_graph_computes_at_any_batch(runtime_run):
    run, _, _ = runtime_run
    forward = runtime.load_verified_pte(run.run_dir)
    program = quant.load_program((run.run_dir / quant.SELECTED).read_bytes()).module()
    # The program keeps the exported batch bound (ptq.max_batch = 16 here), batch 1 included.
    assert forward.max_batch == 16
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    for batch in (x[:1], x[:5], x):
        out, want = forward(batch), program(batch)
        assert out.shape == want.shape
        # XNNPACK's int8 kernels round differently from the reference decomposition, only slightly.
        assert float((out - want).abs().max()) <= 0.05 * float(want.abs().max()) + 1e-3


@pytest.mark.slow
def test_a_modified_pte_is_refused_before_it_runs(runtime_run, tmp_path):
    run, _, _ = runtime_run
    copy_dir = tmp_path / "tampered"
    shutil.copytree(run.run_dir, copy_dir)
    pte = copy_dir / runtime.PTE
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    with pytest.raises(runtime.PteIntegrityError, match="modified after it was written"):
        runtime.load_verified_pte(copy_dir)
    registry = json.loads((copy_dir / "registry.json").read_text())
    del registry["artifacts"][runtime.PTE]
    (copy_dir / "registry.json").write_text(json.dumps(registry))
    with pytest.raises(runtime.PteIntegrityError, match="not in"):
        runtime.load_verified_pte(copy_dir)
    # The latency worker checks the hash it is handed too.
    with pytest.raises(runtime.PteIntegrityError):
        runtime.verified_pte_bytes(pte, "0" * 64)


def test_latency_ratios_and_plot():
    table = pd.DataFrame([
        {"model": ".pte", "kind": "pte", "p50_ms": 2.0, "p95_ms": 3.0, "peak_above_baseline_mib": 10.0},
        {"model": "eager", "kind": "eager", "p50_ms": 4.0, "p95_ms": 5.0, "peak_above_baseline_mib": 40.0}])
    assert runtime.latency_ratios(table) == {"p50_ratio": 0.5, "p95_ratio": 0.6, "memory_ratio": 0.25}
    fig = runtime.plot_latency(table)
    assert len(fig.axes) == 2
    assert np.allclose([p.get_width() for p in fig.axes[1].patches], [10.0, 40.0])


@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    from pathlib import Path

    run_dir = Path(smoke_book["run_dir"])
    record = json.loads((run_dir / "runtime/runtime.json").read_text())
    assert evidence.verify_artifact(run_dir, runtime.PTE) == record["pte"]["sha256"]
    assert record["test"]["rows"] == len(pd.read_parquet(run_dir / runtime.TEST_RECORD))
    text = (smoke_book["book_root"] / "book" / "07_runtime.ipynb").read_text()
    assert "Traceback" not in text and "rows decided differently" in text
