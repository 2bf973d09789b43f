"""Chapter 7's lowering: several programs side by side in worker processes give the bytes the chapter's
own process gives, the device program among them."""

from __future__ import annotations

import pytest
import torch

from cropcop_utils import ptq as quant
from cropcop_utils.core import evidence
from cropcop_utils.nets.pte import PteForward
from cropcop_utils.runtime import lowering

SIZE = 16


class _Tiny(torch.nn.Module):
    """A conv, a pooled feature vector and a linear head: lowers in about a second."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def selected_graph() -> bytes:
    """A tiny model statically quantised and serialised as chapter 6 writes ``ptq/selected.pt2``."""
    torch.manual_seed(0)
    example = torch.zeros(2, 3, SIZE, SIZE)
    (candidate,) = quant.parse_candidates({"candidates": [
        {"name": "s", "activations": "static", "calibration_rows": 8}]})
    calibration = [torch.rand(8, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))]
    exported = quant.export_dynamic(_Tiny().eval(), example, 8)
    graph, _ = quant.quantise(exported, candidate, calibration, example)
    return quant.serialise(graph, example, 8)


def test_workers_lower_the_bytes_this_process_lowers(selected_graph):
    jobs = [lowering.LoweringJob("shipped", selected_graph, SIZE, 8),
            lowering.LoweringJob("shipped/device", selected_graph, SIZE, 8, device_batch=1)]
    here = lowering.lower_all(jobs, workers=1)
    pooled = lowering.lower_all(jobs, workers=2)
    assert list(pooled) == ["shipped", "shipped/device"]
    for key in here:
        assert pooled[key].data == here[key].data, key
        assert pooled[key].summary == here[key].summary
        assert pooled[key].delegation.equals(here[key].delegation)
        assert pooled[key].seconds > 0
    batched, device = (PteForward(pooled[k].data, evidence.sha256_bytes(pooled[k].data)) for k in pooled)
    assert (batched.max_batch, device.max_batch) == (8, 1)
    x = torch.rand(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    logits, features = batched.outputs(x)  # the features output is added, as chapter 11 reads it
    assert logits.shape == (3, 5) and features.shape[0] == 3
    assert torch.equal(device.outputs(x[:1])[0], logits[:1])


def test_jobs_need_distinct_keys_and_a_worker(selected_graph):
    job = lowering.LoweringJob("shipped", selected_graph, SIZE, 8)
    with pytest.raises(ValueError, match="distinct keys"):
        lowering.lower_all([job, job], workers=2)
    with pytest.raises(ValueError, match="runtime.workers must be >= 1"):
        lowering.lower_all([job], workers=0)
