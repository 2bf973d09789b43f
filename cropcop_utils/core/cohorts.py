"""The run's field folders as given on the command line: ``--field`` once or more (the scored cohorts),
``--field-train`` at most once, each optionally as ``SOURCE=PATH``.

A *source* names where photographs come from (``plantpathology2021=../shared/data/field-apple``): a
cohort from the same source as the field-train photos is *in-source* (the model was adapted to that
source, perhaps to those very trees), one from another source is *cross-source*.  Nothing in an image
folder says which source it is, so the user declares it; where nobody did, chapter 10 says so and shows
the audit's evidence (cohort photos related to field-train photos) instead of guessing.

Recorded in ``params.yaml``: ``field`` stays one string when one cohort is given (so run folders made
before several cohorts existed keep their fingerprint) and becomes a list with several;
``field_sources`` (``{recorded folder: source}``) is present only when some source was declared.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SYNTHETIC = "synthetic"
_SOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# The relation of a scored cohort to what the model was adapted to (chapter 10, the card).
IN_SOURCE = "in-source"
CROSS_SOURCE = "cross-source"
UNDECLARED = "source undeclared"
NOT_ADAPTED = "zero-shot (no field-train photos)"


@dataclass(frozen=True)
class FieldCohort:
    """One scored cohort: its short name (unique in the run), its folder as recorded, its source."""

    name: str
    folder: str            # an absolute path, or "synthetic"
    source: str | None
    primary: bool          # the first --field: the cohort attribution, swaps, the curve and chapter 11 use

    @property
    def row_prefix(self) -> str:
        """Prefix of the cohort's row ids (``row_id("<prefix>/<rel_path>")``): ``field`` for the primary
        cohort, as before several existed; ``field@<name>`` for the others, so two cohorts holding the same
        file names never share a row id (chapter 2 audits them together)."""
        return "field" if self.primary else f"field@{self.name}"


def split_source(value: str | os.PathLike) -> tuple[str | None, str]:
    """``"SOURCE=PATH"`` -> ``(SOURCE, PATH)``; a plain path (or one that exists with its ``=``) -> ``(None,
    value)``."""
    text = str(value)
    head, sep, tail = text.partition("=")
    if not sep or Path(text).expanduser().exists() or not _SOURCE.match(head) or not tail:
        return None, text
    return head, tail


def as_list(field: str | os.PathLike | list | tuple | None) -> list[str]:
    """``--field`` given once (a string) or several times (a list) as a list of strings."""
    if field is None:
        return []
    if isinstance(field, (list, tuple)):
        return [str(f) for f in field]
    return [str(field)]


def cohort_names(folders: list[str]) -> list[str]:
    """Short names: the folder's own name (``synthetic`` for the generated cohort), suffixed ``-2``, ``-3``
    where two folders share one."""
    names: list[str] = []
    for folder in folders:
        base = SYNTHETIC if folder == SYNTHETIC else Path(folder).name
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names


def field_cohorts(field: str | list | None, sources: dict[str, str] | None) -> list[FieldCohort]:
    folders = as_list(field)
    sources = sources or {}
    return [FieldCohort(name, folder, sources.get(folder), k == 0)
            for k, (name, folder) in enumerate(zip(cohort_names(folders), folders, strict=True))]


def relation(cohort_source: str | None, train_source: str | None, has_field_train: bool) -> str:
    """What a cohort is to the adapted model: in-source, cross-source, undeclared, or (no field-train
    folder) every cohort is scored zero-shot."""
    if not has_field_train:
        return NOT_ADAPTED
    if cohort_source is None or train_source is None:
        return UNDECLARED
    return IN_SOURCE if cohort_source == train_source else CROSS_SOURCE
