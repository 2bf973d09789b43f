"""The model card: a Markdown page rendered only from the run's JSON records by a Jinja2 template.

Sources (read from disk, never from memory): ``field/field.json``, ``training/training.json``,
``runtime/runtime.json``, ``split/split.json``, ``analysis/per_class.json``, and, when chapter 11 has run,
``abstention/abstention.json`` (key ``deployment``); ``registry.json`` gives each source's SHA-256.  Every
number on the card is one of these values through one of :data:`FORMATS`, so it traces to a JSON file.
Failure modes are derived by rules whose thresholds live in the profile (``field_transfer.failure_rules``) and
reach the card through ``field/field.json``; each rule is applied to each state's own figures, and a sentence
names the states whose figures fired it (the "not intended" sentence about the field is the `.pte`'s own).

Tracing (:func:`audit_card`): ``render(collect(run, traced=True), traced=True)`` renders the same card with
every value still carrying its JSON path (``(file, key, ...)``), and every printed value, through one of
:data:`FORMATS` or printed as it is, wrapped in a mark that records that path and the formatter.
:func:`audit_card` then requires the card on disk to be that render, character for character, once the
marks are removed; every mark's text to be its formatter applied to the value found at its path in the
files on disk (read again, not the data the card was rendered from); and no number outside a mark (the
``.pte`` snippet's own code constants excepted: the snippet is tested by running it).

:func:`write_card` writes ``field/card.md`` and registers it; chapter 10 calls it after its record, and a
later chapter can call it again to re-render with its own record present.
"""

from __future__ import annotations

import difflib
import json
import os
import re
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


REGISTRY = "registry.json"


class CardError(FileNotFoundError):
    """A record the card is rendered from is missing."""


# How numbers are printed; audit_card() re-applies the one a mark names to the value at its JSON path.
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


def collect(run_dir: str | os.PathLike, traced: bool = False) -> dict[str, Any]:
    """The card's data: each source record, the optional ones (None when absent), their SHA-256.

    ``traced=True`` gives the same data with every dict, list, string and number carrying its JSON path
    (:func:`audit_card`)."""
    run_dir = Path(run_dir)
    data: dict[str, Any] = {}
    for key, rel in SOURCES.items():
        path = run_dir / rel
        if not path.exists():
            raise CardError(
                f"{rel} is missing from {run_dir}: the model card is rendered from it; run the "
                "chain through chapter 'field' first"
            )
        data[key] = _load(path, rel, traced)
    for key, rel in OPTIONAL_SOURCES.items():
        path = run_dir / rel
        data[key] = _load(path, rel, traced) if path.exists() else None
    registry = read_registry(run_dir)
    rels = [*SOURCES.values(), *(r for k, r in OPTIONAL_SOURCES.items() if data[k] is not None)]
    if traced:
        at = (REGISTRY, "artifacts")
        data["sources"] = _Dict(
            {
                _traced(rel, (*at, rel), key=True): _traced(
                    registry.get(rel, {}).get("sha256"), (*at, rel, "sha256")
                )
                for rel in rels
            },
            at,
        )
    else:
        data["sources"] = {rel: registry.get(rel, {}).get("sha256") for rel in rels}
    return data


def _load(path: Path, rel: str, traced: bool) -> Any:
    obj = json.loads(path.read_text())
    return _traced(obj, (rel,)) if traced else obj


def failure_modes(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each stated rule with the states it fires for; thresholds from ``field_transfer.failure_rules``.

    A rule is applied to each state's own figures: a state fires on its figures alone, never because another
    state's did.  ``fires`` lists those states in :data:`STATE_ORDER`; ``unmeasured`` the states without the
    figures (``measured`` is false when no state has them); ``key`` names the rule for the template
    (``collapse``, ``background``, ``off_leaf``, ``paste``)."""
    field = data["field"]
    rules = field["params"]["failure_rules"]
    states = [s for s in STATE_ORDER if s in field["states"]]
    swap = field["swap"]["states"]
    occlusion = field["attribution"].get("occlusion", {})

    def value(entry: Any, *keys: str) -> Any:
        for key in keys:
            entry = (entry or {}).get(key)
        return entry

    def collapses(s: str) -> bool | None:
        field_accuracy = value(field["states"][s], "field", "accuracy", "value")
        lab_accuracy = value(field["states"][s], "lab_test_matched", "accuracy", "value")
        if field_accuracy is None or lab_accuracy is None:
            return None
        return field_accuracy < rules["collapse_ratio"] * lab_accuracy

    def at_least(figure: Any, threshold: float) -> bool | None:
        return None if figure is None else figure >= threshold

    stated = [
        (
            "collapse",
            "collapses on field images",
            "collapse_ratio",
            "field accuracy is below collapse_ratio × the same state's lab accuracy on the same classes",
            collapses,
        ),
        (
            "background",
            "leans on the background",
            "background_share",
            "the background alone explains at least this share of the lab-to-field gap",
            lambda s: at_least(value(swap.get(s), "background_share", "value"), rules["background_share"]),
        ),
        (
            "off_leaf",
            "looks off the leaf",
            "off_leaf_mass",
            "occlusion puts at least this share of its attribution outside the leaf on lab test photos",
            lambda s: at_least(value(occlusion.get(s), "lab_plain", "value"), rules["off_leaf_mass"]),
        ),
        (
            "paste",
            "cut-and-paste alone changes decisions",
            "paste_changed_rate",
            "pasting the leaf back on a plain lab backdrop changes at least this share of decisions",
            lambda s: at_least(
                value(swap.get(s), "changed", "paste_control", "rate", "value"), rules["paste_changed_rate"]
            ),
        ),
    ]
    out = []
    for key, name, threshold, rule, fires in stated:
        verdicts = {s: fires(s) for s in states}
        out.append(
            {
                "key": key,
                "name": name,
                "fires": [s for s in states if verdicts[s]],
                "unmeasured": [s for s in states if verdicts[s] is None],
                "threshold": rules[threshold],
                "rule": rule,
                "measured": any(v is not None for v in verdicts.values()),
            }
        )
    return out


def render(data: dict[str, Any], traced: bool = False) -> str:
    """The card's Markdown from the collected data (:func:`collect`).

    ``traced=True`` (with ``collect(..., traced=True)``) marks every printed value with its JSON path and
    formatter (:func:`audit_card`); :func:`strip_marks` of that text is the plain render."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        **({"finalize": _mark_value} if traced else {}),
    )
    env.filters.update({name: _marking(name, fn) for name, fn in FORMATS.items()} if traced else FORMATS)
    if traced:
        env.filters["join"] = _marking_join
    states = [s for s in STATE_ORDER if s in data["field"]["states"]]
    deployment = (data.get("abstention") or {}).get("deployment")
    failures = failure_modes(data)
    return env.get_template("card.md.j2").render(
        **data,
        state_names=states,
        failures=failures,
        failure={f["key"]: f for f in failures},
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


# --- Tracing: every printed value with the JSON path it came from -------------------------------------------
# A value of the run's JSON keeps its path through the renderer as a subclass of its type (dict, list, str,
# int, float: the template and failure_modes() see the same values and behave the same); a printed value is
# marked OPEN + {"p": path, "f": formatter, "a": args} + SEP + text + CLOSE.  None and bools carry no path:
# they print as "n/a", "yes"/"no" or words, never as a number, and a number in a mark without a path fails.
OPEN, SEP, CLOSE = "\ue000", "\ue001", "\ue002"
_MARK = re.compile(f"{OPEN}([^{SEP}]*){SEP}([^{OPEN}{CLOSE}]*){CLOSE}")
# A number: digits not inside a word or hyphenated name ("INT8", "SHA-256", "v4_conv_050" are names).
NUMBER = re.compile(r"(?<![\w.\-])-?\d+(?:\.\d+)?(?!\w)")
_SNIPPET = re.compile(r"```python\n.*?```", flags=re.S)
PATH_ATTR = "_card_json_path"


class _Dict(dict):
    def __init__(self, items: dict, path: tuple) -> None:
        super().__init__(items)
        setattr(self, PATH_ATTR, path)


class _List(list):
    def __init__(self, items: list, path: tuple) -> None:
        super().__init__(items)
        setattr(self, PATH_ATTR, path)


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


def _traced(obj: Any, path: tuple, key: bool = False) -> Any:
    """``obj`` (a JSON value) with its path; dict keys carry their own path too (printed as a key)."""
    if isinstance(obj, dict):
        return _Dict({_traced(k, (*path, k), key=True): _traced(v, (*path, k)) for k, v in obj.items()}, path)
    if isinstance(obj, list):
        return _List([_traced(v, (*path, i)) for i, v in enumerate(obj)], path)
    if obj is None or isinstance(obj, bool):
        return obj
    kind = {str: _Str, int: _Int, float: _Float}[type(obj)]
    out = kind(obj)
    setattr(out, PATH_ATTR, (*path, "<key>") if key else path)
    return out


def _path(value: Any) -> tuple | None:
    return getattr(value, PATH_ATTR, None)


def _mark(text: str, path: tuple | None, fmt: str, args: tuple = ()) -> str:
    record = json.dumps({"p": None if path is None else list(path), "f": fmt, "a": list(args)})
    return f"{OPEN}{record}{SEP}{text}{CLOSE}"


def _mark_value(value: Any) -> Any:
    """Jinja's ``finalize``: a value printed as it is (``{{ x }}``) is marked with its path."""
    import jinja2

    if isinstance(value, jinja2.Undefined):  # ``{{ x if c }}`` with c false: printed as Jinja prints it
        return value
    path = _path(value)
    if path is None:
        return value
    if path[-1] == "<key>":
        return _mark(str(value), path[:-1], "key")
    return _mark(str(value), path, "raw")


def _marking(name: str, fn: Any) -> Any:
    def marked(value: Any, *args: Any) -> str:
        return _mark(fn(value, *args), _path(value), name, args)

    return marked


def _marking_join(value: Any, d: str = "") -> str:
    return d.join(str(_mark_value(v)) for v in value)


def strip_marks(text: str) -> str:
    """The plain card from a traced render."""
    return _MARK.sub(lambda m: m.group(2), text)


def _printed(value: Any, fmt: str, args: list) -> str:
    if fmt == "raw":
        return str(value)
    return FORMATS[fmt](value, *args)


def check_marks(traced: str, files: dict[str, Any]) -> list[str]:
    """Problems in a traced render: a mark whose text is not its formatter applied to the value at its path in
    ``files`` (``{relative path: parsed JSON}``), a number in a mark without a path, a number outside any
    mark (the ``.pte`` snippet's own code excepted), or a mark left unclosed."""
    problems: list[str] = []
    for m in _MARK.finditer(traced):
        record, text = json.loads(m.group(1)), m.group(2)
        path, fmt = record["p"], record["f"]
        if path is None:
            problems += [f"{n!r} (in {text!r}) comes from no JSON path" for n in NUMBER.findall(text)]
            continue
        where = f"{path[0]}:" + ".".join(str(k) for k in path[1:])
        try:
            value: Any = files[path[0]]
            for k in path[1:-1] if fmt == "key" else path[1:]:
                value = value[k]
        except (KeyError, IndexError, TypeError):
            problems.append(f"{text!r}: path {where} is not in the run's JSON")
            continue
        if fmt == "key":
            if not (isinstance(value, dict) and path[-1] in value and text == path[-1]):
                problems.append(f"{text!r} is not the key at {where}")
            continue
        expected = _printed(value, fmt, record["a"])
        if text != expected:
            problems.append(f"{text!r} at {where} through {fmt!r} should read {expected!r}")
    residue = _MARK.sub(" ", traced)
    if OPEN in residue or SEP in residue or CLOSE in residue:
        problems.append("a mark is not closed (a value printed inside another)")
    residue = _SNIPPET.sub(" ", residue)  # the snippet's code constants (its printed values are marks)
    for line_no, line in enumerate(residue.splitlines(), 1):
        typed = NUMBER.findall(line)
        problems += [f"{n!r} on line {line_no} is typed in the template: {line.strip()!r}" for n in typed]
    return problems


def audit_card(run_dir: str | os.PathLike, text: str | None = None) -> list[str]:
    """Problems with the run's card (``field/card.md``, or ``text``); empty when every number on it maps to a
    JSON path of the run.  The card must be exactly what its JSON renders to; the render is traced
    (:func:`render` with ``traced=True``) and each mark checked against the JSON files read again from disk
    (:func:`check_marks`)."""
    run_dir = Path(run_dir)
    text = (run_dir / CARD).read_text() if text is None else text
    traced = render(collect(run_dir, traced=True), traced=True)
    problems: list[str] = []
    plain = strip_marks(traced)
    if text != plain:
        got, want = text.splitlines(), plain.splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, want, got, autojunk=False).get_opcodes():
            if tag != "equal":
                problems.append(
                    f"the card differs from its JSON's render at line {j1 + 1}: it reads {got[j1:j2]!r} "
                    f"where the render reads {want[i1:i2]!r}"
                )
    rels = [*SOURCES.values(), *(r for r in OPTIONAL_SOURCES.values() if (run_dir / r).exists()), REGISTRY]
    files = {rel: json.loads((run_dir / rel).read_text()) for rel in rels if (run_dir / rel).exists()}
    return problems + check_marks(traced, files)
