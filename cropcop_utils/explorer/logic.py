"""The error explorer's logic: pick a class, see its confusion row and the test images a state got wrong.

Everything but :func:`browser` returns DataFrames, HTML strings or matplotlib Figures, testable without
widgets.  ``notebooks/explore_errors.ipynb`` shows :func:`browser` (a live kernel: Voilà via
``python -m cropcop_utils explore``, or Jupyter) and, headless, :func:`render` statically.  It opens a
finished run folder read-only (``config.reopen_run``) and verifies every file it reads against the
registry.

Filters: the class is the rows' true class or the class a state predicted (``by``), the model state
whose errors are shown, ``changed_only`` (rows whose prediction differs between the reference and
the ``.pte``) and ``abstention`` (rows the ``.pte``'s abstention recipe of chapter 11 answered or refused,
from ``abstention/decisions.parquet`` when the run has it).
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..analysis import states as analysis
from ..core import metrics, model_states
from ..core.config import RunContext, reopen_run
from ..core.evidence import Chapter

BY = {"true": "true class", "pred": "predicted class"}
ABSTENTION = {"all": "all rows", "answered": "answered by the .pte", "refused": "refused by the .pte"}
DECISIONS = "abstention/decisions.parquet"
CHANGED_PAIR = ("reference", "pte")  # the whole deployment chain, as in model_states.PAIRS


class NothingToExplore(FileNotFoundError):
    """The run folder holds no prediction records yet."""


@dataclass
class ExplorerData:
    ctx: RunContext
    paired: model_states.PairedStates
    classes: pd.DataFrame  # label, class_name, crop, type, ... train/test support
    answered: np.ndarray | None = None  # per test row (paired order): the .pte's recipe answers it

    @property
    def states(self) -> list[str]:
        return [s for s in model_states.STATE_NAMES if s in self.paired.preds]

    @property
    def first_class(self) -> int:
        return int(self.classes["label"].iloc[0])

    @property
    def can_compare_changes(self) -> bool:
        return all(s in self.paired.preds for s in CHANGED_PAIR)

    def name(self, label: int) -> str:
        return str(self.classes.set_index("label").loc[int(label), "class_name"])


def load(run_dir: str | os.PathLike) -> ExplorerData:
    """Open a finished run folder; every model state whose predictions exist is shown."""
    ctx = reopen_run(run_dir)
    ch = Chapter(ctx.run_dir, "explorer", folder=analysis.FOLDER)  # reads only; nothing is finished
    from ..split import load_frozen

    frozen = load_frozen(ch)
    frames = analysis.load_states(ch, required=False)
    if not frames:
        raise NothingToExplore(f"{ctx.run_dir} has no prediction records yet ("
                               + ", ".join(s.path for s in model_states.STATES)
                               + "); run the chain through chapter 05 (training) first.")
    paired = analysis.pair_states(frames, frozen.rows, len(frozen.class_names))
    return ExplorerData(ctx=ctx, paired=paired, classes=analysis.class_table(frozen.class_map, frozen.rows),
                        answered=_answered(ch, paired.rows))


def _answered(ch: Chapter, rows: pd.DataFrame) -> np.ndarray | None:
    """Chapter 11's decision on each test row (row order of ``rows``), or None before chapter 11 ran."""
    from ..core.evidence import read_registry

    if DECISIONS not in read_registry(ch.run_dir):
        return None
    decisions = ch.read_parquet(DECISIONS)
    lab = decisions[decisions["set"] == "lab_test"].set_index("row_id")["answered"]
    if set(lab.index) != set(rows["row_id"]):
        return None  # decisions of another test split: not shown rather than misaligned
    return lab.reindex(rows["row_id"]).to_numpy(dtype=bool)


def _check_abstention(data: ExplorerData, abstention: str) -> str:
    if abstention not in ABSTENTION:
        raise ValueError(f"abstention must be one of {', '.join(ABSTENTION)}, not {abstention!r}")
    if abstention != "all" and data.answered is None:
        raise KeyError(f"{DECISIONS} is not in this run: run chapter 11 (abstention) to filter on its "
                       "decisions")
    return abstention


def _check_state(data: ExplorerData, state: str) -> str:
    if state not in data.paired.preds:
        raise KeyError(f"state {state!r} has no predictions in this run; available: {', '.join(data.states)}")
    return state


def _check_by(by: str) -> str:
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)} (true class or predicted class), not {by!r}")
    return by


def changed_rows(data: ExplorerData) -> np.ndarray:
    """Test rows whose prediction differs between the reference and the ``.pte`` (row_id order)."""
    if not data.can_compare_changes:
        raise KeyError(f"'changed between reference and .pte' needs both states; this run has "
                       f"{', '.join(data.states)}")
    return data.paired.preds[CHANGED_PAIR[0]] != data.paired.preds[CHANGED_PAIR[1]]


def class_options(data: ExplorerData, state: str = "pte", by: str = "true") -> list[tuple[str, int]]:
    """(label text, class index) pairs for a Dropdown, in class-index order, with the state's error counts."""
    state = state if state in data.paired.preds else data.states[-1]
    y, pred, n = data.paired.y, data.paired.preds[state], data.paired.n_classes
    wrong = pred != y
    counted, what = (y, "test rows") if _check_by(by) == "true" else (pred, "predicted")
    rows, errors = np.bincount(counted, minlength=n), np.bincount(counted[wrong], minlength=n)
    return [(f"{r.class_name} ({rows[r.label]} {what}, {errors[r.label]} errors)", int(r.label))
            for r in data.classes.itertuples()]


def class_scores(data: ExplorerData, label: int) -> pd.DataFrame:
    """Precision, recall, F1 and error count of one class for every state."""
    rows = []
    for state in data.states:
        scores = metrics.per_class_scores(data.paired.y, data.paired.preds[state], data.paired.n_classes)
        row = scores.set_index("label").loc[int(label)]
        is_class = data.paired.y == label
        rows.append({"state": model_states.STATE_LABELS[state], "precision": row["precision"],
                     "recall": row["recall"], "f1": row["f1"], "test_rows": int(is_class.sum()),
                     "errors": int((is_class & (data.paired.preds[state] != label)).sum())})
    return pd.DataFrame(rows)


def confusion_row(data: ExplorerData, label: int, by: str = "true") -> pd.DataFrame:
    """Where the class's test rows went (``by="true"``: one row per predicted class), or where the rows
    predicted as the class came from (``by="pred"``: one row per true class); a column per state."""
    y, preds = data.paired.y, data.paired.preds
    if _check_by(by) == "true":
        counts = {s: np.bincount(preds[s][y == label], minlength=data.paired.n_classes) for s in data.states}
        index_name = "predicted"
    else:
        counts = {s: np.bincount(y[preds[s] == label], minlength=data.paired.n_classes) for s in data.states}
        index_name = "true class"
    table = pd.DataFrame({model_states.STATE_LABELS[s]: c for s, c in counts.items()},
                         index=pd.Index(data.classes["class_name"], name=index_name))
    is_self = table.index == data.name(label)
    table = table[(table.sum(axis=1) > 0) | is_self]  # the class itself stays, even when no row is kept
    is_self = table.index == data.name(label)
    return pd.concat([table[is_self], table[~is_self].sort_values(list(table.columns)[-1], ascending=False)])


def misclassified(data: ExplorerData, label: int, state: str = "pte", by: str = "true",
                  changed_only: bool = False, abstention: str = "all") -> pd.DataFrame:
    """The rows ``state`` gets wrong whose true class (``by="true"``) or whose ``state`` prediction
    (``by="pred"``) is ``label``, most confident first, with every state's prediction and the image path.
    ``changed_only`` keeps only rows whose prediction differs between the reference and the ``.pte``;
    ``abstention`` ("answered" / "refused") only the rows the ``.pte``'s abstention recipe answered or
    refused."""
    state = _check_state(data, state)
    names = data.classes.set_index("label")["class_name"]
    rows, y, pred = data.paired.rows, data.paired.y, data.paired.preds[state]
    chosen = (y if _check_by(by) == "true" else pred) == label
    chosen &= pred != y
    if changed_only:
        chosen &= changed_rows(data)
    if _check_abstention(data, abstention) != "all":
        chosen &= data.answered if abstention == "answered" else ~data.answered
    frame = rows.loc[chosen, ["row_id", "rel_path"]].copy()
    frame["true_class"] = names.reindex(y[chosen]).to_numpy()
    frame["margin"] = data.paired.margins[state][chosen]
    for other in data.states:
        frame[f"pred_{other}"] = names.reindex(data.paired.preds[other][chosen]).to_numpy()
    if data.answered is not None:
        frame["pte_answered"] = data.answered[chosen]
    frame["path"] = [str(data.ctx.corpus_root / p) for p in frame["rel_path"]]
    return frame.sort_values(["margin", "row_id"], ascending=[False, True]).reset_index(drop=True)


def headline(data: ExplorerData, label: int, errors: pd.DataFrame, state: str, bold: str = "**{}**",
             by: str = "true", changed_only: bool = False, abstention: str = "all") -> str:
    """One line above a class's view; ``bold`` formats the class name (Markdown by default, or HTML)."""
    who = model_states.STATE_LABELS[state]
    if _check_by(by) == "true":
        what = f"{len(errors)} test rows misclassified by the {who}"
    else:
        what = f"{len(errors)} test rows of other classes that the {who} predicts as this class"
    only = " whose prediction changed between the reference and the .pte" if changed_only else ""
    if abstention != "all":
        only += f", {ABSTENTION[abstention]}'s abstention recipe"
    return (f"{bold.format(data.name(label))}: {what}{only}; each thumbnail shows its true class, the "
            f"{who}'s prediction and margin, then the other states' predictions.")


def _caption(data: ExplorerData, item, state: str) -> list[str]:
    others = ", ".join(f"{s}: {getattr(item, f'pred_{s}')}" for s in data.states if s != state)
    return [f"true: {item.true_class}", f"→ {getattr(item, f'pred_{state}')} ({item.margin:.2f})", others]


# Click-to-enlarge without JavaScript: the image sits in a <details> summary and grows when it is open.
_GALLERY_STYLE = """<style>
.cropcop-gallery {{display:flex; flex-wrap:wrap; gap:10px; align-items:flex-start}}
.cropcop-gallery figure {{margin:0; width:min-content; font-size:11px; line-height:1.25}}
.cropcop-gallery summary {{list-style:none; cursor:zoom-in}}
.cropcop-gallery summary::-webkit-details-marker {{display:none}}
.cropcop-gallery img {{width:{thumb}px; height:{thumb}px; display:block}}
.cropcop-gallery details[open] img {{width:{large}px; height:{large}px; cursor:zoom-out}}
.cropcop-gallery code {{word-break:break-all; font-size:10px; user-select:all}}
</style>"""


def _data_uri(path: str, size: int) -> str:
    from ..core.imaging import load_square

    buffer = io.BytesIO()
    load_square(path, size).save(buffer, format="JPEG", quality=88)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def gallery_html(data: ExplorerData, errors: pd.DataFrame, state: str = "pte", max_images: int = 12,
                 thumb_px: int = 192, large_px: int = 512) -> str:
    """The rows as clickable thumbnails (click: ``large_px``), each with its captions and file path."""
    shown = errors.head(max_images)
    if shown.empty:
        return (f"<p class='cropcop-gallery-empty'>No rows to show: no errors of the "
                f"{html.escape(model_states.STATE_LABELS[state])} pass these filters.</p>")
    figures = []
    for item in shown.itertuples():
        lines = "".join(f"<div>{html.escape(line)}</div>" for line in _caption(data, item, state) if line)
        figures.append(
            f"<figure class='cropcop-thumb' data-row-id='{html.escape(str(item.row_id))}' "
            f"data-true-class='{html.escape(item.true_class)}'>"
            f"<details><summary><img src='{_data_uri(item.path, large_px)}' "
            f"title='click to enlarge' alt='{html.escape(item.rel_path)}'></summary></details>"
            f"<figcaption>{lines}<code>{html.escape(item.path)}</code></figcaption></figure>")
    more = f"<p>{len(errors) - len(shown)} more not shown (max_images={max_images}).</p>" \
        if len(errors) > len(shown) else ""
    return (_GALLERY_STYLE.format(thumb=thumb_px, large=large_px)
            + f"<div class='cropcop-gallery'>{''.join(figures)}</div>{more}")


def plot_thumbnails(data: ExplorerData, errors: pd.DataFrame, state: str = "pte", max_images: int = 12,
                    thumb_px: int = 192, columns: int = 4) -> Figure:
    """Thumbnails as one figure, for static outputs that drop HTML images (numbered as in the path table)."""
    from ..core.imaging import load_square

    shown = errors.head(max_images)
    if shown.empty:
        fig = Figure(figsize=(5, 0.8))
        fig.text(0.5, 0.5, f"no errors of the {model_states.STATE_LABELS[state]} pass these filters",
                 ha="center", va="center")
        return fig
    n_rows = int(np.ceil(len(shown) / columns))
    fig = Figure(figsize=(3.0 * columns, 3.3 * n_rows))
    axes = fig.subplots(n_rows, columns, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for number, (ax, item) in enumerate(zip(axes.ravel(), shown.itertuples(), strict=False), start=1):
        ax.imshow(load_square(item.path, thumb_px))
        ax.set_title(f"#{number} true: {item.true_class[:26]}\n→ {getattr(item, f'pred_{state}')[:26]} "
                     f"({item.margin:.2f})", fontsize=7)
    fig.tight_layout()
    return fig


def render(data: ExplorerData, label: int, state: str = "pte", max_images: int = 12, by: str = "true",
           changed_only: bool = False, abstention: str = "all") -> None:
    """Display one class's view statically (headline, scores, confusion row, thumbnails, their paths)."""
    from IPython.display import Image, Markdown, display

    errors = misclassified(data, label, state, by, changed_only, abstention)
    display(Markdown(headline(data, label, errors, state, by=by, changed_only=changed_only,
                              abstention=abstention)))
    display(class_scores(data, label).round(3))
    display(confusion_row(data, label, by))
    # PNG bytes, not the Figure: a kernel on the Agg backend has no figure formatter registered
    display(Image(data=figure_png(plot_thumbnails(data, errors, state, max_images))))
    paths = errors.head(max_images).drop(columns=["rel_path"])
    paths.index = pd.RangeIndex(1, len(paths) + 1, name="#")
    display(paths)


def browser(data: ExplorerData, state: str = "pte", max_images: int = 12):
    """Filters (class, true/predicted, state, changed) above the class's view; an ipywidgets ``VBox``.

    The view is built from value widgets (HTML) whose values the filters replace.  An ``Output`` widget
    would be simpler, but a headless nbclient run routes captured output back to the kernel and can wait
    forever on it (seen here under papermill); value updates need no reply.  Each widget carries a
    ``cropcop-*`` CSS class so a browser test (and a reader's inspector) can find it.
    """
    import ipywidgets as widgets

    state = _check_state(data, state)
    wide = widgets.Layout(width="auto", min_width="28em")
    picker = widgets.Dropdown(options=class_options(data, state), value=data.first_class,
                              description="class", layout=wide)
    by = widgets.ToggleButtons(options=[(text, key) for key, text in BY.items()], value="true",
                               description="class is the", style={"description_width": "initial"})
    state_picker = widgets.Dropdown(options=[(model_states.STATE_LABELS[s], s) for s in data.states],
                                    value=state, description="errors of")
    changed = widgets.Checkbox(value=False, indent=False, disabled=not data.can_compare_changes,
                               description="only rows whose prediction changed between reference and .pte",
                               layout=widgets.Layout(width="auto"))
    abstained = widgets.ToggleButtons(options=[(text, key) for key, text in ABSTENTION.items()], value="all",
                                      disabled=data.answered is None, description="rows",
                                      tooltips=["every test row", "rows the .pte's abstention recipe answers",
                                                "rows it refuses (chapter 11)"])
    text, gallery = widgets.HTML(), widgets.HTML()
    for widget, name in ((picker, "class"), (by, "by"), (state_picker, "state"), (changed, "changed"),
                         (abstained, "abstention"), (text, "tables"), (gallery, "thumbnails")):
        widget.add_class(f"cropcop-{name}")
    relabelling = False

    def show(_change=None) -> None:
        if relabelling:
            return
        label, chosen_state = picker.value, state_picker.value
        errors = misclassified(data, label, chosen_state, by.value, changed.value, abstained.value)
        title = headline(data, label, errors, chosen_state, bold="<b>{}</b>", by=by.value,
                         changed_only=changed.value, abstention=abstained.value)
        went = ("Where its test rows went" if by.value == "true"
                else "Where the rows predicted as it came from")
        text.value = (f"<p>{title}</p>" + class_scores(data, label).round(3).to_html(index=False)
                      + f"<p>{went} (rows per class, every state):</p>"
                      + confusion_row(data, label, by.value).to_html(classes="cropcop-confusion"))
        gallery.value = gallery_html(data, errors, chosen_state, max_images)

    def relabel(_change) -> None:
        # new options would reset the pick to the first class; keep the reader's class instead
        nonlocal relabelling
        relabelling, keep = True, picker.value
        try:
            picker.options = class_options(data, state_picker.value, by.value)
            picker.value = keep
        finally:
            relabelling = False
        show()

    picker.observe(show, names="value")
    changed.observe(show, names="value")
    abstained.observe(show, names="value")
    by.observe(relabel, names="value")
    state_picker.observe(relabel, names="value")
    show()
    return widgets.VBox([widgets.HBox([picker, state_picker]), widgets.HBox([by, changed]), abstained, text,
                         gallery])


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()
