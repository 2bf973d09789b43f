"""The synthetic generator's errors: one base class, so a caller can catch any of them.

Separate so that :mod:`.plan` (bad parameters) and :mod:`.generator` (a corpus or truth it cannot
prove it wrote) raise from one family without importing each other.
"""

from __future__ import annotations


class SyntheticError(RuntimeError):
    """Base class of the generator's errors."""


class SyntheticParamsError(SyntheticError, ValueError):
    """The ``synthetic`` profile section has an unknown key or an out-of-range value."""


class SyntheticCorpusConflict(SyntheticError):
    """``corpus/`` exists but cannot be proven to be a complete corpus written by this generator."""


class SyntheticTruthError(SyntheticError):
    """``planted.json`` is missing or is not this generator's ground truth."""
