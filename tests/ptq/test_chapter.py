"""Chapter 6 (PTQ): the chapter itself, on the tiny registered run of ``ptq_fixtures`` and in the smoke book.

The chapter test runs :func:`quant.run_chapter` on the tiny run folder (``ptq_run``, shared with
``tests/runtime/test_chapter.py`` for chapter 7).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from ptq_fixtures import ptq_run  # noqa: F401  (the shared fixture: chapter 6 on the tiny run)

from cropcop_utils import ptq as quant
from cropcop_utils.core import config, evidence
from cropcop_utils.core.evidence import Chapter
from cropcop_utils.nets import int8_graph, predict
from cropcop_utils.ptq.chapter import _callable
from cropcop_utils.split import locked_test


# --------------------------------------------------------------------------- the chapter
@pytest.mark.slow
def test_chapter_selects_on_validation_and_reads_test_once(ptq_run):  # noqa: F811
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
def test_rerun_reuses_the_test_record_instead_of_reading_test_again(ptq_run, tmp_path):  # noqa: F811
    import shutil

    run, record, _ = ptq_run
    copy_dir = tmp_path / "rerun"
    shutil.copytree(run.run_dir, copy_dir)
    # Only the test-record step: the selected state already has its predictions.
    ch = Chapter(copy_dir, "ptq")
    program = int8_graph.load_program((copy_dir / quant.SELECTED).read_bytes()).module()
    cfg = predict.PredictConfig.from_ctx(config.reopen_run(copy_dir), batch_size=8)
    sha = record["selected_graph"]["sha256"]
    frame, how = quant.score_locked_test(ch, _callable(program), sha, "ptq", cfg, False, None,
                                        quant.TEST_RECORD)
    assert how == "reused" and len(frame) == 12
    assert len(locked_test.read_accesses(copy_dir)) == 2
    # A second *read* for the same state is refused by the locked test.
    (copy_dir / quant.TEST_RECORD).unlink()
    with pytest.raises(locked_test.LockedTestError):
        quant.score_locked_test(ch, _callable(program), sha, "ptq", cfg, False, None, quant.TEST_RECORD)


@pytest.mark.slow
def test_the_selected_graph_loads_in_a_fresh_process(ptq_run):  # noqa: F811
    import subprocess
    import sys

    run, record, _ = ptq_run
    code = ("import sys, torch; from cropcop_utils.nets.int8_graph import load_program; "
            "p = load_program(open(sys.argv[1], 'rb').read()).module(); "
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



@pytest.mark.slow
def test_notebook_runs_headless(smoke_book):
    run_dir = Path(smoke_book["run_dir"])
    record = json.loads((run_dir / "ptq/ptq.json").read_text())
    assert record["selected"] in {c["candidate"] for c in record["candidates"]} and record["reason"]
    assert evidence.verify_artifact(run_dir, quant.SELECTED) == record["selected_graph"]["sha256"]
    text = (smoke_book["book_dir"] / "06_ptq.ipynb").read_text()
    assert "Traceback" not in text and "Selected:" in text
    assert f"rounded to {record['gate']['points_decimals']} decimals" in text  # the precision, from JSON
