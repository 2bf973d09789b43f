"""The planted relations read back from ``planted.json``: what the audit, split and probe chapters are
checked against.

:func:`planted_pairs` gives the related pairs by kind (:data:`~.planting.PAIR_KINDS`),
:func:`planted_groups` their connected groups (what a leak-free split must keep together) and
:func:`label_conflicts` the copies filed under another class.  They read a truth dict only (from
:func:`~.generator.load_truth`), so they are apart from the code that writes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .planting import PAIR_KINDS, TRANSFORMS


def planted_pairs(truth: dict[str, Any], kinds: Iterable[str] | None = None) -> set[frozenset[str]]:
    """Planted related pairs of corpus-relative paths.

    ``kinds``: any of :data:`PAIR_KINDS` (``byte_copy``, a transform, ``reshot``, ``reshot_<kind>``) or
    ``near_duplicate`` for every transform; default all.  ``reshot`` gives every pair within a re-shot
    family (root included); ``reshot_moved`` / ``_relit`` / ``_background`` give the pairs of a family's
    first photo with its re-shots of that kind.  Label-conflict copies are included under their kind.
    """
    wanted = set(PAIR_KINDS if kinds is None else kinds)
    if "near_duplicate" in wanted:
        wanted = (wanted - {"near_duplicate"}) | set(TRANSFORMS)
    unknown = wanted - set(PAIR_KINDS)
    if unknown:
        raise ValueError(
            f"unknown pair kind(s) {sorted(unknown)}; known: {', '.join(PAIR_KINDS)}, near_duplicate")
    pairs: set[frozenset[str]] = set()
    families: dict[int, list[str]] = {}
    for f in truth["files"]:
        if f["origin"] == "byte_copy" and "byte_copy" in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
        elif f["origin"] == "near_duplicate" and f["transform"] in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
        if f["family"] is not None:
            families.setdefault(f["family"], []).append(f["rel_path"])
        if f["origin"] == "reshot" and f"reshot_{f.get('reshot_kind') or 'moved'}" in wanted:
            pairs.add(frozenset((f["parent"], f["rel_path"])))
    if "reshot" in wanted:
        for members in families.values():
            pairs.update(frozenset((a, b)) for i, a in enumerate(members) for b in members[i + 1:])
    return pairs


def planted_groups(truth: dict[str, Any]) -> list[set[str]]:
    """Connected groups (size >= 2) of all planted relations: what a leak-free split must keep together."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    pairs = [tuple(pair) for pair in planted_pairs(truth)]
    names = sorted({name for pair in pairs for name in pair})
    index = {name: i for i, name in enumerate(names)}
    rows = [index[a] for a, _ in pairs]
    cols = [index[b] for _, b in pairs]
    graph = coo_matrix((np.ones(len(pairs)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(graph, directed=False)
    groups: dict[int, set[str]] = {}
    for name, label in zip(names, labels, strict=True):
        groups.setdefault(int(label), set()).add(name)
    return sorted(groups.values(), key=lambda g: sorted(g))


def label_conflicts(truth: dict[str, Any]) -> set[frozenset[str]]:
    """Pairs where a copy of an image is filed under a different class than its original."""
    return {frozenset((f["parent"], f["rel_path"])) for f in truth["files"] if f["label_conflict"]}
