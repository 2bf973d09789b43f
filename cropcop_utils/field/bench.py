"""The background-swap benchmark of a run: which rows, which backdrops, the composite files, the cells.

The lab rows are a seeded sample of the locked test rows (read through :mod:`cropcop_utils.split.locked_test`
by the chapter); their ``lab_plain`` predictions are each state's recorded test predictions.  Leaf masks
of lab photos come from :func:`.masks.leaf_mask` (the classical method; IoU against the synthetic true
masks is reported); field leaves use the cohort's true masks, so ``field_plain`` exists only where the
cohort has them.  Plain backdrops come from lab *train* photos of the same class (never a test photo).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from ..core import imaging
from ..core.evidence import Chapter, atomic_write_bytes, row_id
from . import composites as comp

COMPOSITES = "field/composites"
UNUSABLE_DONORS = "field/unusable_donors.parquet"  # train photos with no backdrop to inpaint, and why
MANIFEST_COLUMNS = [
    "row_id",
    "rel_path",
    "cell",
    "source_row_id",
    "source_rel_path",
    "label",
    "class_name",
    "backdrop",
    "backdrop_rel_path",
    "backdrop_same_class",
]


@dataclass
class LeafSet:
    """Photos with their leaf masks at native resolution (row_id → mask) and where they live."""

    rows: pd.DataFrame  # row_id, rel_path, label, class_name
    root: Path
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    def rgb(self, rel_path: str) -> np.ndarray:
        return np.asarray(imaging.open_rgb(self.root / rel_path), dtype=np.uint8)


def sample_rows(rows: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` rows, drawn without replacement by a seeded generator, in row_id order."""
    if len(rows) <= n:
        return rows.sort_values("row_id").reset_index(drop=True)
    picked = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    return rows.iloc[np.sort(picked)].sort_values("row_id").reset_index(drop=True)


def estimate_masks(leaves: LeafSet) -> LeafSet:
    """The classical leaf mask of every photo in the set."""
    from ..core.masks import leaf_mask

    for r in leaves.rows.itertuples():
        leaves.masks[r.row_id] = np.asarray(leaf_mask(leaves.rgb(r.rel_path)), dtype=bool)
    return leaves


def lab_true_mask(run_dir: Path, class_name: str, rel_path: str) -> Path | None:
    """The synthetic generator's true mask of a lab photo, when the run has one (its own path rule)."""
    from .. import synthetic

    path = run_dir / "synthetic" / synthetic.MASKS_DIR / synthetic.lab_mask_rel_path(rel_path, class_name)
    return path if path.is_file() else None


def mask_iou_table(run_dir: Path, leaves: LeafSet) -> pd.DataFrame:
    """IoU of each estimated lab mask against its true mask (rows without a true mask are left out)."""
    from ..core.masks import load_mask, mask_iou

    rows = []
    for r in leaves.rows.itertuples():
        truth = lab_true_mask(run_dir, r.class_name, r.rel_path)
        if truth is not None:
            iou = mask_iou(leaves.masks[r.row_id], load_mask(truth))
            rows.append(
                {
                    "row_id": r.row_id,
                    "rel_path": r.rel_path,
                    "class_name": r.class_name,
                    "iou": np.nan if iou is None else float(iou),  # both empty: undefined, not counted
                    "leaf_share": float(leaves.masks[r.row_id].mean()),
                }
            )
    return pd.DataFrame(rows, columns=["row_id", "rel_path", "class_name", "iou", "leaf_share"])


class Backdrops:
    """Plain lab backdrops (inpainted train photos), made once per donor photo."""

    def __init__(self, donors: LeafSet) -> None:
        self.donors = donors
        self.classes = donors.rows["label"].to_numpy()
        self._plain: dict[int, np.ndarray] = {}
        self.unusable: dict[int, str] = {}  # donor index -> why it has no backdrop (field/unusable_donors)

    def plain(self, index: int) -> np.ndarray | None:
        """The donor's inpainted backdrop, or None when it has none (its leaf fills the photo, or no leaf
        was found): such a donor is recorded in ``unusable`` and never drawn again."""
        if index not in self._plain and index not in self.unusable:
            r = self.donors.rows.iloc[index]
            if r.row_id not in self.donors.masks:
                from ..core.masks import leaf_mask

                self.donors.masks[r.row_id] = np.asarray(leaf_mask(self.donors.rgb(r.rel_path)), dtype=bool)
            try:
                self._plain[index] = comp.plain_background(
                    self.donors.rgb(r.rel_path), self.donors.masks[r.row_id]
                )
            except comp.CompositeError as error:
                self.unusable[index] = str(error)
        return self._plain.get(index)

    def draw(self, pick: int, same: bool, label: int, exclude: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, int, bool]:
        """The backdrop of ``pick``, or, when that donor has none, of another donor drawn as
        :func:`.composites.pick_partner` draws (same class first, never ``exclude``)."""
        while (plain := self.plain(pick)) is None:
            got = comp.pick_partner(label, self.classes, rng, [*self.unusable, exclude])
            if got is None:
                raise comp.CompositeError("no train photo has a backdrop around its leaf to inpaint from "
                                          f"(see {UNUSABLE_DONORS})")
            pick, same = got
        return plain, pick, same

    def unusable_table(self) -> pd.DataFrame:
        rows = self.donors.rows
        return pd.DataFrame({"row_id": [str(rows.iloc[i]["row_id"]) for i in sorted(self.unusable)],
                             "rel_path": [str(rows.iloc[i]["rel_path"]) for i in sorted(self.unusable)],
                             "reason": [self.unusable[i] for i in sorted(self.unusable)]},
                            columns=["row_id", "rel_path", "reason"])


def _write_png(ch: Chapter, rel_path: str, rgb: np.ndarray) -> None:
    # PNG: lossless, so the file holds the leaf pixels exactly as composited
    import io

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    atomic_write_bytes(ch.path(f"{COMPOSITES}/{rel_path}"), buffer.getvalue())
    ch.record_output(f"{COMPOSITES}/{rel_path}")


def build(
    ch: Chapter,
    lab: LeafSet,
    field_rows: pd.DataFrame | None,
    field_root: Path | None,
    donors: LeafSet,
    seed: int,
) -> pd.DataFrame:
    """Write every composite of the three composite cells; returns their manifest (MANIFEST_COLUMNS).

    ``field_rows`` are the field cohort's admitted rows (None: no cohort, so no lab_field and no
    field_plain).  Masked field rows (``mask_rel_path``) feed ``field_plain``.
    """
    from ..core.masks import load_mask

    rng = np.random.default_rng(seed)
    backdrops = Backdrops(donors)
    manifest: list[dict[str, Any]] = []

    def add(cell: str, source: Any, image: np.ndarray, backdrop: str, backdrop_rel: str, same: bool) -> None:
        rel = f"{cell}/{source.row_id}.png"
        _write_png(ch, rel, image)
        manifest.append(
            {
                "row_id": row_id(f"{COMPOSITES}/{rel}"),
                "rel_path": rel,
                "cell": cell,
                "source_row_id": source.row_id,
                "source_rel_path": source.rel_path,
                "label": int(source.label),
                "class_name": source.class_name,
                "backdrop": backdrop,
                "backdrop_rel_path": backdrop_rel,
                "backdrop_same_class": bool(same),
            }
        )

    lab_labels = lab.rows["label"].to_numpy()
    # "another lab photo": never the leaf's own photo, should the donor pool hold it
    donor_index = {path: i for i, path in enumerate(donors.rows["rel_path"])}
    own = np.array([donor_index.get(path, -1) for path in lab.rows["rel_path"]])
    picks, same = comp.pick_partners(lab_labels, backdrops.classes, rng, exclude=own)
    for r, pick, ok, exclude in zip(lab.rows.itertuples(), picks, same, own, strict=True):
        plain, pick, ok = backdrops.draw(int(pick), bool(ok), int(r.label), int(exclude), rng)
        image = comp.composite(lab.rgb(r.rel_path), lab.masks[r.row_id], plain)
        add(
            "paste_control",
            r,
            image,
            "lab train photo, leaf inpainted",
            str(donors.rows.iloc[int(pick)]["rel_path"]),
            ok,
        )
    if field_rows is None or field_root is None or len(field_rows) == 0:
        ch.write_parquet(UNUSABLE_DONORS, backdrops.unusable_table())
        return pd.DataFrame(manifest, columns=MANIFEST_COLUMNS)
    field_labels = field_rows["label"].to_numpy()
    picks, same = comp.pick_partners(lab_labels, field_labels, rng)
    for r, pick, ok in zip(lab.rows.itertuples(), picks, same, strict=True):
        backdrop_rel = str(field_rows.iloc[int(pick)]["rel_path"])
        field_rgb = np.asarray(imaging.open_rgb(field_root / backdrop_rel), dtype=np.uint8)
        add(
            "lab_field",
            r,
            comp.lab_field(lab.rgb(r.rel_path), lab.masks[r.row_id], field_rgb),
            "field photograph",
            backdrop_rel,
            ok,
        )
    masked = field_rows[field_rows["mask_rel_path"].notna()]
    picks, same = comp.pick_partners(masked["label"].to_numpy(), backdrops.classes, rng)
    for r, pick, ok in zip(masked.itertuples(), picks, same, strict=True):
        leaf_rgb = np.asarray(imaging.open_rgb(field_root / r.rel_path), dtype=np.uint8)
        leaf_mask = np.asarray(load_mask(field_root / r.mask_rel_path), dtype=bool)
        if leaf_mask.shape != leaf_rgb.shape[:2] or not leaf_mask.any():
            continue  # a mask that does not fit its photo cannot define the leaf; counted by the chapter
        plain, pick, ok = backdrops.draw(int(pick), bool(ok), int(r.label), -1, rng)
        add(
            "field_plain",
            r,
            comp.composite(leaf_rgb, leaf_mask, plain),
            "lab train photo, leaf inpainted",
            str(donors.rows.iloc[int(pick)]["rel_path"]),
            ok,
        )
    ch.write_parquet(UNUSABLE_DONORS, backdrops.unusable_table())
    return pd.DataFrame(manifest, columns=MANIFEST_COLUMNS)


def cell_frames(
    lab_records: dict[str, pd.DataFrame],
    lab_rows: pd.DataFrame,
    field_records: dict[str, pd.DataFrame] | None,
    swap_records: dict[str, pd.DataFrame],
    manifest: pd.DataFrame,
) -> dict[str, dict[str, pd.DataFrame]]:
    """state → cell → (source_row_id, label, pred) of every cell with rows."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for state, lab_record in lab_records.items():
        cells: dict[str, pd.DataFrame] = {}
        plain = lab_record.set_index("row_id").loc[lab_rows["row_id"]]
        cells["lab_plain"] = pd.DataFrame(
            {
                "source_row_id": lab_rows["row_id"].to_numpy(),
                "label": plain["label"].to_numpy(),
                "pred": plain["pred"].to_numpy(),
            }
        )
        if field_records is not None and len(field_records[state]):
            rec = field_records[state]
            cells["field_field"] = pd.DataFrame(
                {
                    "source_row_id": rec["row_id"].to_numpy(),
                    "label": rec["label"].to_numpy(),
                    "pred": rec["pred"].to_numpy(),
                }
            )
        swap = swap_records.get(state)
        if swap is not None and len(swap):
            joined = manifest[["row_id", "cell", "source_row_id"]].merge(
                swap[["row_id", "label", "pred"]], on="row_id", validate="1:1"
            )
            for cell, frame in joined.groupby("cell"):
                cells[str(cell)] = frame[["source_row_id", "label", "pred"]].reset_index(drop=True)
        out[state] = cells
    return out
