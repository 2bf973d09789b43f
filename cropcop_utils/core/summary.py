"""The evidence summary page: the headline paragraph and the markdown rendered from the records.

``render_summary_markdown`` turns the rows of :func:`~.registry.evidence_summary` and the identity
table (:mod:`.registry`) into the book's front page (MyST), opened by a headline paragraph: one sentence
per chapter, from :data:`HEADLINE_SENTENCES` (chapter name → a function of its record).  A chapter added
to the chain adds one entry there.  Values are shown as the chapters show them (:func:`format_value`:
metrics in percent, their changes in points).  Apart from :mod:`.registry`, which reads and checks;
this module only renders.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .evidence import REGISTRY_NAME
from .registry import _read, chapter_status, check, evidence_summary, identity_table

# --------------------------------------------------------------------------- headline sentences
_METRIC_WORDS = re.compile(r"(accuracy|macro_f1|balanced_accuracy|weighted_f1|mean_recall|mean_f1|agreement"
                           r"|size_reduction)")
_CHANGE = re.compile(r"(delta|(^|\.)(lo|hi)$|_lo$|_hi$)")


def unit_of(key: str) -> str | None:
    """How the chapters show a float at this key: ``percent`` (a metric), ``points`` (a metric's change or
    its interval bound), or None (shown as recorded)."""
    if not _METRIC_WORDS.search(key):
        return None
    return "points" if _CHANGE.search(key) else "percent"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def points(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}"


def _interval(stat: dict[str, Any], show: Callable[[float | None], str] = percent) -> str:
    return f"{show(stat.get('value', stat.get('delta')))} (95 % interval {show(stat.get('lo'))} to " \
           f"{show(stat.get('hi'))})"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _corpus_sentence(r: dict[str, Any]) -> str:
    f = r["figures"]
    n = f["quarantined"]
    quarantined = (f"{n:,} {'file was' if n == 1 else 'files were'} quarantined, each with a reason" if n
                   else "none was quarantined")
    text = (f"The corpus scan saw {f['files_seen']:,} files and admitted {f['admitted']:,} images in "
            f"{f['n_classes_admitted']} classes; {quarantined}")
    if f.get("not_sampled"):
        text += (f"; {f['not_sampled']:,} were left out by the {percent(f['sample']['fraction'])} "
                 "content-hash sample (listed, not dropped)")
    return text + "."


def _audit_sentence(r: dict[str, Any]) -> str:
    f = r["figures"]
    rel, decision = f["relationships"], f.get("inherited_partition", {})
    kinds = [_count(rel["exact_bytes"], "byte-identical pair"),
             _count(rel["exact_pixels"], "pixel-identical pair"),
             _count(rel["near_trusted"], "verified near duplicate")]
    parts = ", ".join(k for k in kinds if not k.startswith("0 ")) or "none of any kind"
    text = (f"The audit found {_count(rel['trusted'], 'trusted duplicate relationship')} ({parts}), joining "
            f"{f['groups']['rows_in_multi_row_groups']:,} images into "
            f"{_count(f['groups']['multi_row_groups'], 'leakage group')}")
    crossing = decision.get("crossing_relationships", {}).get("total", 0)
    if decision.get("rejected"):
        text += (f"; {crossing:,} {'crosses' if crossing == 1 else 'cross'} the corpus's inherited "
                 f"{'/'.join(decision.get('splits', []))} partition (leakage), so that partition was "
                 "rejected")
    elif decision.get("splits"):
        text += "; none crosses the corpus's inherited partition, which was kept"
    return text + "."


def _split_sentence(r: dict[str, Any]) -> str:
    c, t = r["crossings"], r["totals"]
    text = (f"The frozen split ({t['train']:,} train, {t['val']:,} validation, {t['test']:,} locked test "
            "rows) ")
    if c["groups_across_splits"] == 0 and c["trusted_pairs_across_splits"] == 0:
        return text + ("keeps every leakage group on one side: read back from disk, no group and no trusted "
                       "pair spans two splits.")
    return text + (f"leaves {_count(c['groups_across_splits'], 'leakage group')} and "
                   f"{_count(c['trusted_pairs_across_splits'], 'trusted pair')} across splits "
                   f"({c['verdict']}).")


def _training_sentence(r: dict[str, Any]) -> str:
    m, f = r["models"], r["figures"]
    ref = m["reference"].get("test_macro_f1", f.get("reference_test_macro_f1"))
    compact = m["compact"].get("test_macro_f1", f.get("compact_test_macro_f1"))
    return (f"The float reference ({m['reference']['arch']}) reached a test macro-F1 of {percent(ref)}, the "
            f"float compact model ({m['compact']['arch']}) {percent(compact)}.")


def _ptq_sentence(r: dict[str, Any]) -> str:
    f = r["figures"]
    gate = ("passed" if f["selected_passed_gate"]
            else "did not pass (no candidate did; the best one was selected and flagged)")
    return (f"Post-training quantisation selected `{f['selected']}`, which {gate} the validation gate; from "
            f"the float compact model to the INT8 graph the test macro-F1 changed by "
            f"{points(f['test_macro_f1_delta'])} points (interval {points(f['test_macro_f1_delta_lo'])} to "
            f"{points(f['test_macro_f1_delta_hi'])}).")


def _runtime_sentence(r: dict[str, Any]) -> str:
    f = r["figures"]
    return (f"The `.pte` program ({f['pte_mib']:.2f} MiB, {percent(f['size_reduction'])} smaller than the "
            f"float state) agrees with the INT8 graph on {percent(f['test_agreement_with_int8_graph'])} of "
            f"the locked test rows ({_count(f['test_disagreements'], 'row')} decided differently).")


def _per_class_sentence(r: dict[str, Any]) -> str:
    f = r["figures"]
    ref, pte = f["states"]["reference"]["macro_f1"], f["states"]["pte"]["macro_f1"]
    change = f["paired"]["reference_to_pte"]["macro_f1"]
    verdict = "excludes zero" if change["excludes_zero"] else "spans zero"
    return (f"On the same {f['n_test_rows']:,} locked test rows the float reference scored macro-F1 "
            f"{_interval(ref)} and the `.pte` on its runtime {_interval(pte)}: a paired change of "
            f"{points(change['delta'])} points (interval {points(change['lo'])} to {points(change['hi'])}, "
            f"which {verdict}).")


def _fruit_slice_sentence(r: dict[str, Any]) -> str | None:
    f = r["figures"]
    change = f["slice"].get("paired", {}).get("reference_to_pte")
    if not change:
        return "The fruit-label slice selects no class with test rows in this run (exploratory)."
    recall = change["mean_recall"]
    return (f"Exploratory: the fruit-label slice ({f['slice']['classes']} classes) changed its mean recall "
            f"by {points(recall['delta'])} points from the reference to the `.pte` (interval "
            f"{points(recall['lo'])} to {points(recall['hi'])}).")


def _field_sentence(r: dict[str, Any]) -> str:
    if r["status"] != "measured":
        return f"Field transfer was not measured: {r['reason']}."
    f = r["figures"]
    text = (f"Outside the lab, the `.pte` classified {percent(f['pte_field_accuracy'])} of the field "
            f"photographs correctly, against {percent(f['pte_lab_accuracy'])} of the lab test images of "
            "the same classes")
    share = f["pte_background_share"]
    if share is not None:
        text += f"; swapping only the background explains {percent(share)} of that gap"
    return text + "."


def _abstention_sentence(r: dict[str, Any]) -> str:
    d = r["deployment"]
    lab = d["lab_test"]
    text = (f"Calibrated (T = {d['temperature']:.2f}) and asked to abstain for a {percent(d['target_risk'])} "
            f"target risk, the `.pte` accepts {percent(lab['coverage'])} of the locked test images with a "
            f"selective risk of {percent(lab['selective_risk'])}")
    if d["field"] is not None:
        text += (f", abstains on {percent(d['field']['abstained_share'])} of the field photographs "
                 f"(accuracy on the rest {percent(d['field']['accuracy_accepted'])})")
    return text + f", and rejects {percent(d['out_of_scope']['rejection_rate'])} of the out-of-scope images."


# chapter name -> the sentence of its main finding (a chapter added to the chain adds one line here)
HEADLINE_SENTENCES: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "corpus": _corpus_sentence,
    "audit": _audit_sentence,
    "split": _split_sentence,
    "training": _training_sentence,
    "ptq": _ptq_sentence,
    "runtime": _runtime_sentence,
    "per_class": _per_class_sentence,
    "fruit_slice": _fruit_slice_sentence,
    "field": _field_sentence,
    "abstention": _abstention_sentence,
}


def headline_paragraph(run_dir: str | os.PathLike) -> str:
    """One sentence per chapter that ran, rendered from its record.  A record that lacks a key its
    sentence needs (an older run folder) is named instead of guessed."""
    run_dir = Path(run_dir)
    sentences = []
    for spec in chapter_status(run_dir).itertuples():
        sentence_of = HEADLINE_SENTENCES.get(spec.chapter)
        if not spec.ran or sentence_of is None:
            continue
        try:
            sentence = sentence_of(_read(run_dir, spec.record))
        except (KeyError, TypeError) as missing:
            sentence = f"({spec.title}: its record lacks {missing} for a headline; see its chapter.)"
        if sentence:
            sentences.append(sentence)
    return " ".join(sentences)


# --------------------------------------------------------------------------- markdown
_ESCAPE = re.compile(r"([\\`*_{}\[\]<>()#+!|$~])")


def _md(text: Any) -> str:
    """Plain text safe inside a MyST table cell (no roles, links, math or column breaks)."""
    return _ESCAPE.sub(r"\\\1", str(text)).replace("\n", " ")


def _code(text: Any) -> str:
    """A path or JSON key as inline code (escaped text where a backtick or pipe would break the span)."""
    text = str(text)
    return _md(text) if "`" in text or "|" in text else f"`{text}`"


_BREAK_AFTER = re.compile(r"([./\[])")


def _wrapping_code(text: Any, every: int | None = None) -> str:
    """Inline code that may wrap in a narrow table cell: a line-break opportunity (``<wbr>``) after each
    ``.``, ``/`` and ``[`` of a key or path, or every ``every`` characters of a digest, so a long
    JSON key wraps at its parts instead of being cut off or split mid-word."""
    escaped = html.escape(str(text))
    if every:
        broken = "<wbr>".join(escaped[i:i + every] for i in range(0, len(escaped), every))
    else:
        broken = _BREAK_AFTER.sub(r"\1<wbr>", escaped)
    return f'<code class="docutils literal notranslate">{broken.replace("|", "&#124;")}</code>'


def format_value(value: Any, key: str = "") -> str:
    """A recorded value as the chapters show it: metrics in percent, their changes in points."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        unit = unit_of(key)
        if unit == "percent":
            return f"{100 * value:.2f} %"
        if unit == "points":
            return f"{100 * value:+.2f} points"
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    return _md(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def render_summary_markdown(run_dir: str | os.PathLike) -> str:
    """The evidence summary page (MyST, one ``#`` heading).  Copes with a partial run.

    Re-hashes the registry first: a run folder whose artifacts changed gets no summary
    (:class:`RegistryMismatch`).
    """
    run_dir = Path(run_dir)
    identity = check(run_dir) if (run_dir / REGISTRY_NAME).exists() else identity_table(run_dir)
    status = chapter_status(run_dir)
    rows = evidence_summary(run_dir)
    ran = status[status["ran"]]
    missing = status[~status["ran"]]
    headline = headline_paragraph(run_dir)
    lines = ["# Evidence summary", ""]
    if headline:
        lines += [headline, ""]
    lines += ["Every number on this page is read, when the book is built, from a JSON record in the run "
              "folder; the file and the JSON key beside each number say where it comes from. Metrics are "
              "shown in percent and their changes in points (the JSON holds fractions). Before the page is "
              "written every registered artifact is re-hashed; a file that differs from what its chapter "
              "recorded stops the build.", ""]
    lines += ["## Chapters in this run", ""]
    lines += _table(["Chapter", "Record", "Status"],
                    [[_md(r.title), _code(r.record), "ran" if r.ran else "did not run"]
                     for r in status.itertuples()])
    if len(missing):
        lines += [f"Chapters that did not run in this run folder: {_md(', '.join(missing['title']))}. "
                  "Their numbers are absent from this page, not estimated.", ""]
    if ran.empty:
        lines += ["No chapter has written a record yet.", ""]
    headline_rows = [r for r in rows if r["headline"]]
    lines += ["## Headline results", ""]
    if headline_rows:
        lines += _table(["Claim", "Value", "Source file", "JSON key"],
                        [[_md(r["claim"]), format_value(r["value"], r["key"]), _wrapping_code(r["source"]),
                          _wrapping_code(r["key"])] for r in headline_rows])
    else:
        lines += ["None of the headline keys exist in this run's records.", ""]
    lines += ["## Every recorded figure", ""]
    for record in ran.itertuples():
        own = [r for r in rows if r["source"] == record.record and not r["headline"]]
        if not own:
            continue
        lines += [f"### {_md(record.title)}", "", f"Source file: {_code(record.record)}", ""]
        lines += _table(["JSON key", "Value"],
                        [[_wrapping_code(r["key"]), format_value(r["value"], r["key"])] for r in own])
    lines += ["## Artifact identity", "",
              f"{len(identity)} artifacts registered in registry.json, each re-hashed from disk when this "
              "page was built.", ""]
    if len(identity):
        lines += _table(["Artifact", "Kind", "Written by", "Bytes", "SHA-256"],
                        [[_wrapping_code(r.path), _md(r.kind), _md(r.chapter), f"{int(r.bytes):,}",
                          _wrapping_code(r.sha256, every=16)]
                         for r in identity.itertuples()])
    return "\n".join(lines).rstrip() + "\n"
