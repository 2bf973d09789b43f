"""The model card: every number rendered from a JSON file of the run, nothing typed by hand.

* :mod:`.render` — collects the chapters' records, decides the failure-mode sentences from their figures,
  renders ``templates/card.md.j2`` and writes ``field/card.md`` (chapter 10 first, chapter 11 again with
  its deployment recipe).  It reads only the run folder, so it sits below the chapters that write it.
  :func:`.render.audit_card` checks a written card strictly: the card is its JSON's render, and every
  number on it is printed from one JSON path of the run (a traced render records the path of each).
"""

from .render import CARD, CardError, audit_card, check_marks, collect, failure_modes, strip_marks, write_card

__all__ = [
    "CARD",
    "CardError",
    "audit_card",
    "check_marks",
    "collect",
    "failure_modes",
    "strip_marks",
    "write_card",
]
