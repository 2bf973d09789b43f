"""The error explorer's logic: pick a class, see its confusion row and its misclassified test images.

Everything but :func:`browser` returns DataFrames or matplotlib Figures, testable without widgets;
``notebooks/explore_errors.ipynb`` shows :func:`render` statically, then :func:`browser` for a live
kernel.  It opens a finished run folder read-only (``config.reopen_run``) and verifies every file it
reads against the registry.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from . import analysis, metrics, model_states
from .config import RunContext, reopen_run
from .evidence import Chapter


class NothingToExplore(FileNotFoundError):
    """The run folder holds no prediction records yet."""


@dataclass
class ExplorerData:
    ctx: RunContext
    paired: model_states.PairedStates
    classes: pd.DataFrame  # label, class_name, crop, type, ... train/test support

    @property
    def states(self) -> list[str]:
        return [s for s in model_states.STATE_NAMES if s in self.paired.preds]

    @property
    def first_class(self) -> int:
        return int(self.classes["label"].iloc[0])

    def name(self, label: int) -> str:
        return str(self.classes.set_index("label").loc[int(label), "class_name"])


def load(run_dir: str | os.PathLike) -> ExplorerData:
    """Open a finished run folder; every model state whose predictions exist is shown."""
    ctx = reopen_run(run_dir)
    ch = Chapter(ctx.run_dir, "explorer", folder=analysis.FOLDER)  # reads only; nothing is finished
    from .split import load_frozen

    frozen = load_frozen(ch)
    frames = analysis.load_states(ch, required=False)
    if not frames:
        raise NothingToExplore(f"{ctx.run_dir} has no prediction records yet ("
                               + ", ".join(s.path for s in model_states.STATES)
                               + "); run the chain through chapter 05 (training) first.")
    paired = analysis.pair_states(frames, frozen.rows, len(frozen.class_names))
    return ExplorerData(ctx=ctx, paired=paired, classes=analysis.class_table(frozen.class_map, frozen.rows))


def _check_state(data: ExplorerData, state: str) -> str:
    if state not in data.paired.preds:
        raise KeyError(f"state {state!r} has no predictions in this run; available: {', '.join(data.states)}")
    return state


def class_options(data: ExplorerData, state: str = "pte") -> list[tuple[str, int]]:
    """(label text, class index) pairs for a Dropdown, in class-index order."""
    state = state if state in data.paired.preds else data.states[-1]
    y, pred = data.paired.y, data.paired.preds[state]
    errors = np.bincount(y[pred != y], minlength=data.paired.n_classes)
    support = np.bincount(y, minlength=data.paired.n_classes)
    return [(f"{r.class_name} ({support[r.label]} test rows, {errors[r.label]} errors)", int(r.label))
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


def confusion_row(data: ExplorerData, label: int) -> pd.DataFrame:
    """Where the class's test rows went: one row per predicted class, a column per state (row counts)."""
    is_class = data.paired.y == label
    counts = {model_states.STATE_LABELS[s]: np.bincount(data.paired.preds[s][is_class],
                                                    minlength=data.paired.n_classes) for s in data.states}
    table = pd.DataFrame(counts, index=pd.Index(data.classes["class_name"], name="predicted"))
    table = table[table.sum(axis=1) > 0]
    is_self = table.index == data.name(label)
    return pd.concat([table[is_self], table[~is_self].sort_values(list(table.columns)[-1], ascending=False)])


def misclassified(data: ExplorerData, label: int, state: str = "pte") -> pd.DataFrame:
    """The class's test rows ``state`` gets wrong, most confident first, with every state's prediction."""
    state = _check_state(data, state)
    names = data.classes.set_index("label")["class_name"]
    rows = data.paired.rows
    chosen = (rows["label"] == label).to_numpy() & (data.paired.preds[state] != label)
    frame = rows.loc[chosen, ["row_id", "rel_path"]].copy()
    frame["margin"] = data.paired.margins[state][chosen]
    for other in data.states:
        frame[f"pred_{other}"] = names.reindex(data.paired.preds[other][chosen]).to_numpy()
    return frame.sort_values(["margin", "row_id"], ascending=[False, True]).reset_index(drop=True)


def plot_thumbnails(data: ExplorerData, errors: pd.DataFrame, state: str = "pte", max_images: int = 12,
                    thumb_px: int = 96, columns: int = 4) -> Figure:
    """Thumbnails of misclassified rows, titled with the predicted label and margin of ``state``."""
    from .imaging import load_square

    shown = errors.head(max_images)
    if shown.empty:
        fig = Figure(figsize=(5, 0.8))
        fig.text(0.5, 0.5, f"no errors of the {model_states.STATE_LABELS[state]} in this class", ha="center",
                 va="center")
        return fig
    n_rows = int(np.ceil(len(shown) / columns))
    fig = Figure(figsize=(2.2 * columns, 2.4 * n_rows))
    axes = fig.subplots(n_rows, columns, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, item in zip(axes.ravel(), shown.itertuples(), strict=False):
        ax.imshow(load_square(data.ctx.corpus_root / item.rel_path, thumb_px))
        others = ", ".join(f"{s}: {getattr(item, f'pred_{s}')[:14]}" for s in data.states if s != state)
        ax.set_title(f"→ {getattr(item, f'pred_{state}')[:22]} ({item.margin:.2f})\n{others}", fontsize=5.5)
    fig.tight_layout()
    return fig


def headline(data: ExplorerData, label: int, errors: pd.DataFrame, state: str, bold: str = "**{}**") -> str:
    """One line above a class's view; ``bold`` formats the class name (Markdown by default, or HTML)."""
    return (f"{bold.format(data.name(label))}: {len(errors)} test rows misclassified by the "
            f"{model_states.STATE_LABELS[state]}; thumbnails show its predicted label and margin, then "
            "the other states' predictions.")


def render(data: ExplorerData, label: int, state: str = "pte", max_images: int = 12) -> None:
    """Display one class's view in the notebook (headline, scores, confusion row, thumbnails)."""
    from IPython.display import Image, Markdown, display

    errors = misclassified(data, label, state)
    display(Markdown(headline(data, label, errors, state)))
    display(class_scores(data, label).round(3))
    display(confusion_row(data, label))
    # PNG bytes, not the Figure: a kernel on the Agg backend has no figure formatter registered
    display(Image(data=figure_png(plot_thumbnails(data, errors, state, max_images))))


def browser(data: ExplorerData, state: str = "pte", max_images: int = 12):
    """A class picker above the class's view, for a live kernel (returns an ipywidgets ``VBox``).

    The view is built from value widgets (HTML, Image) whose values the picker replaces.  An ``Output``
    widget would be simpler, but a headless nbclient run routes captured output back to the kernel and
    can wait forever on it (seen here under papermill); value updates need no reply.
    """
    import ipywidgets as widgets

    picker = widgets.Dropdown(options=class_options(data, state), value=data.first_class,
                              description="class", layout=widgets.Layout(width="60%"))
    text = widgets.HTML()
    thumbnails = widgets.Image(format="png")

    def show(label: int) -> None:
        errors = misclassified(data, label, state)
        title = headline(data, label, errors, state, bold="<b>{}</b>")
        text.value = (f"<p>{title}</p>" + class_scores(data, label).round(3).to_html(index=False)
                      + "<p>Where its test rows went (rows per predicted class):</p>"
                      + confusion_row(data, label).to_html())
        thumbnails.value = figure_png(plot_thumbnails(data, errors, state, max_images))

    picker.observe(lambda change: show(change["new"]), names="value")
    show(picker.value)
    return widgets.VBox([picker, text, thumbnails])


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()
