"""Chapter 7 — Runtime: the selected INT8 graph lowered to an ExecuTorch ``.pte`` and executed from disk.

* :mod:`.lowering` — lowering to ExecuTorch (XNNPACK), several programs side by side in worker processes;
* :mod:`.chapter` — the programs written atomically, the .pte read back through its hash
  check (:mod:`cropcop_utils.nets.pte`), the test rows scored by the file, decision-by-decision
  disagreements with the INT8 graph;
* :mod:`.latency` — batch-1 latency and peak memory, each model in a process of its own;
* :mod:`.device` — the program a device runs (a fixed small batch) and its comparison with the batched one;
* :mod:`.outputs` — the program's second output (the pooled features chapter 11 reads).
"""

from .chapter import classify_disagreement, run_chapter
from .device import DEVICE_PTE, device_text
from .lowering import lower

__all__ = ["DEVICE_PTE", "classify_disagreement", "device_text", "lower", "run_chapter"]
