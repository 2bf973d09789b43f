"""The model card: a Markdown page rendered only from the run's JSON records by a Jinja2 template.

Sources (read from disk, never from memory): ``field/field.json``, ``training/training.json``,
``runtime/runtime.json``, ``split/split.json``, ``analysis/per_class.json``, and, when chapter 11 has run,
``abstention/abstention.json`` (key ``deployment``); ``registry.json`` gives each source's SHA-256.  Every
number on the card is one of these values through one of :data:`FORMATS`, so it traces to a JSON file.
Failure modes are derived by rules whose thresholds live in the profile (``field_transfer.failure_rules``) and
reach the card through ``field/field.json``.

:func:`write_card` writes ``field/card.md`` and registers it; chapter 10 calls it after its record, and a
later chapter can call it again to re-render with its own record present.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..core.evidence import atomic_write_text, read_registry, register

TEMPLATES = Path(__file__).parent / "templates"
CARD = "field/card.md"
SOURCES: dict[str, str] = {
    "field": "field/field.json",
    "training": "training/training.json",
    "runtime": "runtime/runtime.json",
    "split": "split/split.json",
    "per_class": "analysis/per_class.json",
}
OPTIONAL_SOURCES: dict[str, str] = {"abstention": "abstention/abstention.json"}
STATE_ORDER = ("reference", "compact", "int8", "pte")


class CardError(FileNotFoundError):
    """A record the card is rendered from is missing."""


# How numbers are printed; the card test renders every JSON number through each of these.
def _pct(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * float(value):.{digits}f} %"


def _ci(entry: dict[str, Any] | None, digits: int = 1) -> str:
    """``value [lo, hi]`` in percent, or ``n/a (reason)``."""
    if not entry or entry.get("value") is None:
        reason = (entry or {}).get("reason")
        return f"n/a ({reason})" if reason else "n/a"
    text = _pct(entry["value"], digits)
    if entry.get("lo") is not None:
        text += f" [{100 * entry['lo']:.{digits}f}, {100 * entry['hi']:.{digits}f}]"
    return text


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.{digits}f}"


def _share(block: dict[str, Any], name: str, digits: int = 1) -> str:
    """A share of chapter 11's deployment block: ``value [lo, hi]`` in percent, or ``n/a (reason)``."""
    value, interval = block.get(name), block.get(f"{name}_ci")
    if value is None:
        reason = (block.get("reasons") or {}).get(name)
        return f"n/a ({reason})" if reason else "n/a"
    text = _pct(value, digits)
    if interval and interval[0] is not None:
        text += f" [{_pct(interval[0], digits)}, {_pct(interval[1], digits)}]"
    return text


FORMATS = {"pct": _pct, "ci": _ci, "num": _num, "share": _share}


def collect(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The card's data: each source record, the optional ones (None when absent), their SHA-256."""
    run_dir = Path(run_dir)
    data: dict[str, Any] = {}
    for key, rel in SOURCES.items():
        path = run_dir / rel
        if not path.exists():
            raise CardError(
                f"{rel} is missing from {run_dir}: the model card is rendered from it; run the "
                "chain through chapter 'field' first"
            )
        data[key] = json.loads(path.read_text())
    for key, rel in OPTIONAL_SOURCES.items():
        path = run_dir / rel
        data[key] = json.loads(path.read_text()) if path.exists() else None
    registry = read_registry(run_dir)
    data["sources"] = {
        rel: registry.get(rel, {}).get("sha256")
        for rel in [*SOURCES.values(), *(r for k, r in OPTIONAL_SOURCES.items() if data[k] is not None)]
    }
    return data


def failure_modes(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each stated rule with the states it fires for; thresholds from ``field_transfer.failure_rules``."""
    field = data["field"]
    rules = field["params"]["failure_rules"]
    states = field["states"]
    swap = field["swap"]["states"]
    occlusion = field["attribution"].get("occlusion", {})
    out = []
    collapse = [
        s
        for s in STATE_ORDER
        if s in states
        and states[s]["field"] is not None
        and states[s]["field"]["accuracy"]["value"] is not None
        and states[s]["lab_test_matched"]["accuracy"]["value"] is not None
        and states[s]["field"]["accuracy"]["value"]
        < rules["collapse_ratio"] * states[s]["lab_test_matched"]["accuracy"]["value"]
    ]
    out.append(
        {
            "name": "collapses on field images",
            "fires": collapse,
            "threshold": rules["collapse_ratio"],
            "rule": "field accuracy is below collapse_ratio × the same state's lab accuracy on the same "
            "classes",
            "measured": field["status"] == "measured",
        }
    )
    background = [
        s
        for s in STATE_ORDER
        if s in swap
        and swap[s]["background_share"]["value"] is not None
        and swap[s]["background_share"]["value"] >= rules["background_share"]
    ]
    out.append(
        {
            "name": "leans on the background",
            "fires": background,
            "threshold": rules["background_share"],
            "rule": "the background alone explains at least this share of the lab-to-field gap",
            "measured": any(swap[s]["background_share"]["value"] is not None for s in swap),
        }
    )
    off_leaf = [
        s
        for s in STATE_ORDER
        if (occlusion.get(s) or {}).get("lab_plain")
        and occlusion[s]["lab_plain"]["value"] is not None
        and occlusion[s]["lab_plain"]["value"] >= rules["off_leaf_mass"]
    ]
    out.append(
        {
            "name": "looks off the leaf",
            "fires": off_leaf,
            "threshold": rules["off_leaf_mass"],
            "rule": "occlusion puts at least this share of its attribution outside the leaf on lab test "
            "photos",
            "measured": bool(occlusion),
        }
    )
    pasted = [
        s
        for s in STATE_ORDER
        if s in swap
        and swap[s]["changed"].get("paste_control")
        and swap[s]["changed"]["paste_control"]["rate"]["value"] is not None
        and swap[s]["changed"]["paste_control"]["rate"]["value"] >= rules["paste_changed_rate"]
    ]
    out.append(
        {
            "name": "cut-and-paste alone changes decisions",
            "fires": pasted,
            "threshold": rules["paste_changed_rate"],
            "rule": "pasting the leaf back on a plain lab backdrop changes at least this share of decisions",
            "measured": any(swap[s]["changed"].get("paste_control") for s in swap),
        }
    )
    return out


def render(data: dict[str, Any]) -> str:
    """The card's Markdown from the collected data (:func:`collect`)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FORMATS)
    states = [s for s in STATE_ORDER if s in data["field"]["states"]]
    deployment = (data.get("abstention") or {}).get("deployment")
    return env.get_template("card.md.j2").render(
        **data,
        state_names=states,
        failures=failure_modes(data),
        deployment=deployment,
        shipped_regime=data["field"].get("regime", "baseline"),
        regime_rows=regime_rows(data["field"]),
    )


def regime_rows(field: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``.pte`` of every regime the run trained, with its change against the baseline (chapter 10)."""
    out = []
    for name, entry in (field.get("regimes") or {}).items():
        pte = entry["states"]["pte"]
        change = ((field.get("comparison") or {}).get(name) or {}).get("states", {}).get("pte")
        out.append(
            {
                "name": name,
                "shipped": bool(entry["shipped"]),
                "lab_macro_f1": pte["lab_test"]["macro_f1"],
                "field_accuracy": (pte["field"] or {}).get("accuracy"),
                "field_macro_f1": (pte["field"] or {}).get("macro_f1"),
                "share": entry["swap"]["pte"]["background_share"],
                "change_field_accuracy": ((change or {}).get("field") or {}).get("accuracy"),
                "change_lab_macro_f1": (change or {}).get("lab_test", {}).get("macro_f1"),
                "change_share": (change or {}).get("background_share"),
            }
        )
    return out


def write_card(run_dir: str | os.PathLike, chapter: str = "field") -> Path:
    """Render ``field/card.md`` from the run's JSON, write it atomically and register it as ``chapter``'s.

    Chapter 10 writes the first card; chapter 11 renders it again once its deployment recipe exists.
    """
    run_dir = Path(run_dir)
    path = atomic_write_text(run_dir / CARD, render(collect(run_dir)))
    register(run_dir, CARD, chapter)
    return path
