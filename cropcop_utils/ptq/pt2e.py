"""The PT2E flow: calibration rows from the training split, export, quantise, serialise.

Each candidate goes through ``torch.export`` with a dynamic batch dimension, ``XNNPACKQuantizer``,
``prepare_pt2e``, calibration, ``convert_pt2e`` — and is then re-exported and serialised
(``torch.export.save``).  Calibration rows come from the training split only; :func:`assert_train_only`
checks it against the frozen split before any calibration image is opened.

Kept apart from the chapter: these steps take a model and images and give back bytes, with no run
folder involved (the runtime chapter's tests and ``bench/runtime_bench.py`` use them directly).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.config import progress_wanted
from .candidates import Candidate, PTQConfigError


class CalibrationLeak(RuntimeError):
    """A calibration row is not a training row of the frozen split (val / test must never calibrate)."""


# --------------------------------------------------------------------------- calibration rows
def calibration_order(train_rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A seeded permutation of the training rows; each static candidate takes a prefix of it.

    The prefixes are nested (the smaller set is part of the larger), so two static candidates differ in
    how many rows they saw, not in which.  The rows are sorted by ``row_id`` first so the order does not
    depend on how the frame arrived.
    """
    if "split" in train_rows and (train_rows["split"] != "train").any():
        bad = sorted(set(train_rows.loc[train_rows["split"] != "train", "split"]))
        raise CalibrationLeak(f"calibration_order was handed rows of split(s) {bad}; pass only "
                              "FrozenSplit.rows_for('train')")
    ordered = train_rows.sort_values("row_id", kind="stable").reset_index(drop=True)
    permutation = np.random.default_rng(seed).permutation(len(ordered))
    return ordered.iloc[permutation].reset_index(drop=True)


def assert_train_only(calibration: pd.DataFrame, split_rows: pd.DataFrame) -> None:
    """Raise :class:`CalibrationLeak` unless every calibration row is a training row of the frozen split."""
    split_of = dict(zip(split_rows["row_id"], split_rows["split"], strict=True))
    found = pd.Series([split_of.get(r, "absent") for r in calibration["row_id"]], dtype=object)
    if (found != "train").any():
        counts = found[found != "train"].value_counts().to_dict()
        example = calibration["row_id"].iloc[int(np.flatnonzero((found != "train").to_numpy())[0])]
        raise CalibrationLeak(f"{int((found != 'train').sum())} calibration row(s) are not training rows "
                              f"of split/split.parquet ({counts}; e.g. row_id {example}). Calibration may "
                              "only use the train split; validation and test rows never calibrate.")


# --------------------------------------------------------------------------- PT2E flow
def batch_dim(max_batch: int) -> Any:
    """The dynamic batch dimension every export uses (min 1, so a single image runs too)."""
    return torch.export.Dim("batch", min=1, max=int(max_batch))


def export_dynamic(module: torch.nn.Module, example: torch.Tensor, max_batch: int) -> Any:
    """``torch.export`` with a dynamic batch dimension; without it batched calibration/evaluation fails."""
    if example.shape[0] < 2:
        raise ValueError("export with an example batch of at least 2 rows (a batch of 1 specialises to 1)")
    return torch.export.export(module, (example,), dynamic_shapes=({0: batch_dim(max_batch)},))


def quantizer_for(candidate: Candidate) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=candidate.per_channel,
                                               is_dynamic=candidate.activations == "dynamic")
    quantizer = XNNPACKQuantizer().set_global(config)
    if candidate.float_modules:
        # XNNPACKQuantizer refuses set_module_name(name, None): its filter function keeps a module float
        inside = _module_filters(candidate.float_modules)
        quantizer.set_filter_function(lambda node: not any(f(node) for f in inside))
    return quantizer


def _module_filters(paths: tuple[str, ...]) -> list[Any]:
    """torchao's test of whether a node was traced inside a module (or a submodule of it), per path."""
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

    return [get_module_name_filter(path) for path in paths]


def check_float_modules(graph: torch.fx.GraphModule, candidate: Candidate) -> None:
    """A float module that names nothing in the model would silently quantise everything: refuse it."""
    filters = _module_filters(candidate.float_modules)
    missing = [path for path, inside in zip(candidate.float_modules, filters, strict=True)
               if not any(inside(node) for node in graph.graph.nodes)]
    if missing:
        raise PTQConfigError(f"ptq candidate {candidate.name!r}: float_modules {missing} name no module of "
                             "the exported model; use the model's attribute paths (e.g. conv_stem, bn1)")


def quantise(exported: Any, candidate: Candidate, calibration: Iterable[torch.Tensor],
             example: torch.Tensor) -> tuple[torch.fx.GraphModule, int]:
    """Prepare → calibrate → convert the float ``exported`` program (from :func:`export_dynamic`).

    Returns the converted graph and the number of rows it calibrated on.  The float program is exported
    once and deep-copied per candidate (``prepare_pt2e`` folds batch norm into the weights of the graph it
    is given).  Dynamic candidates see no image: their weight observers (the only ones that keep state)
    still need one forward pass to record each channel's range, so they get a single all-zero batch —
    weights do not depend on the input, and activation ranges are computed at run time.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = copy.deepcopy(exported.module())
    check_float_modules(graph, candidate)
    if candidate.fuse_relu6:
        split_relu6(graph)
    prepared = prepare_pt2e(graph, quantizer_for(candidate))
    seen = 0
    with torch.no_grad():
        if candidate.static:
            for batch in calibration:
                prepared(batch)
                seen += int(batch.shape[0])
            if seen == 0:
                raise ValueError(f"static candidate {candidate.name!r} got no calibration batch")
        else:
            prepared(torch.zeros((1, *example.shape[1:]), dtype=example.dtype))
    return convert_pt2e(prepared), seen


RELU6 = (torch.ops.aten.hardtanh.default, torch.ops.aten.hardtanh_.default)


def split_relu6(graph: torch.fx.GraphModule) -> int:
    """Rewrite every ReLU6 (``hardtanh(x, 0, 6)``) as ``hardtanh(relu(x), 0, 6)``, in place; returns how many.

    The float function is unchanged (relu then the clip is the clip).  What changes is what the quantizer
    sees: XNNPACKQuantizer annotates conv (+ batch norm) + relu as one pattern whose output observer sits
    after the relu, and lets a hardtanh share its input's quantisation; it has no conv + hardtanh pattern.
    Left as ReLU6, each conv's output is quantised over its negative values too (the 8 bits then span a
    range the clip throws away).  On PlantVillage tomato's compact model (runs/tomato-2, 512 calibration
    rows) this took the validation macro-F1 drop from 0.85 to 0.37 points and the top-1 agreement with the
    float model from 98.48 % to 99.15 %.
    """
    count = 0
    for node in list(graph.graph.nodes):
        if node.op == "call_function" and node.target in RELU6 and tuple(node.args[1:3]) == (0.0, 6.0):
            with graph.graph.inserting_before(node):
                relu = graph.graph.call_function(torch.ops.aten.relu.default, (node.args[0],))
            relu.meta = dict(node.meta)  # same shape, and the same module: float_modules filters still apply
            node.args = (relu, *node.args[1:])
            count += 1
    graph.graph.lint()
    graph.recompile()
    return count


UNSTABLE_META = ("from_node", "stack_trace")  # records that vary by process or install: see serialise


def serialise(graph: torch.nn.Module, example: torch.Tensor, max_batch: int) -> bytes:
    """The converted graph re-exported (dynamic batch) and saved with ``torch.export.save``, as bytes.

    Two node records are dropped, which makes the SHA-256 — the model-state identity the locked test
    counts accesses by — a function of the graph alone: provenance (``from_node``) records the Python
    ``id()`` of the graphs a node passed through, so two identical quantisations would serialise to
    different bytes; and the stack trace (``stack_trace``) names the absolute path of every source file
    the model ran through (timm and torch where they are installed), so the same graph from another
    checkout or virtual environment would too.
    """
    exported = export_dynamic(graph, example, max_batch)
    for module in exported.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                for key in UNSTABLE_META:
                    node.meta.pop(key, None)
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return buffer.getvalue()


def image_batches(rows: pd.DataFrame, corpus_root: Any, spec: Any, batch_size: int,
                  progress: bool = False, desc: str = "images") -> Iterator[torch.Tensor]:
    """Calibration batches: the rows' images under the loading contract (``data.EvalImages``), in order."""
    from tqdm import tqdm

    from ..core.squares import EvalImages

    dataset = EvalImages(rows, corpus_root, spec)
    for start in tqdm(range(0, len(dataset), batch_size), desc=desc, unit="batch",
                      disable=not progress_wanted(progress), leave=False):
        yield torch.stack([dataset[i][0] for i in range(start, min(start + batch_size, len(dataset)))])
