"""The study's identity table and the evidence summary page.

``identity_table`` re-hashes every artifact in ``registry.json`` from disk (bytes, SHA-256, the chapter
that wrote it); ``check`` raises :class:`RegistryMismatch` when any differs.  ``evidence_summary``
reads the chapters' JSON records and returns one row per number with the file and the JSON key it
came from; ``render_summary_markdown`` turns that into the book's front page (MyST), opened by a
headline paragraph: one sentence per chapter, from :data:`HEADLINE_SENTENCES` (chapter name → a
function of its record).  A chapter added to the chain adds one entry there.  Keys a record does not
have are skipped, never filled in.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from .chain import CHAPTERS
from .evidence import REGISTRY_NAME, FingerprintMismatch, verify_registry


class RegistryMismatch(FingerprintMismatch):
    """A registered artifact is missing or its bytes / SHA-256 differ from what its chapter recorded."""


# --------------------------------------------------------------------------- identity table
_KINDS: tuple[tuple[str, str], ...] = (
    (r"^corpus/manifest\.parquet$", "manifest"),
    (r"(^|/)class_map\.json$", "class map"),
    (r"^audit/relationships\.parquet$", "relationships"),
    (r"^audit/groups\.parquet$", "groups"),
    (r"^audit/hashes\.parquet$", "perceptual hashes"),
    (r"^split/split\.parquet$", "split"),
    (r"quarantine\.parquet$", "quarantine"),
    (r"(^|/)predictions_[^/]*\.parquet$", "prediction records"),
    (r"\.pte$", "runtime program (.pte)"),
    (r"\.pt2$", "converted graph"),
    (r"\.(pt|pth|ckpt|safetensors)$", "checkpoint"),
    (r"\.json$", "metrics JSON"),
    (r"\.png$", "figure"),
    (r"\.parquet$", "table"),
)
IDENTITY_COLUMNS = ["path", "kind", "chapter", "bytes", "sha256", "found_bytes", "found_sha256", "matches"]


def artifact_kind(rel_path: str) -> str:
    for pattern, kind in _KINDS:
        if re.search(pattern, rel_path):
            return kind
    return "other"


def identity_table(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Every registered artifact re-hashed from disk: recorded vs found bytes and SHA-256."""
    table = verify_registry(run_dir)
    if table.empty:
        return pd.DataFrame(columns=IDENTITY_COLUMNS)
    found_bytes = [(Path(run_dir) / p).stat().st_size if (Path(run_dir) / p).exists() else None
                   for p in table["path"]]
    table = table.assign(kind=[artifact_kind(p) for p in table["path"]],
                         found_bytes=pd.array(found_bytes, dtype="Int64"))
    table["matches"] = table["matches"] & (table["found_bytes"] == table["bytes"]).fillna(False)
    return table[IDENTITY_COLUMNS].sort_values("path", kind="stable").reset_index(drop=True)


def check(run_dir: str | os.PathLike) -> pd.DataFrame:
    """The identity table, or :class:`RegistryMismatch` naming every artifact that no longer matches."""
    run_dir = Path(run_dir)
    if not (run_dir / REGISTRY_NAME).exists():
        raise RegistryMismatch(f"{run_dir / REGISTRY_NAME} is missing: no chapter has registered an artifact "
                               "in this run folder; run the chain from chapter 01.")
    table = identity_table(run_dir)
    bad = table[~table["matches"].astype(bool)]
    if len(bad):
        details = "; ".join(
            f"{r.path} (written by '{r.chapter}'): "
            + ("missing" if pd.isna(r.found_sha256) else
               f"recorded {r.bytes} bytes / SHA-256 {r.sha256[:16]}…, found {r.found_bytes} bytes / "
               f"{r.found_sha256[:16]}…")
            for r in bad.head(10).itertuples())
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise RegistryMismatch(
            f"{len(bad)} of {len(table)} registered artifacts in {run_dir} no longer match registry.json: "
            f"{details}{more}. The evidence is not what its chapters wrote; rerun the chapters named "
            "(and those after them) or restore the files.")
    return table


# --------------------------------------------------------------------------- evidence summary
# Curated headline numbers: (record path, dotted JSON key, claim).  A key a record lacks is skipped.
_PAIR = "figures.paired.reference_to_pte"
_PROBE = "figures.class_probes.frozen_linear.test"
HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("corpus/corpus.json", "figures.files_seen", "files seen in the corpus folder"),
    ("corpus/corpus.json", "figures.admitted", "images admitted"),
    ("corpus/corpus.json", "figures.quarantined", "files quarantined, each with a reason"),
    ("corpus/corpus.json", "figures.n_classes_admitted", "classes admitted"),
    ("corpus/corpus.json", "figures.largest_to_smallest", "largest / smallest admitted class"),
    ("split/split.json", "rows_split", "rows in the frozen split"),
    ("split/split.json", "totals.train", "train rows"),
    ("split/split.json", "totals.val", "validation rows"),
    ("split/split.json", "totals.test", "locked test rows"),
    ("split/split.json", "rows_quarantined", "rows quarantined by the split"),
    ("split/split.json", "groups.multi_row", "leakage groups with more than one image"),
    ("split/split.json", "crossings.verdict", "leakage groups across splits (read back from disk)"),
    ("split/split.json", "crossings.groups_across_splits", "leakage groups that span two splits"),
    ("split/split.json", "train_support_ratio.ratio", "largest / smallest class, training rows"),
    ("probes/probes.json", f"{_PROBE}.accuracy.value", "frozen-feature linear probe: test accuracy"),
    ("probes/probes.json", f"{_PROBE}.macro_f1.value", "frozen-feature linear probe: test macro-F1"),
    ("probes/probes.json", "figures.membership.membership_frozen.roc_auc.value",
     "train-vs-test membership probe (frozen features): ROC AUC"),
    ("training/training.json", "models.reference.arch", "reference model architecture"),
    ("training/training.json", "models.compact.arch", "compact model architecture"),
    ("training/training.json", "models.compact.params", "compact model parameters"),
    ("training/training.json", "models.reference.test_macro_f1", "float reference: test macro-F1"),
    ("training/training.json", "models.compact.test_macro_f1", "float compact: test macro-F1"),
    ("ptq/ptq.json", "selected", "selected quantisation candidate"),
    ("ptq/ptq.json", "figures.selected_passed_gate", "selected candidate passed the validation gate"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta", "float compact → INT8 graph: test macro-F1 change"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta_lo", "float compact → INT8 graph: change, interval low"),
    ("ptq/ptq.json", "figures.test_macro_f1_delta_hi", "float compact → INT8 graph: change, interval high"),
    ("runtime/runtime.json", "figures.pte_mib", ".pte size (MiB)"),
    ("runtime/runtime.json", "figures.size_reduction", "size reduction of the .pte against the float state"),
    ("runtime/runtime.json", "figures.test_agreement_with_int8_graph",
     ".pte agrees with the INT8 graph (test)"),
    ("runtime/runtime.json", "figures.test_disagreements", "test rows where .pte and INT8 graph differ"),
    ("runtime/runtime.json", "figures.latency_p50_ratio", "median latency, .pte / float eager"),
    ("analysis/per_class.json", "figures.n_test_rows", "test rows every model state was scored on"),
    ("analysis/per_class.json", "figures.n_classes_scored", "classes with test rows"),
    *[("analysis/per_class.json", f"figures.states.{state}.{metric}.value", f"{label}: {metric_label}")
      for state, label in (("reference", "float reference"), ("pte", ".pte on the runtime"))
      for metric, metric_label in (("accuracy", "accuracy"), ("macro_f1", "macro-F1"))],
    *[("analysis/per_class.json", f"{_PAIR}.{metric}.{part}", f"reference → .pte, {label} {what}")
      for metric, label in (("accuracy", "accuracy"), ("macro_f1", "macro-F1"),
                            ("balanced_accuracy", "balanced accuracy"))
      for part, what in (("delta", "change"), ("lo", "change, interval low"),
                         ("hi", "change, interval high"))],
    ("analysis/per_class.json", f"{_PAIR}.mcnemar.p_value", "reference → .pte, exact McNemar p-value"),
    ("analysis/per_class.json", "figures.unstable_classes", "classes flagged unstable (few test rows)"),
    ("analysis/fruit_slice.json", "figures.n_slice_classes", "fruit-label slice: classes (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.delta",
     "fruit-label slice: mean recall change, reference → .pte (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.lo",
     "fruit-label slice: change, interval low (exploratory)"),
    ("analysis/fruit_slice.json", "figures.slice.paired.reference_to_pte.mean_recall.hi",
     "fruit-label slice: change, interval high (exploratory)"),
    ("field/field.json", "figures.pte_lab_accuracy", ".pte: lab test accuracy, field cohort's classes"),
    ("field/field.json", "figures.pte_field_accuracy", ".pte: zero-shot accuracy on the field cohort"),
    ("field/field.json", "figures.pte_background_share", ".pte: share of the lab-to-field gap, background"),
    ("field/field.json", "figures.pte_off_leaf_occlusion_lab", ".pte: occlusion mass off the leaf, lab test"),
)
_MAX_TEXT = 80


def lookup(record: Any, key: str) -> Any:
    """Value at a dotted key, or KeyError (lists are indexed by position)."""
    value = record
    for part in key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(key)
    return value


def _scalar(value: Any) -> bool:
    if isinstance(value, bool) or isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and 0 < len(value) <= _MAX_TEXT


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}")
    elif _scalar(value):
        yield prefix, value


def chapter_status(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Which chapters left a record in the run folder (and the extra analysis records found)."""
    run_dir = Path(run_dir)
    rows = [{"chapter": c.name, "title": c.heading, "record": c.record, "ran": (run_dir / c.record).exists()}
            for c in CHAPTERS]
    known = {c.record for c in CHAPTERS}
    for extra in sorted((run_dir / "analysis").glob("*.json")) if (run_dir / "analysis").is_dir() else []:
        rel = extra.relative_to(run_dir).as_posix()
        if rel not in known:
            rows.append({"chapter": extra.stem, "title": f"Analysis: {extra.stem}", "record": rel,
                         "ran": True})
    return pd.DataFrame(rows)


def _read(run_dir: Path, rel_path: str) -> Any:
    try:
        return json.loads((run_dir / rel_path).read_text())
    except json.JSONDecodeError as error:
        raise RegistryMismatch(f"{run_dir / rel_path} is not valid JSON ({error}); rerun its chapter") \
            from None


def evidence_summary(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per number: claim, value, source file, JSON key — the curated headlines first, then every
    scalar in each record's ``figures``.  Only chapters that ran contribute."""
    run_dir = Path(run_dir)
    status = chapter_status(run_dir)
    records = {r.record: _read(run_dir, r.record) for r in status.itertuples() if r.ran}
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for source, key, claim in HEADLINES:
        if source not in records:
            continue
        try:
            value = lookup(records[source], key)
        except KeyError:
            continue
        if _scalar(value):
            rows.append({"claim": claim, "value": value, "source": source, "key": key, "headline": True})
            seen.add((source, key))
    for source, record in records.items():
        chapter = record.get("chapter", Path(source).stem) if isinstance(record, dict) else Path(source).stem
        figures = record.get("figures", {}) if isinstance(record, dict) else {}
        for key, value in _flatten(figures, "figures"):
            if (source, key) not in seen:
                rows.append({"claim": f"{chapter}: {key.removeprefix('figures.')}", "value": value,
                             "source": source, "key": key, "headline": False})
    return rows


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
