"""Chapter 11's "Abstention that protects" section, rendered from the ``protection`` block of
``abstention/abstention.json`` and its table (numbers never typed)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def _pct(share: dict[str, Any] | None) -> str:
    if not share or share.get("value") is None:  # no rows, or none answered: a share without a value
        return "n/a"
    low, high = share["ci"]
    return f"{100 * share['value']:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def set_sentence(name: str, figures: dict[str, Any], targeted: tuple[str, ...] = ()) -> str:
    """One set's figures under the chosen recipe: answered and right for an in-scope set, else rejected."""
    if figures["kind"] == "in_scope":
        return (
            f"`{name}` (in scope, n = {figures['n']:,}): answered {_pct(figures.get('coverage'))}, right "
            f"on {_pct(figures.get('selective_accuracy'))} of those answered"
        )
    note = "" if figures["kind"] == "far" or name in targeted else ", reported only: no target"
    return (f"`{name}` ({figures['kind']} out of scope{note}, n = {figures['n']:,}): rejected "
            f"{_pct(figures.get('rejected'))}")


def verdict_sentence(verdict: dict[str, Any]) -> str:
    """Whether the recipe meets every target of the profile, and which it misses or could not measure."""
    if verdict["protects"]:
        return (
            "**The abstention protects** by the profile's targets: every measured figure meets its target "
            "(point estimates; the intervals are beside them)."
        )
    parts = []
    if verdict["unmet"]:
        parts.append("it misses " + "; ".join(_check(c) for c in verdict["checks"] if c["met"] is False))
    if verdict["unmeasured"]:
        parts.append(
            "it could not be measured on " + ", ".join(verdict["unmeasured"]) + " (no such inputs "
            "in this run, or none answered)"
        )
    return (
        "**The abstention does not protect** by the profile's targets: " + " and ".join(parts) + ". Rely "
        "on it only within the figures above, not as a guarantee that unknown inputs are refused."
    )


def validation_sentence(validation: dict[str, Any]) -> str:
    """What the recipe did on its own validation sets, and whether any threshold could have met the
    in-scope targets there (:func:`.protection.validation_reach`)."""
    if not validation:
        return ""
    parts = [
        f"`{name}` (n = {r['n']:,}) answered {_pct(r['coverage'])}, right on "
        f"{_pct(r['selective_accuracy'])}; "
        f"behind the outlier threshold a confidence threshold answers at most {100 * r['reach']:.1f} % of it "
        f"at ≥ {100 * r['accuracy_target']:.0f} % right (target: answer ≥ {100 * r['coverage_target']:.0f} %)"
        for name, r in validation.items()
    ]
    short = [name for name, r in validation.items() if not r["reachable"]]
    tail = (
        " So on " + " and ".join(f"`{n}`" for n in short) + " no confidence threshold behind this outlier "
        "threshold meets both targets: the miss was foreseeable before any held-back input was scored, and "
        "only a looser outlier threshold (which refuses less of what is out of scope) or a model that ranks "
        "its own errors better can move it."
        if short else " Validation leaves room for the in-scope targets of these sets."
    )
    if not any(r["kind"] == "field" for r in validation.values()):
        tail += (" There are no field validation rows: validation says nothing of the field targets (a "
                 "lab-only model's abstention is judged on the field cohorts alone).")
    return "What validation already said (the recipe on its own validation rows): " + "; ".join(parts) + \
        "." + tail


def hindsight_sentence(protection: dict[str, Any]) -> str:
    """Whether any thresholds on the chosen score, or on another candidate, would meet every target when read
    off the evaluated sets themselves (:mod:`.hindsight`): is a miss the rule's, or the score's?"""
    found, chosen = protection.get("hindsight") or {}, protection["chosen"]
    mine = found.get(chosen)
    if not mine or mine["pairs_meeting_all"] is None:
        return ""
    head = (
        "In hindsight (what the scores allow, never a recipe: a grid of "
        f"{mine['pairs']:,} pairs of outlier and confidence thresholds per candidate, measured on the "
        "evaluated sets above): "
    )
    if mine["pairs_meeting_all"]:
        body = (f"with `{chosen}`, {mine['pairs_meeting_all']:,} pairs meet every target"
                + ("." if protection["verdict"]["protects"] else
                   ", so thresholds that protect exist for this score and the rule fitted on validation did "
                   "not find them."))
    else:
        body = (f"with `{chosen}` no pair meets every target; the best falls short by "
                f"{100 * mine['shortfall']:.1f} points on {mine['binding']}, so no rule fitted on validation "
                "could meet them with this score.")
    others = {n: f for n, f in found.items() if n != chosen and f["pairs_meeting_all"] is not None}
    able = [n for n, f in others.items() if f["pairs_meeting_all"]]
    if able:
        tail = " Another candidate would have such pairs: " + ", ".join(
            f"`{n}` ({others[n]['pairs_meeting_all']:,})" for n in able) + "."
    elif others:
        closest = min(others, key=lambda n: others[n]["shortfall"])
        tail = (f" Nor has any other candidate such a pair (the closest, `{closest}`, falls short by "
                f"{100 * others[closest]['shortfall']:.1f} points on {others[closest]['binding']}).")
    else:
        tail = ""
    return head + body + tail


def _check(c: dict[str, Any]) -> str:
    unit = 100.0
    return f"{c['what']} {unit * c['value']:.1f} % (target {c['op']} {unit * c['goal']:.0f} %)"


def protection_text(protection: dict[str, Any]) -> str:
    """The section's paragraph: program, fit, choice, every held-back set, verdict."""
    recipe, fitted = protection["recipe"], protection["candidates"]
    chosen = protection["chosen"]
    ref = recipe["reference_features"]
    others = ", ".join(f"`{n}` {_pct(c['fitting_rejection'])}" for n, c in fitted.items() if n != chosen)
    fit = protection["fitted_on"]
    program = protection["program"]
    targeted = tuple(protection.get("near_target_kinds") or ())
    return (
        f"Every score here comes from this `.pte`'s own outputs (method `{program['method']}` → "
        f"{', '.join(program['outputs'])}; `.pte` {program['sha256'][:12]}…), "
        f"with {protection['library']}. The feature scores measure distance to the features of the "
        f"{ref['rows']:,} training photos of the `{ref['regime']}` regime (SHA-256 {ref['sha256'][:12]}…). "
        f"Fitted on validation only ({fit['val_rows']:,} rows): each candidate's outlier threshold keeps "
        f"{100 * recipe['in_scope_coverage']:.0f} % of them, and the confidence threshold among those is "
        "the lowest whose answered validation rows keep the target risk. The candidate was chosen on a "
        f"fitting kind of outlier that is never evaluated ({', '.join(fit['fitting_kinds'])}: "
        f"{fit['fitting_rows']:,} validation photos cut into tiles and shuffled) by the rule: "
        f"{protection['choice_rule']}. "
        f"**{protection['chosen_label']}** (`{chosen}`) rejected {_pct(fitted[chosen]['fitting_rejection'])} "
        f"of them ({others or 'no other candidate'}). The recipe: temperature {recipe['temperature']:.3f}; "
        f"answer when `{chosen}` ≤ {recipe['score_threshold']:.4g} and the calibrated max softmax ≥ "
        f"{recipe['confidence_threshold']:.4f}.\n\n"
        "On inputs it never saw while these were chosen (95 % Wilson intervals): "
        + "; ".join(set_sentence(n, f, targeted) for n, f in protection["chosen_figures"].items())
        + ".\n\n"
        + verdict_sentence(protection["verdict"])
        + ("\n\n" + validation_sentence(protection["validation"]) if protection.get("validation") else "")
        + ("\n\n" + hindsight if (hindsight := hindsight_sentence(protection)) else "")
    )


def candidates_table(table: pd.DataFrame) -> pd.DataFrame:
    """Every candidate side by side: per set, the share answered (in scope) or rejected (out of scope),
    and the accuracy on answered in-scope rows (empty where a candidate answered none)."""
    inside = table["kind"] == "in_scope"
    long = pd.concat([
        table.assign(measure=inside.map({True: "answered", False: "rejected"}),
                     value=table["coverage"].where(inside, table["rejected"])),
        table[inside].assign(measure="right among answered", value=table["selective_accuracy"]),
    ])
    long["value"] = long["value"].astype(float)
    wide = long.set_index(["kind", "set", "measure", "score"])["value"].unstack("score")
    return wide.sort_index(level=[0, 1], sort_remaining=False)[list(dict.fromkeys(table["score"]))]
