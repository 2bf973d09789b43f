"""The model card: every number rendered from a JSON file of the run, nothing typed by hand.

* :mod:`.render` — collects the chapters' records, decides the failure-mode sentences from their figures,
  renders ``templates/card.md.j2`` and writes ``field/card.md`` (chapter 10 first, chapter 11 again with
  its deployment recipe).  It reads only the run folder, so it sits below the chapters that write it.
"""

from .render import CARD, CardError, collect, failure_modes, write_card

__all__ = ["CARD", "CardError", "collect", "failure_modes", "write_card"]
