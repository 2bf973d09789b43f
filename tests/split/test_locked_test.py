"""The locked test split: one logged read per model state, overrides only with a logged reason."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from train_fixtures import build_run

from cropcop_utils.core.evidence import FingerprintMismatch
from cropcop_utils.split.locked_test import ACCESS_LOG, LockedTestError, read_accesses, read_test_rows

STATE_A, STATE_B = "a" * 64, "b" * 64


@pytest.fixture()
def run_dir(tmp_path):
    return build_run(tmp_path).run_dir


def _log(run_dir) -> list[dict]:
    path = run_dir / ACCESS_LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_first_read_hands_out_the_test_rows_and_logs_it(run_dir):
    rows = read_test_rows(run_dir, STATE_A, reader="training/reference")
    split = pd.read_parquet(run_dir / "split" / "split.parquet")
    assert set(rows["row_id"]) == set(split.loc[split["split"] == "test", "row_id"])
    assert (rows["split"] == "test").all()
    (entry,) = _log(run_dir)
    assert entry["reader"] == "training/reference" and entry["model_state"] == STATE_A
    assert entry["access"] == 1 and entry["override"] is False and entry["rows"] == len(rows)


def test_a_second_read_of_the_same_state_is_refused_unless_overridden_with_a_reason(run_dir):
    read_test_rows(run_dir, STATE_A, reader="training/reference")
    with pytest.raises(LockedTestError, match="already read the locked test split"):
        read_test_rows(run_dir, STATE_A, reader="ptq")
    with pytest.raises(ValueError, match="needs a reason"):
        read_test_rows(run_dir, STATE_A, reader="ptq", override=True)
    assert len(_log(run_dir)) == 1  # refusals leave no trace of a read
    read_test_rows(run_dir, STATE_B, reader="ptq")  # another state may look once
    rows = read_test_rows(run_dir, STATE_A, reader="analysis", override=True,
                          reason="re-scored after a bug fix")
    assert len(rows) > 0
    log = read_accesses(run_dir)
    assert list(log["model_state"]) == [STATE_A, STATE_B, STATE_A]
    last = log.iloc[-1]
    assert last["override"] and last["reason"] == "re-scored after a bug fix" and last["access"] == 2
    # a read without a reason stays null beside one with a reason (a chapter record refuses NaN)
    assert log.to_dict("records")[0]["reason"] is None and log.iloc[1]["reason"] is None


def test_an_altered_split_is_never_handed_out(run_dir):
    path = run_dir / "split" / "split.parquet"
    frame = pd.read_parquet(path)
    frame.loc[0, "split"] = "test" if frame.loc[0, "split"] != "test" else "train"
    frame.to_parquet(path, index=False)
    with pytest.raises(FingerprintMismatch, match="split/split.parquet"):
        read_test_rows(run_dir, STATE_A, reader="training/reference")
    assert _log(run_dir) == []


def test_the_state_must_be_a_sha256_and_the_reader_named(run_dir):
    with pytest.raises(ValueError, match="SHA-256"):
        read_test_rows(run_dir, "best.pt", reader="training")
    with pytest.raises(ValueError, match="reader"):
        read_test_rows(run_dir, STATE_A, reader="")
