"""Chapter 7 (runtime): the disagreement classifier, .pte integrity, and lower + execute end to end.

The end-to-end tests run chapter 7 on the tiny run folder of ``ptq_fixtures`` (chapter 6 executed on a
briefly trained ``test_efficientnet`` at 32 px): lower the selected graph, write the .pte, load it back
from disk after checking its SHA-256, execute it on the locked test rows. The smoke book's chapter 7 times
it against the eager model.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from ptq_fixtures import ptq_run  # noqa: F401  (the shared fixture: chapter 6 on the tiny run)

from cropcop_utils import ptq as quant
from cropcop_utils import runtime as runtime_pkg
from cropcop_utils.core import evidence
from cropcop_utils.nets import pte as pte_program
from cropcop_utils.nets.int8_graph import load_program
from cropcop_utils.runtime import chapter as runtime
from cropcop_utils.runtime import device, latency, lowering, outputs
from cropcop_utils.split import locked_test


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
    from cropcop_utils.core import config

    ctx = config.open_run(tmp_path / "run", profile="smoke")
    with pytest.raises(runtime.RuntimeConfigError, match="not accepted"):
        runtime.runtime_params(ctx, threads=4)


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runtime_run(ptq_run):  # noqa: F811
    """Chapter 7 on the tiny run, untimed: the latency subprocesses (three fresh interpreters, ~20 s of a
    2-core suite) are tested where the smoke book runs them
    (``test_latency_is_measured_in_fresh_processes``)."""
    run, ptq_record, _ = ptq_run
    return run, ptq_record, runtime.run_chapter(run.ctx, measure_latency=False)


@pytest.mark.slow
def test_chapter_lowers_executes_from_disk_and_audits(runtime_run):
    run, ptq_record, record = runtime_run
    run_dir = run.run_dir
    assert json.loads((run_dir / "runtime/runtime.json").read_text()) == json.loads(json.dumps(record))
    pte = run_dir / pte_program.PTE
    assert evidence.verify_artifact(run_dir, pte_program.PTE) == record["pte"]["sha256"]
    # The chapter's program keeps the exported batch bound (the profile's ptq.max_batch).
    assert pte_program.load_verified_pte(run_dir).max_batch == record["pte_max_batch"] == int(
        run.ctx.section("ptq")["max_batch"])
    assert record["pte"]["pte_bytes"] == pte.stat().st_size
    assert record["pte"]["pte_mib"] == pytest.approx(pte.stat().st_size / 2**20)
    state = torch.load(run_dir / quant.CHECKPOINT, weights_only=True)["model"]
    assert record["pte"]["state_bytes"] == len(runtime.state_dict_bytes(state))
    assert record["pte"]["ratio"] == pytest.approx(pte.stat().st_size / record["pte"]["state_bytes"])
    delegation = pd.read_parquet(run_dir / "runtime/delegation.parquet")
    assert delegation["delegated"].sum() == record["delegation"]["delegated_nodes"] > 0
    # the .pte and the device program, each lowered once, timed
    assert record["lowering"]["workers"] == int(run.ctx.section("runtime")["workers"])
    assert set(record["lowering"]["seconds"]) == {run.ctx.section("training")["regime"],
                                                  f"{run.ctx.section('training')['regime']}/device"}
    # A new record for the .pte, read through the locked test under the .pte's own SHA-256.
    test = pd.read_parquet(run_dir / runtime.TEST_RECORD)
    assert len(test) == 12 and (test["model_state"] == record["pte"]["sha256"]).all()
    # ... and, from the same pass, the program's second output: the features its classifier reads
    assert record["program_outputs"]["names"] == ["logits", "features"]
    features = pd.read_parquet(run_dir / runtime.FEATURES_TEST)
    assert list(features["row_id"]) == list(test["row_id"])
    assert (features["model_state"] == record["pte"]["sha256"]).all()
    assert {len(f) for f in features["features"]} == {record["program_outputs"]["features_dim"]}
    accesses = locked_test.read_accesses(run_dir)
    assert list(accesses["reader"]) == ["training/compact", "ptq", "runtime"]
    graph = pd.read_parquet(run_dir / quant.TEST_RECORD)
    merged = graph.merge(test, on="row_id", suffixes=("_graph", "_pte"))
    changed = merged[merged["pred_graph"] != merged["pred_pte"]]
    audit = pd.read_parquet(run_dir / runtime.DISAGREEMENTS)
    assert len(audit) == len(changed) == record["test"]["disagreements"]
    assert set(audit["row_id"]) == set(changed["row_id"])
    assert record["test"]["agreement_with_int8_graph"] == pytest.approx(1 - len(changed) / 12)
    # untimed when asked: no latency file, no ratio
    assert record["latency"] is None and record["latency_ratios"] == {}
    assert not (run_dir / "runtime/latency.parquet").exists() and "latency" not in record["figures"]


@pytest.mark.slow
def test_latency_is_measured_in_fresh_processes(smoke_book):
    """The smoke book's shipped program, its device program and the eager float model, each timed in its
    own subprocess."""
    from pathlib import Path

    run_dir = Path(smoke_book["run_dir"])
    record = json.loads((run_dir / "runtime/runtime.json").read_text())
    latency = pd.read_parquet(run_dir / "runtime/latency.parquet").set_index("kind")
    assert set(latency.index) == {"pte", "device_pte", "eager"}
    assert (latency["p50_ms"] > 0).all() and (latency["p95_ms"] >= latency["p50_ms"]).all()
    assert (latency["peak_rss_mib"] >= latency["rss_before_load_mib"]).all()
    assert record["latency_ratios"]["p50_ratio"] == pytest.approx(
        latency.loc["pte", "p50_ms"] / latency.loc["eager", "p50_ms"])
    assert record["latency_ratios"]["device_memory_ratio"] == pytest.approx(
        latency.loc["device_pte", "peak_above_baseline_mib"]
        / latency.loc["eager", "peak_above_baseline_mib"])
    assert record["figures"]["latency_p50_ratio"] == record["latency_ratios"]["p50_ratio"]
    # three processes, started together, timed one after another
    assert latency["pid"].nunique() == 3
    spans = latency.sort_values("timed_from")[["timed_from", "timed_to"]].to_numpy()
    assert (spans[1:, 0] >= spans[:-1, 1]).all(), spans


def test_a_failed_latency_worker_says_why():
    with pytest.raises(latency.LatencyError, match="unknown latency kind 'tflite'"):
        latency.measure_all([{"kind": "tflite", "image_size": 8, "warmup": 0, "runs": 1, "threads": 1,
                              "seed": 0}], timeout_s=300)


@pytest.mark.slow
def test_the_device_program_is_planned_for_batch_one_and_gives_the_batched_programs_outputs(runtime_run):
    run, _, record = runtime_run
    run_dir, device_program = run.run_dir, record["device_program"]
    assert evidence.verify_artifact(run_dir, device.DEVICE_PTE) == device_program["sha256"]
    batched = pte_program.load_verified_pte(run_dir)
    one = pte_program.load_verified_pte(run_dir, device.DEVICE_PTE)
    assert one.max_batch == device_program["batch"] == 1 and batched.max_batch > 1
    check = device_program["check"]
    val = run.rows[run.rows["split"] == "val"]
    assert check["rows"] == len(val) and check["identical"] and check["top1_agreement"] == 1.0
    assert check["max_abs_diff"] == {"logits": 0.0, "features": 0.0}
    # read back from disk, one image through each program: the same numbers
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    for i in range(3):
        for a, b in zip(batched.outputs(x)[:2], one.outputs(x[i:i + 1]), strict=True):
            assert torch.equal(a[i:i + 1], b)
    assert "identical outputs" in runtime_pkg.device_text(record)


# A statically quantised graph ends in an int8 output quantiser (scale s, from calibration), and so does
# its .pte: their logits lie on one grid and differ by whole steps of s.  XNNPACK requantises every layer
# with fixed-point multipliers where the reference decomposition rounds in float (round half to even), so
# an activation can land one int8 step away and a few such steps can reach the logits.  The tolerance is
# LOGIT_STEPS output steps: relative to the output's int8 range (255 steps of s), 8 / 255 = 3.1 %,
# whatever the logits' scale.
LOGIT_STEPS = 8


def _output_scale(program: torch.fx.GraphModule) -> float:
    """The scale of the int8 quantiser the graph's logits come out of (its last dequantize)."""
    output = next(node for node in program.graph.nodes if node.op == "output")
    (logits,) = output.args[0]
    assert str(logits.target).startswith("quantized_decomposed.dequantize_per_tensor"), logits.target
    return float(logits.args[1])


@pytest.fixture(scope="module")
def static_pte(ptq_run):  # noqa: F811
    """The tiny run's trained compact model, statically quantised (train rows calibrate), as graph + .pte.

    Static, whichever candidate chapter 6 selected (a macro-F1 tie goes to the dynamic one, whose float
    logits have no output grid to count steps on); exported with the profile's batch bound, as chapter 6
    does, and lowered with chapter 7's :func:`lowering.lower`.
    """
    from cropcop_utils.core.imaging import ImageSpec
    from cropcop_utils.nets.models import create_model

    run, _, _ = ptq_run
    state = torch.load(run.run_dir / quant.CHECKPOINT, weights_only=True)
    model = create_model(state["arch"], int(state["num_classes"]))
    model.load_state_dict(state["model"])
    model.eval()
    max_batch = int(run.ctx.section("ptq")["max_batch"])
    spec = ImageSpec.from_section(run.ctx.section("image"))
    example = torch.zeros((2, 3, spec.size, spec.size))
    train = run.rows[run.rows["split"] == "train"]
    (candidate,) = quant.parse_candidates({"candidates": [
        {"name": "static", "activations": "static", "calibration_rows": len(train)}]})
    graph, _ = quant.quantise(quant.export_dynamic(model, example, max_batch), candidate,
                              quant.image_batches(train, run.ctx.corpus_root, spec, 8), example)
    blob = quant.serialise(graph, example, max_batch)
    program = load_program(blob).module()
    data, _, _ = lowering.lower(load_program(blob))
    # Real images under the loading contract: train and val rows (the locked test split stays locked).
    rows = run.rows[run.rows["split"] != "test"].reset_index(drop=True)
    (x,) = quant.image_batches(rows, run.ctx.corpus_root, spec, batch_size=len(rows))
    labels = torch.as_tensor(rows["label"].to_numpy().copy())
    return pte_program.PteForward(data, evidence.sha256_bytes(data)), program, x, labels, max_batch


@pytest.mark.slow
def test_the_pte_computes_what_the_int8_graph_computes_at_any_batch(static_pte):
    forward, program, x, labels, max_batch = static_pte
    # The program keeps the exported batch bound (the profile's ptq.max_batch), batch 1 included.
    assert forward.max_batch == max_batch and len(x) >= max_batch
    scale = _output_scale(program)
    tolerance = LOGIT_STEPS * scale
    # Real logits, not an untrained model's: the graph decides these images, with margins far above the
    # tolerance (an untrained model's near-equal logits would make the comparison below vacuous).
    full = torch.cat([program(chunk) for chunk in x.split(max_batch)])  # no call above the batch bound
    assert float((full.argmax(1) == labels).float().mean()) >= 0.9
    worst = 0.0
    for batch in sorted({1, 2, 7, 16, max_batch}):
        out, want = forward(x[:batch]), program(x[:batch])
        assert out.shape == want.shape == (batch, full.shape[1])
        steps = (out - want) / scale
        assert torch.allclose(steps, steps.round(), atol=1e-3), "the .pte's logits are off the int8 grid"
        worst = max(worst, float(steps.round().abs().max()))  # whole steps (the grid is checked above)
        assert worst <= LOGIT_STEPS, (batch, worst)
        # Top-1: a row whose margin exceeds twice the tolerance cannot swap its decision within it, and
        # those rows must be (nearly) all of them, else the agreement proves nothing.
        top2 = want.topk(2, dim=1).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * tolerance
        assert float(decided.float().mean()) >= 0.9, float(decided.float().mean())
        assert torch.equal(out.argmax(1)[decided], want.argmax(1)[decided]), batch
    print(f"largest .pte - graph logit difference: {worst:.0f} output step(s) of {scale:.4g}")


def test_the_features_output_leaves_the_logits_bit_identical(static_pte):
    forward, program, x, _, max_batch = static_pte
    featured = outputs.with_feature_output(program)
    example = torch.zeros((2, *x.shape[1:]))
    data, _, _ = lowering.lower(quant.export_dynamic(featured, example, max_batch))
    both = pte_program.PteForward(data, evidence.sha256_bytes(data))
    assert (forward.n_outputs, both.n_outputs) == (1, 2)
    for batch in sorted({1, 7, max_batch}):
        logits, features = both.outputs(x[:batch])
        assert torch.equal(logits, forward(x[:batch])), batch  # adding the output changed no logit
        want = featured(x[:batch])
        assert torch.equal(want[0], program(x[:batch]))
        check = outputs.check_features([logits, features], want, batch)
        assert check["features_dim"] == features.shape[1] and check["features_max_relative_diff"] < 0.25
    # the classifier's input, not some other tensor: exactly what the graph's final linear layer reads
    linear = next(n for n in featured.graph.nodes if str(n.target) == "aten.linear.default")

    class Capture(torch.fx.Interpreter):
        def run_node(self, n):
            if n is linear:
                self.read = self.fetch_args_kwargs_from_env(n)[0][0]
            return super().run_node(n)

    capture = Capture(featured)
    _, features = capture.run(x[:7])
    assert torch.equal(features, capture.read)


def test_a_features_output_that_did_not_lower_is_refused():
    logits, features = torch.zeros(3, 4), torch.ones(3, 8)
    assert outputs.check_features([logits, features], (logits, features), 3)["features_max_abs_diff"] == 0
    with pytest.raises(outputs.ProgramOutputError, match="did not lower"):  # not resized to the batch
        outputs.check_features([logits, torch.ones(32, 8)], (logits, features), 3)
    with pytest.raises(outputs.ProgramOutputError, match="did not lower"):  # garbage values
        outputs.check_features([logits, -features], (logits, features), 3)
    with pytest.raises(outputs.ProgramOutputError, match="returned 1 outputs"):
        outputs.check_features([logits], (logits, features), 3)


def _tampered_copy(run_dir, tmp_path, name: str):
    """A copy of the run folder, and the .pte's digest as the registry recorded it (before any change)."""
    copy_dir = tmp_path / name
    shutil.copytree(run_dir, copy_dir)
    recorded = json.loads((copy_dir / "registry.json").read_text())["artifacts"][pte_program.PTE]["sha256"]
    return copy_dir, copy_dir / pte_program.PTE, recorded


@pytest.mark.slow
def test_a_correct_pte_with_a_wrong_expected_digest_is_refused(runtime_run, tmp_path):
    run, _, record = runtime_run
    copy_dir, pte, recorded = _tampered_copy(run.run_dir, tmp_path, "wrong_digest")
    # The file is the one the chapter wrote, and with its own digest it loads and runs (the control).
    assert recorded == record["pte"]["sha256"] == evidence.sha256_file(pte)
    assert pte_program.load_verified_pte(copy_dir).sha256 == recorded
    assert pte_program.verified_pte_bytes(pte, recorded) == pte.read_bytes()
    # One change: the expected digest (a real SHA-256, of other bytes); the file is untouched.
    wrong = evidence.sha256_bytes(pte.read_bytes() + b"\0")
    with pytest.raises(pte_program.PteIntegrityError, match="modified after it was written"):
        pte_program.verified_pte_bytes(pte, wrong)
    registry = json.loads((copy_dir / "registry.json").read_text())
    registry["artifacts"][pte_program.PTE]["sha256"] = wrong
    (copy_dir / "registry.json").write_text(json.dumps(registry))
    with pytest.raises(pte_program.PteIntegrityError, match="modified after it was written"):
        pte_program.load_verified_pte(copy_dir)
    assert evidence.sha256_file(pte) == recorded  # still the correct file: the digest alone was refused


@pytest.mark.slow
def test_a_tampered_pte_with_its_recorded_digest_is_refused(runtime_run, tmp_path):
    run, _, record = runtime_run
    copy_dir, pte, recorded = _tampered_copy(run.run_dir, tmp_path, "tampered")
    assert recorded == record["pte"]["sha256"] == evidence.sha256_file(pte)  # taken before tampering
    registry_before = (copy_dir / "registry.json").read_bytes()
    # One change: a byte of the file; the expected digest stays the one recorded when it was written.
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    assert evidence.sha256_file(pte) != recorded
    with pytest.raises(pte_program.PteIntegrityError, match="modified after it was written"):
        pte_program.load_verified_pte(copy_dir)
    # The latency worker's check, handed the recorded digest (never one hashed from the tampered file).
    with pytest.raises(pte_program.PteIntegrityError, match="modified after it was written"):
        pte_program.verified_pte_bytes(pte, recorded)
    assert (copy_dir / "registry.json").read_bytes() == registry_before
    # Restoring the byte restores the file: the refusal was the tampering and nothing else.
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    assert pte_program.load_verified_pte(copy_dir).sha256 == recorded


@pytest.mark.slow
def test_a_pte_missing_from_the_registry_is_refused(runtime_run, tmp_path):
    run, _, _ = runtime_run
    copy_dir, pte, _ = _tampered_copy(run.run_dir, tmp_path, "unregistered")
    registry = json.loads((copy_dir / "registry.json").read_text())
    del registry["artifacts"][pte_program.PTE]
    (copy_dir / "registry.json").write_text(json.dumps(registry))
    with pytest.raises(pte_program.PteIntegrityError, match="not in"):
        pte_program.load_verified_pte(copy_dir)


class _FakeProgram:
    """A program's ``outputs`` on a batch: (x summed per image, x's first pixel) plus an offset, with a
    planned batch bound; a static program refuses any other batch."""

    def __init__(self, max_batch: int, static: bool = False, offset: float = 0.0) -> None:
        self.max_batch, self.static, self.offset, self.n_outputs = max_batch, static, offset, 2

    def outputs(self, batch: torch.Tensor) -> list[torch.Tensor]:
        assert len(batch) == self.max_batch if self.static else len(batch) <= self.max_batch
        per_image = batch.flatten(1).sum(1, keepdim=True)
        return [per_image * torch.tensor([1.0, 2.0, 3.0]) + self.offset, batch[:, :, 0, 0] + self.offset]


def test_a_comparison_pads_the_last_slice_of_a_static_batch_and_sees_any_difference():
    x = torch.rand(7, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    same = device.ProgramComparison(_FakeProgram(32), _FakeProgram(2, static=True))
    logits = same(x)
    assert torch.equal(logits, _FakeProgram(32).outputs(x)[0])
    assert same.record(("logits", "features")) == {
        "rows": 7, "max_abs_diff": {"logits": 0.0, "features": 0.0}, "top1_agreement": 1.0, "identical": True}
    shifted = device.ProgramComparison(_FakeProgram(32), _FakeProgram(1, static=True, offset=1e-3))
    shifted(x)
    record = shifted.record(("logits", "features"))
    assert not record["identical"] and record["max_abs_diff"]["features"] == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ValueError, match="device_batch"):
        device.device_program(torch.nn.Identity(), 8, 0)


def test_latency_ratios_and_plot():
    table = pd.DataFrame([
        {"model": ".pte", "kind": "pte", "p50_ms": 2.0, "p95_ms": 3.0, "peak_above_baseline_mib": 10.0},
        {"model": "eager", "kind": "eager", "p50_ms": 4.0, "p95_ms": 5.0, "peak_above_baseline_mib": 40.0}])
    assert latency.latency_ratios(table) == {"p50_ratio": 0.5, "p95_ratio": 0.6, "memory_ratio": 0.25}
    fig = latency.plot_latency(table)
    assert len(fig.axes) == 2
    assert np.allclose([p.get_width() for p in fig.axes[1].patches], [10.0, 40.0])


@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    from pathlib import Path

    run_dir = Path(smoke_book["run_dir"])
    record = json.loads((run_dir / "runtime/runtime.json").read_text())
    assert evidence.verify_artifact(run_dir, pte_program.PTE) == record["pte"]["sha256"]
    assert record["test"]["rows"] == len(pd.read_parquet(run_dir / runtime.TEST_RECORD))
    text = (smoke_book["book_dir"] / "07_runtime.ipynb").read_text()
    assert "Traceback" not in text and "rows decided differently" in text


@pytest.mark.slow
def test_every_default_candidate_lowers_to_a_pte_that_runs_the_default_compact_model():
    # The default compact model is a TF-padded EfficientNet-Lite; XNNPACK could not run its dynamically
    # quantised .pte at all (tomato run, chapter 7), so every declared default candidate must give a
    # program that executes at batch 1 and above.
    from cropcop_utils.core import config
    from cropcop_utils.nets.models import create_model

    profile = config.load_profile("default")
    arch = profile["training"]["compact"]["arch"]
    model = create_model(arch, 3).eval()
    example, max_batch = torch.zeros((2, 3, 64, 64)), 4
    exported = quant.export_dynamic(model, example, max_batch)
    calibration = [torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))]
    # Candidates that differ only in their calibration rows lower to the same operators: one each.
    configurations = {(c.activations, c.per_channel, c.float_modules, c.fuse_relu6): c
                      for c in quant.parse_candidates(profile["ptq"])}
    assert any(c.float_modules for c in configurations.values()), "the float-stem candidate lowers too"
    # lowered as chapter 7 lowers them (with the features output), in this process: in a 2-core suite a
    # pool would only add its workers' imports (tests/runtime/test_lowering.py tests the pool)
    graphs = {c.name: quant.quantise(exported, c, calibration, example)[0] for c in configurations.values()}
    jobs = [lowering.LoweringJob(name, quant.serialise(graph, example, max_batch), 64, max_batch)
            for name, graph in graphs.items()]
    for name, lowered in lowering.lower_all(jobs, workers=1).items():
        forward = pte_program.PteForward(lowered.data, evidence.sha256_bytes(lowered.data))
        for batch in (1, 3):
            assert forward(calibration[0][:batch]).shape == (batch, 3), (name, batch)


@pytest.mark.slow
def test_only_the_shipped_regime_gets_a_device_program(smoke_book):
    """The card sends a device to the shipped regime's program; the others are lowered for scoring only."""
    from pathlib import Path

    run = Path(smoke_book["run_dir"])
    shipped = json.loads((run / "runtime/runtime.json").read_text())
    assert shipped["device_program"]["check"]["identical"]
    assert evidence.verify_artifact(run, device.DEVICE_PTE) == shipped["device_program"]["sha256"]
    assert shipped["regimes"], "the smoke book trains two regimes side by side"
    for name, other in shipped["regimes"].items():
        record = json.loads((run / other["record"]).read_text())
        assert record["device_program"] is None and "device_program_identical" not in record["figures"]
        assert not (run / "runtime" / name / Path(device.DEVICE_PTE).name).exists()
