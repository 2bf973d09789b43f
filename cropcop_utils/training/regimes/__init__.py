"""Training regimes: which ones a run trains, which one ships, and where each regime's files live.

A regime is a way of training the same pair of models (``baseline``: the lab photos as they are;
``background_robust``: lab leaves cut out and pasted on other backgrounds, :mod:`.backgrounds`;
``field_adapted``: the lab photos plus the labelled field photos of ``--field-train``, trained on lab train +
field train rows and selected on lab val + field val, :attr:`Regime.uses_field_train`).  A run
trains the regimes its profile lists (``training.regime``: one name or a list) and every chapter after
training scores each of them, so the book compares regimes on the same rows.

Where files live: the *shipped* regime (``training.shipped_regime``; by default the last one listed)
keeps the chain's plain paths (``training/compact/best.pt``, ``runtime/model.pte``, ``field/field.json``),
so every chapter, the model card and the explorer describe what ships without knowing about regimes.
Every other regime writes the same files one folder deeper, under its chapter's folder:
``training/baseline/compact/best.pt``, ``ptq/baseline/selected.pt2``, ``runtime/baseline/model.pte``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BASELINE = "baseline"
BACKGROUND_ROBUST = "background_robust"
FIELD_ADAPTED = "field_adapted"
KNOWN: tuple[str, ...] = (BASELINE, BACKGROUND_ROBUST, FIELD_ADAPTED)


class RegimeConfigError(ValueError):
    """The profile names an unknown regime, lists one twice, or ships one it does not train."""


@dataclass(frozen=True)
class Regime:
    """One regime of a run: its name and whether it ships (and so owns the plain paths)."""

    name: str
    shipped: bool

    @property
    def uses_field_train(self) -> bool:
        """Whether the regime trains and selects on the field-train rows besides the lab rows."""
        return self.name == FIELD_ADAPTED

    def path(self, rel_path: str) -> str:
        """``rel_path`` of the shipped regime, moved under ``<chapter folder>/<regime>/`` for the others."""
        if self.shipped:
            return rel_path
        head, sep, tail = rel_path.partition("/")
        if not sep:
            raise ValueError(f"{rel_path!r} is not inside a chapter folder")
        return f"{head}/{self.name}/{tail}"

    def folder(self, chapter_folder: str) -> str:
        """The folder a chapter writes this regime's record into."""
        return chapter_folder if self.shipped else f"{chapter_folder}/{self.name}"


def regime_names(training: dict[str, Any]) -> list[str]:
    """The regimes a ``training`` section lists, in order (default: the baseline alone)."""
    listed = training.get("regime", BASELINE)
    names = [listed] if isinstance(listed, str) else list(listed or [])
    if not names:
        raise RegimeConfigError(f"training.regime lists no regime; give one or more of {list(KNOWN)}")
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise RegimeConfigError(f"training.regime: unknown regime(s) {unknown}; known: {list(KNOWN)}")
    if len(set(names)) != len(names):
        raise RegimeConfigError(f"training.regime lists a regime twice: {names}")
    return names


def regimes(training: dict[str, Any]) -> list[Regime]:
    """Every regime of the run, the shipped one last (so a chapter finishes on the plain paths)."""
    names = regime_names(training)
    shipped = training.get("shipped_regime") or names[-1]
    if shipped not in names:
        raise RegimeConfigError(f"training.shipped_regime {shipped!r} is not trained; training.regime "
                                f"lists {names}")
    return [Regime(n, False) for n in names if n != shipped] + [Regime(shipped, True)]


def of_run(ctx: Any) -> list[Regime]:
    """The regimes of an open run (``RunContext``); ``field_adapted`` needs the run's ``--field-train``."""
    items = regimes(ctx.section("training"))
    if any(r.uses_field_train for r in items) and getattr(ctx, "field_train", None) is None:
        raise RegimeConfigError(f"training.regime lists {FIELD_ADAPTED}, which trains on labelled field "
                                "photos, but the run has no field-train folder: give --field-train PATH "
                                "(make book FIELD_TRAIN=PATH) or drop the regime")
    return items


def shipped(items: Sequence[Regime]) -> Regime:
    return next(r for r in items if r.shipped)


def reference_regime(items: Sequence[Regime]) -> Regime | None:
    """What the other regimes are compared against: the baseline, when the run trains it."""
    return next((r for r in items if r.name == BASELINE), None)
