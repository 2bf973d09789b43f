"""Chapter 7 — Runtime: the selected INT8 graph lowered to an ExecuTorch ``.pte`` and executed from disk.

* :mod:`.chapter` — lowering (XNNPACK), the program written atomically and read back through its hash
  check (:mod:`cropcop_utils.nets.pte`), the test rows scored by the file, decision-by-decision
  disagreements with the INT8 graph, and latency / peak memory in fresh subprocesses.
"""

from .chapter import classify_disagreement, lower, run_chapter

__all__ = ["classify_disagreement", "lower", "run_chapter"]
