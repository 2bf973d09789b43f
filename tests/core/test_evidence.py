import json

import pandas as pd
import pytest

from cropcop_utils.core import evidence
from cropcop_utils.core.evidence import Chapter, FingerprintMismatch


def test_sha256_file_matches_bytes(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"cropcop")
    assert evidence.sha256_file(path) == evidence.sha256_bytes(b"cropcop")


def test_canonical_json_ignores_key_order():
    assert evidence.sha256_json({"a": 1, "b": [1, 2]}) == evidence.sha256_json({"b": [1, 2], "a": 1})
    assert evidence.sha256_json({"a": 1}) != evidence.sha256_json({"a": 2})


def test_row_id_is_stable_and_path_sensitive():
    assert evidence.row_id("train/a/x.jpg") == evidence.row_id("train/a/x.jpg")
    assert evidence.row_id("train/a/x.jpg") != evidence.row_id("test/a/x.jpg")
    assert len(evidence.row_id("x")) == 16


def test_atomic_write_leaves_no_temp_files(tmp_path):
    evidence.atomic_write_json(tmp_path / "d" / "x.json", {"n": 1})
    evidence.atomic_write_json(tmp_path / "d" / "x.json", {"n": 2})
    assert json.loads((tmp_path / "d" / "x.json").read_text()) == {"n": 2}
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["x.json"]


def test_atomic_write_keeps_old_file_when_serialisation_fails(tmp_path):
    target = tmp_path / "x.json"
    evidence.atomic_write_json(target, {"n": 1})
    with pytest.raises(TypeError):
        evidence.atomic_write_json(target, {"n": object()})
    assert json.loads(target.read_text()) == {"n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_json_handles_numpy_values(tmp_path):
    import numpy as np

    evidence.atomic_write_json(tmp_path / "x.json", {"a": np.int64(3), "b": np.array([1.5])})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 3, "b": [1.5]}


def test_chapter_records_inputs_and_outputs(tmp_path):
    first = Chapter(tmp_path, "corpus")
    frame = pd.DataFrame({"row_id": ["a", "b"], "n": [1, 2]})
    sha = first.write_parquet("corpus/manifest.parquet", frame)
    record = first.finish({"files": 2})
    assert record["outputs"] == {"corpus/manifest.parquet": sha}

    second = Chapter(tmp_path, "audit")
    pd.testing.assert_frame_equal(second.read_parquet("corpus/manifest.parquet"), frame)
    record = second.finish({})
    assert record["inputs"] == {"corpus/manifest.parquet": sha}
    registry = evidence.read_registry(tmp_path)
    assert registry["corpus/manifest.parquet"]["chapter"] == "corpus"
    assert registry["audit/audit.json"]["chapter"] == "audit"
    assert json.loads((tmp_path / "corpus" / "corpus.json").read_text())["figures"] == {"files": 2}


def test_changed_input_is_refused_with_a_clear_message(tmp_path):
    Chapter(tmp_path, "corpus").write_json("corpus/class_map.json", {"classes": []})
    (tmp_path / "corpus" / "class_map.json").write_text('{"classes": ["tampered"]}')
    with pytest.raises(FingerprintMismatch, match="corpus/class_map.json changed since chapter 'corpus'"):
        Chapter(tmp_path, "split").read_json("corpus/class_map.json")


def test_unregistered_and_missing_inputs_are_refused(tmp_path):
    (tmp_path / "stray.json").write_text("{}")
    with pytest.raises(FingerprintMismatch, match="not in"):
        Chapter(tmp_path, "x").verify("stray.json")
    Chapter(tmp_path, "corpus").write_json("corpus/a.json", {})
    (tmp_path / "corpus" / "a.json").unlink()
    with pytest.raises(FingerprintMismatch, match="missing"):
        Chapter(tmp_path, "x").verify("corpus/a.json")


def test_verify_registry_flags_mismatches(tmp_path):
    chapter = Chapter(tmp_path, "corpus")
    chapter.write_json("corpus/a.json", {"a": 1})
    chapter.write_json("corpus/b.json", {"b": 1})
    (tmp_path / "corpus" / "b.json").write_text("{}")
    table = evidence.verify_registry(tmp_path).set_index("path")
    assert bool(table.loc["corpus/a.json", "matches"]) is True
    assert bool(table.loc["corpus/b.json", "matches"]) is False


def test_chapter_folder_override(tmp_path):
    record = Chapter(tmp_path, "per_class", folder="analysis").finish({"x": 1})
    assert record["chapter"] == "per_class"
    assert (tmp_path / "analysis" / "per_class.json").exists()


def test_a_nan_anywhere_in_a_chapter_record_fails_with_its_key_path(tmp_path):
    import numpy as np

    chapter = Chapter(tmp_path, "per_class", folder="analysis")
    figures = {"n": 3, "support_bins": [{"macro_f1_pte": 0.5}, {"macro_f1_pte": 0.4},
                                        {"macro_f1_pte": float("nan")}],
               "deep": {"values": np.array([1.0, np.inf])}}
    with pytest.raises(evidence.NonFiniteValue) as failure:
        chapter.finish(figures)
    message = str(failure.value)
    assert "figures.support_bins[2].macro_f1_pte" in message and "figures.deep.values[1]" in message
    assert "support_bins[1]" not in message
    assert not (tmp_path / "analysis" / "per_class.json").exists()


def test_atomic_write_json_names_the_key_path_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "x.json"
    evidence.atomic_write_json(target, {"a": 1})
    with pytest.raises(evidence.NonFiniteValue, match=r"a\.b\[0\]"):
        evidence.atomic_write_json(target, {"a": {"b": [float("-inf")]}})
    assert json.loads(target.read_text()) == {"a": 1}


def test_native_output_goes_to_a_registered_log(tmp_path):
    import ctypes
    import logging
    import os
    import sys

    chapter = Chapter(tmp_path, "runtime")
    libc = ctypes.CDLL(None)
    with chapter.native_output():
        os.write(2, b"[cpuinfo_utils.cpp:71] native line\n")
        libc.puts(b"from printf")
    library = logging.getLogger("a_library.module")
    console = logging.StreamHandler(sys.stderr)  # as torch sets its loggers up at import
    library.addHandler(console)
    try:
        with chapter.native_output():
            os.write(1, b"second block\n")
            library.warning("a library notice")
            sys.stderr.write("[cpuinfo_utils.cpp:")  # as ExecuTorch's bindings write, piece by piece
            sys.stderr.write("125] via sys.stderr\n")
    finally:
        library.removeHandler(console)
    assert console.stream is sys.stderr  # restored after the block
    # what a worker process caught (chapter 7's lowering) is appended to the same registered log
    chapter.add_native_output(None, b"caught in a worker\n")
    log = (tmp_path / "runtime" / "native.log").read_text()
    assert log.splitlines() == ["[cpuinfo_utils.cpp:71] native line", "from printf", "second block",
                                "a library notice", "[cpuinfo_utils.cpp:125] via sys.stderr",
                                "caught in a worker"]
    assert evidence.verify_artifact(tmp_path, "runtime/native.log") == evidence.sha256_bytes(log.encode())
    record = chapter.finish({})
    assert record["native_output"] == {"runtime/native.log": {"lines": 6, "bytes": len(log)}}
    assert "(6 lines" in evidence.native_output_note(record) and "`runtime/native.log`" in \
        evidence.native_output_note(record)
    assert evidence.native_output_note({"figures": {}}) == ""
    silent = {"native_output": {"runtime/native.log": {"lines": 5, "bytes": 9},
                                "runtime/baseline/native.log": {"lines": 0, "bytes": 0}}}
    assert "`runtime/native.log`" in evidence.native_output_note(silent)
    assert "baseline" not in evidence.native_output_note(silent)
    # chapters 6 and 7 keep each other regime's record apart: given the run folder, the note follows them
    other = tmp_path / "runtime" / "other" / "runtime.json"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text(json.dumps({"native_output": {"runtime/other/native.log": {"lines": 2, "bytes": 9}}}))
    shipped = {**record, "regimes": {"other": {"record": "runtime/other/runtime.json"}}}
    assert "runtime/other/native.log" not in evidence.native_output_note(shipped)
    assert "(2 lines" in evidence.native_output_note(shipped, tmp_path)
    assert "(6 lines" in evidence.native_output_note(shipped, tmp_path)
    assert evidence.read_registry(tmp_path)["runtime/native.log"]["sha256"] == evidence.sha256_file(
        tmp_path / "runtime" / "native.log")
