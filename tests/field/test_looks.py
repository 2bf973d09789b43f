"""Attribution figures come from the program each state names: change the program, the figure changes.

Two tiny known programs read opposite parts of an image: ``Looker(+1)`` the bright leaf, ``Looker(-1)``
the dark background.  Occlusion puts the first's mass on (and just around) the leaf, the second's off it.
A state whose figure came from any other program (the float model, say) would not move when its program
is replaced; these tests replace one state's program and require that state's figure, and only its, to
move, and that the program's own forward (the ExecuTorch method, for the .pte) ran every occlusion batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from cropcop_utils.core.evidence import Chapter, sha256_bytes
from cropcop_utils.core.imaging import ImageSpec
from cropcop_utils.field import attribution as attr
from cropcop_utils.field.looks import measure_attribution
from cropcop_utils.nets import states as state_models
from cropcop_utils.nets.states import LoadedState

SIZE, WINDOW, STRIDE, MAX_BATCH = 32, 4, 4, 8
SPEC = ImageSpec(SIZE, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
PARAMS = {
    "bootstrap": 50,
    "seed": 0,
    "ci_level": 0.95,
    "gallery_n": 1,
    "gradcam_images": 4,
    "gradcam_stage": -1,
    "gradcam_batch": 4,
    "occlusion_images": 4,
    "occlusion_window": WINDOW,
    "occlusion_stride": STRIDE,
    "occlusion_cells": ["lab_plain"],
    "batch_size": MAX_BATCH,
}
# the leaf of each photo (rows, columns); the rest of the photo is dark background
LEAVES = ((slice(8, 24), slice(8, 24)), (slice(4, 20), slice(12, 28)), (slice(12, 28), slice(2, 18)))


class Looker(nn.Module):
    """Class 0 = mean of ReLU(sign × channel sum): ``sign=+1`` reads the bright leaf, ``-1`` the dark rest."""

    def __init__(self, sign: float) -> None:
        super().__init__()
        self.stage = nn.Conv2d(3, 1, 1, bias=False)
        nn.init.constant_(self.stage.weight, sign)
        self.head = nn.Linear(1, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[0.5], [-0.5]]))
            self.head.bias.zero_()
        self.feature_info = [{"module": "stage", "num_chs": 1, "reduction": 1}]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stage(x)).mean((2, 3)))


def _leaf_set(root: Path) -> dict[str, list[dict]]:
    """Photos (bright leaf on dark ground) on disk with their native leaf masks, as ``attribution_sets``
    gives them to ``measure_attribution``."""
    items = []
    for k, (rows, cols) in enumerate(LEAVES):
        pixels = np.full((SIZE, SIZE, 3), 25, dtype=np.uint8)
        pixels[rows, cols] = 230
        mask = np.zeros((SIZE, SIZE), dtype=bool)
        mask[rows, cols] = True
        path = root / f"leaf_{k}.png"
        Image.fromarray(pixels).save(path)
        items.append({"key": f"r{k}", "path": path, "mask": mask})
    return {"lab_plain": items}


class Recorder:
    """A callable that records the size of every batch it passes on to ``forward``."""

    def __init__(self, forward) -> None:
        self.forward, self.rows = forward, []

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        self.rows.append(len(batch))
        return self.forward(batch)


def _occlusion_rows(n_images: int) -> int:
    return n_images * (attr.occlusion_windows(SIZE, WINDOW, STRIDE) + 1)  # + each image's unoccluded pass


def _preds(sets, names) -> dict:
    import pandas as pd

    keys = [item["key"] for items in sets.values() for item in items]
    return {name: pd.Series(0, index=keys) for name in names}  # class 0: what both programs score


def _float_state(name: str, model: nn.Module) -> LoadedState:
    model.eval()
    return LoadedState(name, Recorder(lambda b: model(b).detach()), f"{name}-sha", module=model)


def _floats() -> dict[str, LoadedState]:
    """The float states, both the leaf reader (Grad-CAM needs their modules; occlusion their forward)."""
    return {name: _float_state(name, Looker(1.0)) for name in ("reference", "compact")}


def _occluded(looks: dict, name: str) -> float:
    return looks["occlusion"][name]["lab_plain"]["value"]


def test_each_states_occlusion_figure_is_its_own_programs(tmp_path):
    sets = _leaf_set(tmp_path)
    n = len(sets["lab_plain"])

    def states(int8: nn.Module, pte: nn.Module) -> dict[str, LoadedState]:
        out = _floats()
        for name, model in (("int8", int8), ("pte", pte)):
            model.eval()
            out[name] = LoadedState(
                name,
                Recorder(lambda b, m=model: m(b).detach()),
                f"{name}-{id(model)}",
                max_batch=MAX_BATCH if name == "pte" else None,
            )
        return out

    shipped = states(Looker(1.0), Looker(1.0))
    looks, _ = measure_attribution(shipped, sets, _preds(sets, shipped), SPEC, PARAMS)
    # every state's occlusion ran through that state's forward, batch by batch, within its batch bound
    for name, state in shipped.items():
        assert sum(state.forward.rows) == _occlusion_rows(n), name
        assert max(state.forward.rows) <= MAX_BATCH
    assert looks["model_states"] == {name: s.sha256 for name, s in shipped.items()}

    swapped = states(Looker(1.0), Looker(-1.0))  # only the .pte's program reads the background now
    moved, _ = measure_attribution(swapped, sets, _preds(sets, swapped), SPEC, PARAMS)
    # Measured: the leaf reader puts 0.041 of its occlusion mass off the leaf (windows straddling the
    # edge), the background reader 0.986.  The other states are the same programs: the same figures.
    assert _occluded(looks, "pte") < 0.06 and _occluded(moved, "pte") > 0.97
    for name in ("reference", "compact", "int8"):
        assert _occluded(moved, name) == _occluded(looks, name), name
    assert moved["gradcam"] == looks["gradcam"]
    assert moved["model_states"]["pte"] == swapped["pte"].sha256 != looks["model_states"]["pte"]

    swapped = states(Looker(-1.0), Looker(1.0))  # the INT8 graph's program changed, the .pte's not
    moved, _ = measure_attribution(swapped, sets, _preds(sets, swapped), SPEC, PARAMS)
    assert _occluded(moved, "int8") > 0.97 and _occluded(moved, "pte") == _occluded(looks, "pte")


# --------------------------------------------------------------------------- real INT8 graph and .pte
@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[float, tuple[bytes, bytes]]:
    """Each Looker statically quantised (calibrated on the leaf photos) to an INT8 graph (the
    ``ptq/selected.pt2`` bytes) and lowered to a .pte with chapter 7's :func:`lowering.lower`."""
    from cropcop_utils import ptq as quant
    from cropcop_utils.nets.int8_graph import load_program
    from cropcop_utils.runtime import lowering

    sets = _leaf_set(tmp_path_factory.mktemp("calibration"))
    images = torch.stack([SPEC.load_tensor(item["path"]) for item in sets["lab_plain"]])
    example = images[:2]
    (candidate,) = quant.parse_candidates(
        {"candidates": [{"name": "static", "activations": "static", "calibration_rows": len(images)}]}
    )
    built = {}
    for sign in (1.0, -1.0):
        exported = quant.export_dynamic(Looker(sign).eval(), example, MAX_BATCH)
        graph, _ = quant.quantise(exported, candidate, [images], example)
        blob = quant.serialise(graph, example, MAX_BATCH)
        pte, _, _ = lowering.lower(load_program(blob))
        built[sign] = (blob, pte)
    return built


def _run_folder(root: Path, graph: bytes, pte: bytes) -> Chapter:
    """A run folder whose registry holds this INT8 graph and this .pte; the field chapter's reader."""
    for rel_path, data, chapter in (
        (state_models.STATE_FILES["int8"], graph, "ptq"),
        (state_models.STATE_FILES["pte"], pte, "runtime"),
    ):
        (root / rel_path).parent.mkdir(parents=True, exist_ok=True)
        (root / rel_path).write_bytes(data)
        Chapter(root, chapter).record_output(rel_path)
    return Chapter(root, "field")


class MethodRecorder:
    """Stands in for the .pte's ExecuTorch ``forward`` method: records each batch, then executes it."""

    def __init__(self, method) -> None:
        self.method, self.rows = method, []

    def execute(self, inputs):
        self.rows.append(len(inputs[0]))
        return self.method.execute(inputs)


@pytest.mark.slow
def test_int8_and_pte_figures_come_from_the_registered_programs(programs, tmp_path, monkeypatch):
    from cropcop_utils.nets import int8_graph

    sets = _leaf_set(tmp_path)
    n = len(sets["lab_plain"])
    graph_rows: list[int] = []
    load_executable = int8_graph.load_executable

    def recorded_graph(data: bytes):  # the INT8 graph the state loads, with every call it gets recorded
        program = load_executable(data)
        program.register_forward_pre_hook(lambda _m, args: graph_rows.append(len(args[0])))
        return program

    monkeypatch.setattr(int8_graph, "load_executable", recorded_graph)
    floats = _floats()
    measured = {}
    for sign in (1.0, -1.0):  # the same float models; the leaf's INT8 graph and .pte, then the ground's
        graph, pte = programs[sign]
        ch = _run_folder(tmp_path / f"run{sign:+.0f}", graph, pte)
        states = {**floats, **state_models.load_states(ch, 2, names=("int8", "pte"))}
        assert states["pte"].sha256 == sha256_bytes(pte) and states["int8"].sha256 == sha256_bytes(graph)
        assert states["pte"].max_batch == MAX_BATCH
        recorder = MethodRecorder(states["pte"].forward.method)
        states["pte"].forward.method = recorder
        graph_rows.clear()
        looks, _ = measure_attribution(states, sets, _preds(sets, states), SPEC, PARAMS)
        # the .pte's own method executed every occlusion batch, and the INT8 graph ran its own
        assert sum(recorder.rows) == sum(graph_rows) == _occlusion_rows(n)
        assert max(recorder.rows) <= MAX_BATCH
        assert looks["model_states"]["pte"] == sha256_bytes(pte)
        assert looks["model_states"]["int8"] == sha256_bytes(graph)
        measured[sign] = looks
    leaf, ground = measured[1.0], measured[-1.0]
    # Measured: the leaf programs put 0.039 (INT8 graph) and 0.030 (.pte) off the leaf, the float leaf
    # reader 0.041; the background programs 0.986 (both).  The float states' figures do not move, so a
    # float model standing in for either program would fail here.
    for name in ("int8", "pte"):
        assert _occluded(leaf, name) < 0.06 and _occluded(ground, name) > 0.97, name
    for name in ("reference", "compact"):
        assert _occluded(leaf, name) == _occluded(ground, name)
    assert leaf["model_states"]["pte"] != ground["model_states"]["pte"]


@pytest.mark.slow
def test_field_json_names_the_program_of_every_attribution_figure(smoke_book):
    """In the book's record, each state's attribution figures name the file they were measured on: the
    registered file of that state (the .pte chapter 7 wrote, the INT8 graph chapter 6 selected), in
    every regime."""
    import json

    from cropcop_utils.core.evidence import read_registry

    run = Path(smoke_book["run_dir"])
    facts = json.loads((run / "field/field.json").read_text())
    registry = read_registry(run)
    for name, entry in facts["regimes"].items():
        looks, states = entry["attribution"], entry["states"]
        measured = set(looks["occlusion"]) | set(looks["gradcam"])
        assert measured == set(states) == set(looks["model_states"]), name
        for state in measured:
            assert looks["model_states"][state] == states[state]["model_state"], (name, state)
        assert looks["model_states"]["pte"] in {e["sha256"] for e in registry.values()}
    shipped = facts["regimes"][facts["regime"]]["attribution"]["model_states"]
    assert facts["attribution"]["model_states"] == shipped
    assert shipped["pte"] == registry[state_models.STATE_FILES["pte"]]["sha256"]
    assert shipped["int8"] == registry[state_models.STATE_FILES["int8"]]["sha256"]
