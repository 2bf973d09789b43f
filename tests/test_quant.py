"""Chapter 6 (PTQ): declaration, calibration rows, gate and selection, the PT2E flow, the chapter itself.

The chapter test builds a tiny registered run folder in the contract's schemas (a 3-class corpus of
32 px JPEGs, a frozen split that ``split.load_frozen`` accepts, a ``test_efficientnet`` trained for a few
steps as the compact checkpoint with its float prediction records) and runs :func:`quant.run_chapter` on it.
``test_runtime`` reuses the same run folder (``ptq_run``) for chapter 7.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from cropcop_utils import checkpoint, config, evidence, locked_test, predict, quant, split, taxonomy
from cropcop_utils.data import EvalImages
from cropcop_utils.evidence import Chapter
from cropcop_utils.imaging import ImageSpec

ARCH = "test_efficientnet"
SIZE = 32
CLASSES = ("apple_healthy", "apple_scab", "tomato_mites")
PER_SPLIT = {"train": 10, "val": 4, "test": 4}
OVERRIDES = {
    "image": {"size": SIZE},
    "training": {"regime": "baseline"},  # the tiny run holds one compact model, at the plain paths
    "ptq": {"candidates": [
        {"name": "dynamic_pc", "activations": "dynamic", "per_channel": True, "calibration_rows": 0},
        {"name": "static_pc_full", "activations": "static", "per_channel": True, "calibration_rows": 100},
        {"name": "static_pc_half", "activations": "static", "per_channel": True, "calibration_rows": 8}],
        # max_batch above 16: the lowering's batch >= 16 guard (runtime.lower) is exercised at the bound
        "batch_size": 8, "max_batch": 24, "bootstrap": 50},
    "runtime": {"batch_size": 8, "latency_warmup": 1, "latency_runs": 3},
}


# --------------------------------------------------------------------------- a tiny registered run
@dataclass
class TinyRun:
    ctx: config.RunContext
    rows: pd.DataFrame            # the frozen split
    compact_sha: str

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir


def _jpeg(path: Path, colour: np.ndarray, rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.clip(colour + rng.normal(0, 25, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=90)


TRAIN_STEPS = 60  # full-batch AdamW steps: enough for this colour-coded task to be learned, in seconds


def train_briefly(model: torch.nn.Module, rows: pd.DataFrame, corpus: Path, spec: ImageSpec) -> None:
    """A few full-batch AdamW steps on the training images (loading contract); leaves the model in eval."""
    images = torch.stack([image for image, _ in EvalImages(rows, corpus, spec)])
    labels = torch.as_tensor(rows["label"].to_numpy().copy(), dtype=torch.long)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimiser.step()
    # Batch-norm statistics after so few steps still lean on their initial values: set them to the
    # training set's own (cumulative average over one pass), so eval mode decides as training did.
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    with torch.no_grad():
        model(images)
    for norm in norms:
        norm.momentum = 0.1
    model.eval()


def build_tiny_run(base: Path, overrides: dict | None = None) -> TinyRun:
    """Corpus, audit and split artifacts in the contract's schemas plus the compact training outputs."""
    rng = np.random.default_rng(0)
    corpus = base / "corpus"
    records = []
    for index, name in enumerate(CLASSES):
        colour = np.array([60 + 70 * index, 180 - 50 * index, 90], dtype=float)
        for part, count in PER_SPLIT.items():
            for k in range(count):
                rel = f"{part}/{name}/{name}_{k}.jpg"
                _jpeg(corpus / rel, colour, rng)
                records.append({"rel_path": rel, "class_name": name, "split": part})
    frame = pd.DataFrame(records)
    frame["row_id"] = frame["rel_path"].map(evidence.row_id)
    frame["group_id"] = np.arange(len(frame))
    ctx = config.open_run(base / "run", profile="smoke", data=str(corpus),
                          overrides=config.deep_merge(OVERRIDES, overrides or {}))
    run_dir = ctx.run_dir
    class_map = taxonomy.build_class_map(frame["class_name"].value_counts().to_dict())
    frame["label"] = frame["class_name"].map({c["name"]: c["index"] for c in class_map["classes"]})

    corpus_ch = Chapter(run_dir, "corpus")
    corpus_ch.write_parquet("corpus/manifest.parquet", frame[["row_id", "rel_path", "class_name"]].assign(
        inherited_split=frame["split"], admitted=True, quarantine_reason=None))
    corpus_ch.write_json("corpus/class_map.json", class_map)
    audit_ch = Chapter(run_dir, "audit")
    audit_ch.write_parquet("audit/groups.parquet", frame[["row_id", "group_id"]].assign(group_size=1))
    audit_ch.write_parquet("audit/relationships.parquet", pd.DataFrame(
        {"row_id_a": pd.Series(dtype=str), "row_id_b": pd.Series(dtype=str), "kind": pd.Series(dtype=str),
         "trusted": pd.Series(dtype=bool)}))
    split_ch = Chapter(run_dir, "split")
    split_ch.write_json("split/class_map.json", class_map)
    split_ch.write_parquet("split/split.parquet",
                           frame[["row_id", "rel_path", "class_name", "label", "group_id", "split"]])
    split_ch.write_parquet("split/quarantine.parquet", pd.DataFrame(
        {c: pd.Series(dtype=str) for c in ("row_id", "rel_path", "class_name", "group_id", "reason")}))
    fingerprints = {r: evidence.sha256_file(run_dir / r) for r in split.FROZEN_FILES}
    split_ch.finish(figures={}, fingerprints=fingerprints)

    # The compact model, trained for a few steps: the chain's mechanics are under test, not its accuracy,
    # but the .pte-vs-graph proof (test_runtime) needs logits with a real spread and real decisions.
    torch.manual_seed(0)
    from cropcop_utils.models import create_model

    model = create_model(ARCH, len(CLASSES))
    spec = ImageSpec.from_section(ctx.section("image"))
    train_briefly(model, frame[frame["split"] == "train"], corpus, spec)
    train_ch = Chapter(run_dir, "training")
    sha = checkpoint.save(run_dir / quant.CHECKPOINT, {"model": model.state_dict(), "arch": ARCH,
                                                       "num_classes": len(CLASSES), "image_size": SIZE})
    assert train_ch.record_output(quant.CHECKPOINT) == sha
    cfg = predict.PredictConfig.from_ctx(ctx, batch_size=8)
    rows = frame.sort_values("row_id").reset_index(drop=True)
    train_ch.write_parquet(quant.FLOAT_VAL, predict.predict(model, rows[rows["split"] == "val"], cfg, sha))
    test_rows = locked_test.read_test_rows(run_dir, sha, reader="training/compact")
    train_ch.write_parquet(quant.FLOAT_TEST, predict.predict(model, test_rows, cfg, sha))
    train_ch.finish(figures={})
    return TinyRun(ctx=ctx, rows=rows, compact_sha=sha)


_BUILT: dict[str, tuple[TinyRun, dict, list[pd.DataFrame]]] = {}


@pytest.fixture(scope="session")
def ptq_run(tmp_path_factory) -> tuple[TinyRun, dict, list[pd.DataFrame]]:
    """The tiny run with chapter 6 executed once: (run, ptq record, every calibration batch's rows).

    ``test_runtime`` imports this fixture, which gives it a second definition; the module-level cache
    keeps the chapter from running twice in one session.
    """
    if "ptq" in _BUILT:
        return _BUILT["ptq"]
    run = build_tiny_run(tmp_path_factory.mktemp("ptq"))
    seen: list[pd.DataFrame] = []
    original = quant.image_batches

    def spy(rows, *args, **kwargs):  # every frame of rows that is turned into calibration images
        seen.append(rows.copy())
        return original(rows, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant, "image_batches", spy)
        record = quant.run_chapter(run.ctx)
    _BUILT["ptq"] = (run, record, seen)
    return _BUILT["ptq"]


# --------------------------------------------------------------------------- declaration
def test_parse_candidates_validates_the_declaration():
    good = quant.parse_candidates(OVERRIDES["ptq"])
    assert [c.name for c in good] == ["dynamic_pc", "static_pc_full", "static_pc_half"]
    assert [c.order for c in good] == [0, 1, 2]
    bad = [
        {},
        {"candidates": [{"name": "a", "activations": "dynamic", "calibration_rows": 10}]},
        {"candidates": [{"name": "a", "activations": "static", "calibration_rows": 0}]},
        {"candidates": [{"name": "a", "activations": "weird"}]},
        {"candidates": [{"name": "Bad Name", "activations": "dynamic"}]},
        {"candidates": [{"name": "a", "activations": "dynamic"}, {"name": "a", "activations": "dynamic"}]},
    ]
    for section in bad:
        with pytest.raises(quant.PTQConfigError):
            quant.parse_candidates(section)
    with pytest.raises(quant.PTQConfigError, match="max_macro_f1_drop"):
        quant.Gate.from_section({"gate": {"min_agreement": 0.9}})


def test_effective_rows_cap_at_the_train_size_and_fingerprint_ignores_the_corpus():
    candidates = quant.parse_candidates(OVERRIDES["ptq"])
    assert [c.effective_rows(30) for c in candidates] == [0, 30, 8]
    assert [c.effective_rows(1000) for c in candidates] == [0, 100, 8]
    gate = quant.Gate(0.01, 0.98)
    small, large = (quant.declaration(candidates, gate, n, 0, 16) for n in (30, 1000))
    assert small["fingerprint"] == large["fingerprint"]
    assert small["effective_calibration_rows"]["static_pc_full"] == 30
    other_gate = quant.declaration(candidates, quant.Gate(0.02, 0.98), 30, 0, 16)
    assert other_gate["fingerprint"] != small["fingerprint"]


def test_gate_boundaries_pass_and_fail():
    gate = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)
    assert gate.verdict(0.01, 0.98)[0]          # on the boundary passes
    assert gate.verdict(-0.005, 1.0)[0]         # an improvement passes
    passed, why = gate.verdict(0.0101, 0.99)
    assert not passed and "macro-F1 drop" in why
    passed, why = gate.verdict(0.0, 0.9799)
    assert not passed and "agreement" in why and "macro-F1" not in why


def test_the_gate_boundary_holds_through_the_real_subtraction():
    # Validation macro-F1 0.87 -> 0.86 is a drop of exactly 1 point, but 0.87 - 0.86 is
    # 0.010000000000000009 in floating point: compared raw, a 1-point gate would fail it.
    gate = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)
    on_boundary = quant.macro_f1_drop(0.87, 0.86)
    assert on_boundary > 0.01  # the float noise this test is about
    just_past = quant.macro_f1_drop(0.87, 0.86 - 1e-6)  # 1e-4 points past the limit
    table = quant.apply_gate(_table([("on", 0, 0, on_boundary, 0.99), ("past", 1, 0, just_past, 0.99)]), gate)
    verdicts = table.set_index("candidate")
    assert bool(verdicts.at["on", "passed"]) and "1.00 pt ≤ 1.00 pt" in verdicts.at["on", "verdict"]
    assert not bool(verdicts.at["past", "passed"]) and "macro-F1 drop" in verdicts.at["past", "verdict"]
    # Agreement is computed from predictions too, and sits on its floor the same way.
    agree = quant.agreement([1] * 49 + [0], [1] * 50)
    assert gate.verdict(on_boundary, agree)[0]
    assert not gate.verdict(on_boundary, quant.agreement([1] * 48 + [0, 0], [1] * 50))[0]
    # The precision is declared: it is part of the gate's record and of the declaration's fingerprint.
    assert quant.Gate(0.01, 0.98).points_decimals == quant.GATE_DECIMALS == 9
    coarse = quant.declaration([], quant.Gate(0.01, 0.98, points_decimals=2), 30, 0, 16)
    assert coarse["gate"]["points_decimals"] == 2
    assert coarse["fingerprint"] != quant.declaration([], gate, 30, 0, 16)["fingerprint"]
    assert quant.gate_points(on_boundary) == quant.gate_points(0.01) == 1.0


# --------------------------------------------------------------------------- selection
def _table(rows: list[tuple[str, int, int, float, float]]) -> pd.DataFrame:
    """(candidate, order, calibration_rows, macro_f1_drop, agreement) with float macro-F1 0.9."""
    columns = ["candidate", "order", "calibration_rows", "macro_f1_drop", "agreement"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.assign(macro_f1=0.9 - frame["macro_f1_drop"])


GATE = quant.Gate(max_macro_f1_drop=0.01, min_agreement=0.98)


def test_selection_is_pass_first():
    # The failing candidate has the best macro-F1 but low agreement: a passing one wins.
    table = quant.apply_gate(_table([("a", 0, 0, -0.02, 0.90), ("b", 1, 100, 0.005, 0.99),
                                     ("c", 2, 50, 0.008, 0.99)]), GATE)
    name, reason = quant.select_candidate(table)
    assert name == "b"
    assert "passed the gate" in reason
    assert list(quant.rank_candidates(table)["candidate"]) == ["b", "c", "a"]


def test_selection_is_macro_f1_first_among_passing():
    table = quant.apply_gate(_table([("a", 0, 0, 0.009, 0.999), ("b", 1, 100, 0.001, 0.981),
                                     ("c", 2, 50, 0.004, 0.995)]), GATE)
    assert quant.select_candidate(table)[0] == "b"  # lowest drop, despite the lowest agreement


def test_macro_f1_ties_go_to_fewer_calibration_rows_then_declared_order():
    tie = 0.9 - 0.003
    table = quant.apply_gate(_table([("a", 0, 100, 0.003, 0.99), ("b", 1, 50, 0.003, 0.99),
                                     ("c", 2, 50, 0.003, 0.99)]), GATE)
    table.loc[2, "macro_f1"] = tie + 1e-15  # float noise is still a tie
    name, reason = quant.select_candidate(table)
    assert name == "b"  # fewer rows than a; declared before c
    assert "tied on macro-F1" in reason and "fewer calibration rows" in reason
    assert list(quant.rank_candidates(table)["candidate"]) == ["b", "c", "a"]
    # A real macro-F1 difference beats the tie-break.
    table.loc[0, "macro_f1"] = tie + 1e-6
    assert quant.select_candidate(table)[0] == "a"


def test_when_nothing_passes_the_best_failing_candidate_is_selected_and_said_so():
    table = quant.apply_gate(_table([("a", 0, 0, 0.05, 0.90), ("b", 1, 100, 0.03, 0.80)]), GATE)
    name, reason = quant.select_candidate(table)
    assert name == "b"
    assert reason.startswith("no candidate passed the gate") and "fails:" in reason


# --------------------------------------------------------------------------- calibration rows
def _split_rows() -> pd.DataFrame:
    parts = ["train"] * 20 + ["val"] * 5 + ["test"] * 5
    return pd.DataFrame({"row_id": [f"r{i:02d}" for i in range(len(parts))], "split": parts})


def test_calibration_order_is_seeded_nested_and_train_only():
    rows = _split_rows()
    train = rows[rows["split"] == "train"]
    first = quant.calibration_order(train, seed=3)
    assert list(first["row_id"]) == list(quant.calibration_order(train.iloc[::-1], seed=3)["row_id"])
    assert list(first["row_id"]) != list(quant.calibration_order(train, seed=4)["row_id"])
    assert set(first["row_id"]) == set(train["row_id"])
    quant.assert_train_only(first.head(12), rows)
    with pytest.raises(quant.CalibrationLeak, match="rows_for"):
        quant.calibration_order(rows, seed=3)


@pytest.mark.parametrize("intruder", ["val", "test", "absent"])
def test_calibration_rows_from_val_test_or_nowhere_are_refused(intruder):
    rows = _split_rows()
    calibration = rows[rows["split"] == "train"].head(6)
    if intruder == "absent":
        calibration = pd.concat([calibration, pd.DataFrame({"row_id": ["nope"], "split": ["train"]})])
    else:
        calibration = pd.concat([calibration, rows[rows["split"] == intruder].head(1)])
    with pytest.raises(quant.CalibrationLeak, match=intruder):
        quant.assert_train_only(calibration, rows)


# --------------------------------------------------------------------------- PT2E flow on a tiny model
@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    from cropcop_utils.models import create_model

    torch.manual_seed(0)
    return create_model(ARCH, 5).eval()


def test_dynamic_and_static_candidates_quantise_what_the_tables_say(tiny_model):
    example = torch.zeros(2, 3, SIZE, SIZE)
    batches = [torch.randn(4, 3, SIZE, SIZE), torch.randn(3, 3, SIZE, SIZE)]
    dynamic, static = quant.parse_candidates({"candidates": [
        {"name": "d", "activations": "dynamic"},
        {"name": "s", "activations": "static", "calibration_rows": 7}]})
    exported = quant.export_dynamic(tiny_model, example, max_batch=8)
    graph_d, seen_d = quant.quantise(exported, dynamic, batches, example)
    graph_s, seen_s = quant.quantise(exported, static, batches, example)
    assert (seen_d, seen_s) == (0, 7)
    # The float program is left as it was (batch norm is folded in a copy), and quantising it again
    # serialises to the same bytes: a model state's SHA-256 depends on the graph alone.
    again, _ = quant.quantise(exported, dynamic, [], example)
    assert quant.serialise(again, example, 8) == quant.serialise(graph_d, example, 8)
    torch.testing.assert_close(exported.module()(example), tiny_model(example))
    ops_d, ops_s = quant.quantised_ops(graph_d).set_index("op"), quant.quantised_ops(graph_s).set_index("op")
    # Dynamic: int8 weights on conv/linear, never on depthwise convs, no activation op wrapped.
    assert ops_d.loc["linear", "int8_weights"] == 1
    assert ops_d[ops_d.index.str.startswith("conv2d depthwise")]["int8_weights"].sum() == 0
    assert ops_d.loc["silu", "quantised"] == 0
    # Static: every conv/linear weight int8, and activations are wrapped too.
    convs = ops_s[ops_s.index.str.startswith(("conv2d", "linear"))]
    assert (convs["int8_weights"] == convs["nodes"]).all()
    assert ops_s.loc["silu", "quantised"] > 0
    assert ops_s["int8_weight_params"].sum() > ops_d["int8_weight_params"].sum()
    total = sum(p.numel() for n, p in tiny_model.named_parameters() if n.endswith("weight") and p.ndim > 1)
    assert ops_s["weight_params"].sum() == total
    stored = quant.stored_bytes(graph_d).set_index("dtype")
    assert stored.loc["int8", "elements"] == ops_d["int8_weight_params"].sum()
    # Serialised and loaded back, the program computes what the converted graph computes, at any batch.
    program = quant.load_program(quant.serialise(graph_s, example, max_batch=8)).module()
    x = torch.randn(5, 3, SIZE, SIZE)
    torch.testing.assert_close(program(x), graph_s(x))
    assert program(x[:1]).shape == (1, 5)


def test_export_refuses_a_batch_of_one(tiny_model):
    with pytest.raises(ValueError, match="at least 2"):
        quant.export_dynamic(tiny_model, torch.zeros(1, 3, SIZE, SIZE), 8)


# --------------------------------------------------------------------------- the chapter
@pytest.mark.slow
def test_chapter_selects_on_validation_and_reads_test_once(ptq_run):
    run, record, seen = ptq_run
    ptq = json.loads((run.run_dir / "ptq/ptq.json").read_text())
    assert ptq == json.loads(json.dumps(record))
    table = pd.read_parquet(run.run_dir / "ptq/candidates_table.parquet")
    assert list(table["rank"]) == [1, 2, 3] and table.iloc[0]["candidate"] == record["selected"]
    assert record["reason"] and record["selection_rule"] == quant.SELECTION_RULE
    assert "conv" in record["quantizer_patterns"]["dynamic"]
    declared = json.loads((run.run_dir / "ptq/candidates.json").read_text())
    effective = {"dynamic_pc": 0, "static_pc_full": 30, "static_pc_half": 8}
    assert declared["effective_calibration_rows"] == effective
    assert record["candidates_fingerprint"] == declared["fingerprint"]
    assert record["float_val"]["reproduced_by_this_chapter"] == 1.0
    # Calibration touched train rows only: every frame turned into calibration images, and the record.
    train_ids = set(run.rows.loc[run.rows["split"] == "train", "row_id"])
    assert [len(f) for f in seen] == [30, 8]
    assert all(set(f["row_id"]) <= train_ids for f in seen)
    calibration = pd.read_parquet(run.run_dir / "ptq/calibration_rows.parquet")
    assert set(calibration["row_id"]) <= train_ids and (calibration["split"] == "train").all()
    assert calibration["used_by_static_pc_half"].sum() == 8 and not calibration["used_by_dynamic_pc"].any()
    # Validation records per candidate, each naming its own serialised graph.
    for row in table.itertuples():
        val = pd.read_parquet(run.run_dir / f"ptq/predictions_val_{row.candidate}.parquet")
        assert len(val) == 12 and (val["model_state"] == row.model_state).all()
    # The selected graph is registered, and it alone read the test split, once.
    selected_sha = evidence.verify_artifact(run.run_dir, quant.SELECTED)
    assert selected_sha == record["selected_graph"]["sha256"] == table.iloc[0]["model_state"]
    accesses = locked_test.read_accesses(run.run_dir)
    assert list(accesses["reader"]) == ["training/compact", "ptq"]
    assert accesses.iloc[1]["model_state"] == selected_sha
    test = pd.read_parquet(run.run_dir / quant.TEST_RECORD)
    assert len(test) == 12 and (test["model_state"] == selected_sha).all()
    assert record["test"]["access"] == "read"
    lo, hi = record["test"]["macro_f1_delta_lo"], record["test"]["macro_f1_delta_hi"]
    assert lo <= record["test"]["macro_f1_delta"] <= hi
    ops = pd.read_parquet(run.run_dir / "ptq/ops.parquet")
    assert set(ops["candidate"]) == set(table["candidate"])
    assert (run.run_dir / "ptq/gate.png").stat().st_size > 0


@pytest.mark.slow
def test_rerun_reuses_the_test_record_instead_of_reading_test_again(ptq_run, tmp_path):
    import shutil

    run, record, _ = ptq_run
    copy_dir = tmp_path / "rerun"
    shutil.copytree(run.run_dir, copy_dir)
    # Only the test-record step: the selected state already has its predictions.
    ch = Chapter(copy_dir, "ptq")
    program = quant.load_program((copy_dir / quant.SELECTED).read_bytes()).module()
    cfg = predict.PredictConfig.from_ctx(config.reopen_run(copy_dir), batch_size=8)
    sha = record["selected_graph"]["sha256"]
    frame, how = quant.score_locked_test(ch, quant._callable(program), sha, "ptq", cfg, False, None,
                                        quant.TEST_RECORD)
    assert how == "reused" and len(frame) == 12
    assert len(locked_test.read_accesses(copy_dir)) == 2
    # A second *read* for the same state is refused by the locked test.
    (copy_dir / quant.TEST_RECORD).unlink()
    with pytest.raises(locked_test.LockedTestError):
        quant.score_locked_test(ch, quant._callable(program), sha, "ptq", cfg, False, None, quant.TEST_RECORD)


@pytest.mark.slow
def test_the_selected_graph_loads_in_a_fresh_process(ptq_run):
    import subprocess
    import sys

    run, record, _ = ptq_run
    code = ("import sys, torch; from cropcop_utils import quant; "
            "p = quant.load_program(open(sys.argv[1], 'rb').read()).module(); "
            "print(tuple(p(torch.zeros(3, 3, 32, 32)).shape))")
    done = subprocess.run([sys.executable, "-c", code, str(run.run_dir / quant.SELECTED)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "(3, 3)"


def test_chapter_options_cannot_redeclare_candidates(tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke")
    with pytest.raises(quant.PTQConfigError, match="declared in the profile"):
        quant.ptq_params(ctx, candidates=[])
    assert quant.ptq_params(ctx)["max_batch"] >= quant.ptq_params(ctx)["batch_size"]
    for ptq in ({"max_batch": 2, "batch_size": 2}, {"max_batch": 8, "batch_size": 16}):
        small = config.open_run(tmp_path / f"run_{ptq['max_batch']}", profile="smoke", overrides={"ptq": ptq})
        with pytest.raises(quant.PTQConfigError, match="max_batch"):
            quant.ptq_params(small)


def test_plot_gate_draws_every_candidate():
    table = quant.apply_gate(_table([("a", 0, 0, 0.002, 0.99), ("b", 1, 100, 0.03, 0.90)]), GATE)
    fig = quant.plot_gate(table, GATE, "a")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["a (selected)", "b"]


@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    run_dir = Path(smoke_book["run_dir"])
    record = json.loads((run_dir / "ptq/ptq.json").read_text())
    assert record["selected"] in {c["candidate"] for c in record["candidates"]} and record["reason"]
    assert evidence.verify_artifact(run_dir, quant.SELECTED) == record["selected_graph"]["sha256"]
    text = (smoke_book["book_root"] / "book" / "06_ptq.ipynb").read_text()
    assert "Traceback" not in text and "Selected:" in text
    assert f"rounded to {record['gate']['points_decimals']} decimals" in text  # the precision, from JSON
