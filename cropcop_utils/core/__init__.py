"""The ground floor: what every chapter stands on, importing nothing above it.

* :mod:`.config` — profiles, the run folder and its ``params.yaml`` (:class:`RunContext`).
* :mod:`.evidence` — a chapter's inputs and outputs, fingerprints, atomic writes, ``registry.json``.
* :mod:`.registry` — the identity table (every artifact re-hashed) and the evidence rows read from
  every chapter's record; :mod:`.summary` — the evidence summary page rendered from them.
* :mod:`.chain` — the chapters, in order (names, notebooks, records).
* :mod:`.imaging` — the loading contract (pad to square, resize, normalise); :mod:`.squares` — decoded
  squares cached once and the evaluation dataset; :mod:`.masks` — classical leaf masks (GrabCut).
* :mod:`.metrics` — accuracy, macro-F1, balanced accuracy and their bootstrap intervals.
* :mod:`.model_states` — the names of the four model states (reference, compact, INT8 graph, .pte).
* :mod:`.checkpoint` — the atomic checkpoint saver; :mod:`.distributed` — DDP helpers;
  :mod:`.cpu_tuning` — process settings for small CPUs.
"""
