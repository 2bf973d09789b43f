"""Chapter 1 — Corpus: scan every file, quarantine what cannot be used, name the classes.

Layouts (detected from the corpus root's visible top-level folders):

* ``flat`` — ``PATH/<class>/<image>``; every row's inherited split is ``"none"``.
* ``split`` — ``PATH/{train,val,test}/<class>/<image>``, any subset of the three (folder names are
  matched case-insensitively; ``valid`` / ``validation`` count as ``val``).

A mix of split folders and class folders, a split folder holding images but no class folders, or a
corpus with no image at the layout's depth is refused with :class:`CorpusLayoutError`.

Every regular file under the root is *seen* and gets one manifest row; nothing is skipped.  A row is
admitted only if it passes every check; otherwise it carries the first reason that applies:

``outside_corpus`` (a symbolic link whose real path leaves the corpus root: the file, or the linked
folder, is never opened), ``os_junk`` (``.DS_Store``, ``Thumbs.db``, AppleDouble ``._*``,
``__MACOSX/``…), ``hidden`` (a dot file or a file in a dot folder), ``outside_layout`` (a file at the
wrong depth: at the root, directly in a split folder, or in a sub-folder of a class), ``zero_byte``,
``not_an_image``, ``decompression_bomb`` (more pixels than the profile's ``corpus.max_image_pixels``),
``truncated``, ``unreadable`` (any other decoder failure, including the RGB conversion of the loading
contract), and ``class_below_min_support`` (the file is fine but its class has fewer than
``corpus.min_class_support`` such files, over all splits).  The first four extend the contract's
list: they keep the identity ``files_seen == admitted + quarantined`` true without silent skips.

Sampling (``corpus.sample_fraction``, folder corpora only): a file whose content SHA-256, read as a
fraction of 2**256, is at or above the fraction is *not sampled*: listed in ``not_sampled.parquet``
instead of the manifest, so ``files_seen == admitted + quarantined + not_sampled``.  Byte-identical
copies share a hash, so they are in or out together; with ``corpus.sample_keeps_cross_split_copies``
every copy whose bytes also occur in another inherited split is kept, so the leakage the audit exists
to find is never sampled away.

A file is decoded exactly as :mod:`cropcop_utils.imaging` decodes it for a model (full ``load()``,
truncated files refused, then the RGB conversion), so an admitted file is a loadable file.

Symbolic links are resolved once.  A file link inside the root is probed like any file (through the
link) and its row says ``is_link``.  Folders are walked without following links: a folder link whose
target lies inside the root is not descended, because every file there is already listed once at its
real path (link cycles therefore cannot loop or duplicate rows); a folder link that leaves the root is
one ``outside_corpus`` row and is never entered.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from tqdm import tqdm

from . import imaging, taxonomy
from .config import progress_wanted
from .evidence import Chapter, sha256_bytes, sha256_file, sha256_json
from .evidence import row_id as make_row_id

SPLITS = ("train", "val", "test")
NO_SPLIT = "none"
SPLIT_ALIASES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
LAYOUT_REASONS = ("os_junk", "hidden", "outside_layout")
OUTSIDE_REASON = "outside_corpus"
CLASS_REASON = "class_below_min_support"
# Order = precedence: a file gets the first reason that applies.
REASONS = (OUTSIDE_REASON, *LAYOUT_REASONS, "zero_byte", "not_an_image", "decompression_bomb", "truncated",
           "unreadable", CLASS_REASON)
OS_JUNK_FILES = frozenset({".ds_store", "thumbs.db", "ehthumbs.db", "desktop.ini", ".directory",
                           "icon\r"})
OS_JUNK_DIRS = frozenset({"__macosx", ".spotlight-v100", ".trashes", ".fseventsd", "$recycle.bin",
                          "system volume information", ".ipynb_checkpoints"})
MANIFEST_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "bytes", "sha256", "format",
                    "width", "height", "mode", "exif_orientation", "exif_make", "exif_model",
                    "decode_status", "error", "admitted", "quarantine_reason", "is_link"]
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "reason", "detail"]
NOT_SAMPLED_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "bytes", "sha256"]
INLINE_BELOW = 200  # smaller corpora are scanned in-process: a pool costs more than it saves
HASH_STREAM_ABOVE = imaging.IN_MEMORY_BYTES


class CorpusSampleError(ValueError):
    """``corpus.sample_fraction`` is not a number in (0, 1] (or null for the whole corpus)."""


class CorpusLayoutError(ValueError):
    """The corpus folder is not ``PATH/<class>/<images>`` nor ``PATH/{train,val,test}/<class>/<images>``."""


# --------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    kind: str  # "flat" | "split"
    split_folders: dict[str, str] = field(default_factory=dict)  # folder name → split

    @property
    def depth(self) -> int:
        """Path parts of an in-layout file (class/file, or split/class/file)."""
        return 3 if self.kind == "split" else 2

    def describe(self) -> str:
        if self.kind == "flat":
            return "PATH/<class>/<images> (no inherited split)"
        return "PATH/{" + ",".join(sorted(self.split_folders)) + "}/<class>/<images>"


def _is_junk_name(name: str) -> bool:
    low = name.lower()
    return low in OS_JUNK_FILES or name.startswith("._")


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name.lower() not in OS_JUNK_DIRS)


def detect_layout(root: str | os.PathLike) -> Layout:
    """Which of the two layouts ``root`` uses; :class:`CorpusLayoutError` when neither fits."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusLayoutError(f"corpus folder {root} does not exist or is not a folder")
    top = _visible_dirs(root)
    if not top:
        raise CorpusLayoutError(
            f"{root} has no class folders: expected PATH/<class>/<images> or "
            "PATH/{train,val,test}/<class>/<images>"
        )
    split_dirs = [d for d in top if d.name.lower() in SPLIT_ALIASES]
    if not split_dirs:
        return Layout("flat")
    others = [d.name for d in top if d not in split_dirs]
    if others:
        raise CorpusLayoutError(
            f"{root} mixes split folders ({', '.join(d.name for d in split_dirs)}) with other folders "
            f"({', '.join(others[:5])}{'…' if len(others) > 5 else ''}): use either PATH/<class>/<images> "
            "or PATH/{train,val,test}/<class>/<images>, not both"
        )
    mapping: dict[str, str] = {}
    for folder in split_dirs:
        split = SPLIT_ALIASES[folder.name.lower()]
        clash = [name for name, s in mapping.items() if s == split]
        if clash:
            raise CorpusLayoutError(
                f"{root}: folders {clash[0]!r} and {folder.name!r} both mean split {split!r}; keep one")
        if not _visible_dirs(folder):
            raise CorpusLayoutError(
                f"{folder} has no class folders. In the split layout every split folder holds "
                f"<class>/<images>; if {folder.name!r} is a class, rename it (it is a reserved split name)"
            )
        mapping[folder.name] = split
    return Layout("split", mapping)


@dataclass(frozen=True)
class FileEntry:
    rel_path: str
    class_name: str | None
    inherited_split: str
    layout_reason: str | None
    layout_detail: str | None
    is_link: bool = False


def _outside_target(path: Path, real_root: Path) -> Path | None:
    """Where a link really leads when that is outside ``real_root``; None when it stays inside."""
    target = Path(os.path.realpath(path))
    return None if target.is_relative_to(real_root) else target


def _walk_files(root: Path) -> Iterable[tuple[tuple[str, ...], bool, Path | None]]:
    """(path parts, is a link, real target outside the root or None) of every file under root.

    Real folders only (``os.walk`` does not follow folder links): a folder link inside the root leads to
    files listed at their real path anyway, one outside it is yielded as a single entry, never entered.
    """
    real_root = root.resolve()
    for current, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(current)
        base = here.relative_to(root).parts
        folder_links = [d for d in dirnames if (here / d).is_symlink()]
        for name in sorted(filenames + [d for d in folder_links if _outside_target(here / d, real_root)]):
            path = here / name
            link = path.is_symlink()
            yield base + (name,), link, _outside_target(path, real_root) if link else None


def list_files(root: str | os.PathLike, layout: Layout | None = None) -> tuple[list[FileEntry], list[str]]:
    """Every file under ``root`` placed in the layout, and the class folders (relative paths) that hold
    no file directly."""
    root = Path(root)
    layout = layout or detect_layout(root)
    entries = []
    for parts, is_link, outside in _walk_files(root):
        rel_path = "/".join(parts)
        split = NO_SPLIT
        class_index = 0
        if layout.kind == "split" and len(parts) > 1 and parts[0] in layout.split_folders:
            split = layout.split_folders[parts[0]]
            class_index = 1
        # Only a visible folder at class depth (under a split folder in the split layout) is a class.
        class_name = parts[class_index] if len(parts) > class_index + 1 else None
        if class_name is not None and (
            (layout.kind == "split" and class_index == 0) or class_name.startswith(".")
            or class_name.lower() in OS_JUNK_DIRS
        ):
            class_name = None
        reason = detail = None
        if outside is not None:
            reason = OUTSIDE_REASON
            detail = (f"symbolic link to {_storable(str(outside))[0]}, outside the corpus root: never "
                      "opened; copy the file into the corpus or point --data at the folder that holds it")
        elif any(p.lower() in OS_JUNK_DIRS for p in parts[:-1]) or _is_junk_name(parts[-1]):
            reason, detail = "os_junk", "operating-system metadata file, not part of the corpus"
        elif any(p.startswith(".") for p in parts):
            reason, detail = "hidden", "hidden file or file in a hidden folder"
        elif len(parts) != layout.depth:
            reason = "outside_layout"
            detail = (f"file at depth {len(parts)}; the {layout.kind} layout keeps images at "
                      f"{layout.describe()}")
        entries.append(FileEntry(rel_path, class_name, split, reason, detail, is_link))
    empty_classes = []
    class_parents = [root] if layout.kind == "flat" else [root / name for name in layout.split_folders]
    for parent in class_parents:
        for folder in _visible_dirs(parent):
            if folder.is_symlink():  # its files are listed at their real path, or it is outside_corpus
                continue
            if not any(child.is_file() for child in folder.iterdir()):
                empty_classes.append(folder.relative_to(root).as_posix())
    in_layout = sum(e.layout_reason is None for e in entries)
    if in_layout == 0:
        sample = ", ".join(e.rel_path for e in entries[:3]) or "no files at all"
        raise CorpusLayoutError(
            f"{root}: no file sits where the {layout.kind} layout expects images ({layout.describe()}); "
            f"found {len(entries)} files elsewhere (e.g. {sample})"
        )
    return entries, sorted(empty_classes)


# --------------------------------------------------------------------------- per-file probe
def _hash_file(path: Path, size: int) -> tuple[str, bytes | None]:
    if size > HASH_STREAM_ABOVE:
        return sha256_file(path), None
    data = path.read_bytes()
    return sha256_bytes(data), data


def probe_file(path: str | os.PathLike, max_image_pixels: int | None = None) -> dict[str, Any]:
    """Bytes, SHA-256, header fields and decode outcome of one file (decoded as the contract does)."""
    path = Path(path)
    row: dict[str, Any] = {"bytes": None, "sha256": None, "format": None, "width": None, "height": None,
                           "mode": None, "exif_orientation": None, "exif_make": None, "exif_model": None,
                           "decode_status": "error", "error": None, "decode_reason": None}
    try:
        row["bytes"] = path.stat().st_size
        row["sha256"], data = _hash_file(path, row["bytes"])
    except OSError as error:
        row.update(error=imaging.describe_error(error), decode_reason="unreadable")
        return row
    header: dict[str, Any] = {}
    try:
        image = imaging.open_decoded(data if data is not None else path, max_image_pixels, path=path,
                                     header=header)
        imaging.to_rgb(image)
        row["decode_status"] = "ok"
    except imaging.ImageLoadError as error:
        row.update(error=error.detail, decode_reason=error.reason)
    except Exception as error:  # a mode the RGB conversion cannot handle
        row.update(error=imaging.describe_error(error), decode_reason="unreadable")
    row.update({k: header[k] for k in header if k in row})
    return row


def _probe_chunk(root: str, rel_paths: list[str], max_image_pixels: int | None) -> list[dict[str, Any]]:
    return [probe_file(Path(root) / rel, max_image_pixels) for rel in rel_paths]


def probe_all(
    root: str | os.PathLike,
    rel_paths: list[str],
    max_image_pixels: int | None,
    workers: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Probe files in parallel (process pool over chunks of files), results in input order."""
    workers = max(1, int(workers or os.cpu_count() or 1))
    bar = tqdm(total=len(rel_paths), desc="scanning corpus", unit="file",
               disable=not progress_wanted(progress), mininterval=1.0)
    with bar:
        if workers == 1 or len(rel_paths) < INLINE_BELOW:
            results = []
            for rel in rel_paths:
                results.append(probe_file(Path(root) / rel, max_image_pixels))
                bar.update(1)
            return results
        size = max(16, min(512, math.ceil(len(rel_paths) / (workers * 16))))
        chunks = [rel_paths[i:i + size] for i in range(0, len(rel_paths), size)]
        out: list[list[dict[str, Any]] | None] = [None] * len(chunks)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_probe_chunk, str(root), chunk, max_image_pixels): i
                       for i, chunk in enumerate(chunks)}
            for future in as_completed(futures):
                index = futures[future]
                out[index] = future.result()
                bar.update(len(chunks[index]))
    return [row for chunk in out for row in chunk or []]


def _probe_inside(root: Path, entries: list[FileEntry], max_image_pixels: int | None, workers: int | None,
                  progress: bool) -> list[dict[str, Any]]:
    """:func:`probe_all` over the entries inside the root; an ``outside_corpus`` entry is never opened."""
    inside = [e.rel_path for e in entries if e.layout_reason != OUTSIDE_REASON]
    probed = iter(probe_all(root, inside, max_image_pixels, workers, progress))
    unopened = {"bytes": None, "sha256": None, "format": None, "width": None, "height": None, "mode": None,
                "exif_orientation": None, "exif_make": None, "exif_model": None, "error": None,
                "decode_status": "not_opened", "decode_reason": None}
    return [dict(unopened) if e.layout_reason == OUTSIDE_REASON else next(probed) for e in entries]


# --------------------------------------------------------------------------- scan
@dataclass
class ScanResult:
    root: Path
    layout: Layout
    manifest: pd.DataFrame
    quarantine: pd.DataFrame
    class_map: dict[str, Any]
    empty_class_folders: list[str]
    seconds: float
    workers: int
    not_sampled: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NOT_SAMPLED_COLUMNS))


def _storable(rel_path: str) -> tuple[str, bool]:
    """A UTF-8-safe path for Parquet, and whether the name had to be escaped."""
    try:
        rel_path.encode("utf-8")
        return rel_path, True
    except UnicodeEncodeError:
        return rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"), False


def in_sample(sha256_hex: str, fraction: float | None) -> bool:
    """Whether content with this SHA-256 is in a ``fraction`` sample (None: everything is)."""
    # The hash read as a number in [0, 1): uniform, deterministic, equal for byte-identical copies.
    return fraction is None or int(sha256_hex, 16) < fraction * 2**256


def sample_entries(root: Path, entries: list[FileEntry], fraction: float | None,
                   keep_cross_split_copies: bool = True) -> tuple[list[FileEntry], pd.DataFrame]:
    """The entries the sample keeps, and the not-sampled in-layout files (hashed, listed)."""
    if fraction is None:
        return entries, pd.DataFrame(columns=NOT_SAMPLED_COLUMNS)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise CorpusSampleError(f"corpus.sample_fraction must be in (0, 1] or null, got {fraction!r}")
    hashed: dict[str, tuple[str, int]] = {}
    for entry in entries:
        if entry.layout_reason is None:
            try:
                path = root / entry.rel_path
                hashed[entry.rel_path] = (sha256_file(path), path.stat().st_size)
            except OSError:
                continue  # kept: the probe quarantines it as unreadable, with the error
    splits_of: dict[str, set[str]] = {}
    for entry in entries:
        if entry.rel_path in hashed:
            splits_of.setdefault(hashed[entry.rel_path][0], set()).add(entry.inherited_split)
    kept, left_out = [], []
    for entry in entries:
        sha, size = hashed.get(entry.rel_path, (None, None))
        if sha is None or in_sample(sha, float(fraction)) or (
                keep_cross_split_copies and len(splits_of[sha] - {NO_SPLIT}) > 1):
            kept.append(entry)
        else:
            rel_path = _storable(entry.rel_path)[0]
            left_out.append({"row_id": make_row_id(rel_path), "rel_path": rel_path,
                             "class_name": entry.class_name, "inherited_split": entry.inherited_split,
                             "bytes": size, "sha256": sha})
    return kept, pd.DataFrame(left_out, columns=NOT_SAMPLED_COLUMNS)


def scan_corpus(
    root: str | os.PathLike,
    min_class_support: int = 2,
    max_image_pixels: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    sample_fraction: float | None = None,
    keep_cross_split_copies: bool = True,
) -> ScanResult:
    """Scan, probe and quarantine every file under ``root`` (or its content-hash sample); build the
    class map."""
    root = Path(root).resolve()
    start = time.perf_counter()
    layout = detect_layout(root)
    entries, empty_classes = list_files(root, layout)
    entries, not_sampled = sample_entries(root, entries, sample_fraction, keep_cross_split_copies)
    probes = _probe_inside(root, entries, max_image_pixels, workers, progress)

    rows = []
    details = []
    for entry, probe in zip(entries, probes, strict=True):
        rel_path, utf8 = _storable(entry.rel_path)
        reason, detail = entry.layout_reason, entry.layout_detail
        if reason is None and not utf8:
            reason, detail = "unreadable", "file name is not valid UTF-8; rename the file"
        if reason is None and probe["decode_reason"] is not None:
            reason, detail = probe["decode_reason"], probe["error"]
        row = {k: probe[k] for k in MANIFEST_COLUMNS if k in probe}
        rows.append({**row, "row_id": make_row_id(rel_path), "rel_path": rel_path,
                     "class_name": None if entry.class_name is None else _storable(entry.class_name)[0],
                     "inherited_split": entry.inherited_split, "quarantine_reason": reason,
                     "is_link": entry.is_link})
        details.append(detail)
    manifest = pd.DataFrame(rows)
    manifest["detail"] = details

    # Class support counts only the files that passed every file-level check.
    eligible = manifest[manifest["quarantine_reason"].isna() & manifest["class_name"].notna()]
    support = eligible.groupby("class_name").size()
    weak = support[support < min_class_support]
    weak_rows = manifest["quarantine_reason"].isna() & manifest["class_name"].isin(weak.index)
    manifest.loc[weak_rows, "quarantine_reason"] = CLASS_REASON
    manifest.loc[weak_rows, "detail"] = manifest.loc[weak_rows, "class_name"].map(
        lambda c: f"class {c!r} has {int(support[c])} admissible image(s) < corpus.min_class_support "
                  f"{min_class_support}")
    manifest["admitted"] = manifest["quarantine_reason"].isna()
    manifest = _typed_manifest(manifest)

    quarantine = manifest.loc[~manifest["admitted"]].rename(columns={"quarantine_reason": "reason"})
    quarantine = quarantine[QUARANTINE_COLUMNS].reset_index(drop=True)
    manifest = manifest[MANIFEST_COLUMNS]

    admitted_support = support[support >= min_class_support]
    weak_classes = [{"name": c, "reason": CLASS_REASON, "support": int(n)} for c, n in weak.items()]
    classes_with_files = set(manifest["class_name"].dropna())
    weak_classes += [{"name": c, "reason": CLASS_REASON, "support": 0}
                     for c in sorted(({Path(e).name for e in empty_classes} | classes_with_files)
                                     - set(support.index))]
    class_map = taxonomy.build_class_map(admitted_support.to_dict(), weak_classes)
    return ScanResult(root=root, layout=layout, manifest=manifest, quarantine=quarantine,
                      class_map=class_map, empty_class_folders=empty_classes,
                      seconds=time.perf_counter() - start,
                      workers=max(1, int(workers or os.cpu_count() or 1)), not_sampled=not_sampled)


def _typed_manifest(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values("rel_path", kind="stable").reset_index(drop=True)
    for column in ("bytes", "width", "height", "exif_orientation"):
        frame[column] = pd.array(frame[column], dtype="Int64")
    for column in ("class_name", "sha256", "format", "mode", "exif_make", "exif_model", "error",
                   "quarantine_reason", "detail"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    frame["admitted"] = frame["admitted"].astype(bool)
    frame["is_link"] = frame["is_link"].astype(bool)
    return frame


# --------------------------------------------------------------------------- tables
def support_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per class folder: files seen, admissible (passed file checks), admitted, status."""
    frame = manifest[manifest["class_name"].notna()]
    admissible = frame["admitted"] | (frame["quarantine_reason"] == CLASS_REASON)
    table = pd.DataFrame({
        "files_seen": frame.groupby("class_name").size(),
        "admissible": frame[admissible].groupby("class_name").size(),
        "admitted": frame[frame["admitted"]].groupby("class_name").size(),
    }).fillna(0).astype(int)
    table["status"] = ["admitted" if n else "quarantined" for n in table["admitted"]]
    total = table["admitted"].sum()
    table["share_of_admitted"] = table["admitted"] / total if total else 0.0
    table = table.rename_axis("class_name").reset_index()
    return table.sort_values(["admissible", "class_name"], ascending=[False, True]).reset_index(drop=True)


def split_support_table(manifest: pd.DataFrame) -> pd.DataFrame:
    """Admitted images per class × inherited split, with a total column."""
    admitted = manifest[manifest["admitted"]]
    table = pd.crosstab(admitted["class_name"], admitted["inherited_split"])
    order = [s for s in (*SPLITS, NO_SPLIT) if s in table.columns]
    table = table.reindex(columns=order).fillna(0).astype(int)
    table["total"] = table.sum(axis=1)
    table.columns.name = None
    return table.rename_axis("class_name").reset_index()


def reason_counts(manifest: pd.DataFrame) -> dict[str, int]:
    """Quarantined files per reason, every known reason listed (zeros included)."""
    counts = manifest["quarantine_reason"].value_counts()
    return {reason: int(counts.get(reason, 0)) for reason in REASONS}


def imbalance(support: Mapping[str, int]) -> dict[str, Any]:
    """Largest and smallest class and their ratio over the given (admitted) supports."""
    if not support:
        return {"largest_class": None, "largest_support": 0, "smallest_class": None, "smallest_support": 0,
                "largest_to_smallest": None}
    ordered = sorted(support.items(), key=lambda kv: (-kv[1], kv[0]))
    (big, n_big), (small, n_small) = ordered[0], ordered[-1]
    return {"largest_class": big, "largest_support": int(n_big), "smallest_class": small,
            "smallest_support": int(n_small), "largest_to_smallest": n_big / n_small}


def plot_class_support(table: pd.DataFrame, min_class_support: int | None = None) -> Figure:
    """Horizontal bars of admissible images per class; quarantined classes in grey (log scale if skewed)."""
    table = table.sort_values(["admissible", "class_name"], ascending=[True, False])
    height = max(2.5, 0.22 * len(table) + 1.2)
    fig = Figure(figsize=(8, height))
    ax = fig.subplots()
    colours = ["#3b7d3b" if s == "admitted" else "#9e9e9e" for s in table["status"]]
    ax.barh(table["class_name"], table["admissible"].clip(lower=0.8), color=colours)
    positive = table.loc[table["admissible"] > 0, "admissible"]
    if len(positive) and positive.max() / positive.min() >= 10:
        ax.set_xscale("log")
    if min_class_support:
        ax.axvline(min_class_support, color="#b22222", linestyle="--", linewidth=1,
                   label=f"min_class_support = {min_class_support}")
        ax.legend(loc="lower right", fontsize=8)
    for y, value in enumerate(table["admissible"]):
        ax.text(value if value > 0 else 0.8, y, f" {value}", va="center", fontsize=7)
    ax.set_xlabel("images that passed the file checks (grey: class quarantined)")
    ax.set_title(f"Class support ({int((table['status'] == 'admitted').sum())} admitted classes)")
    ax.tick_params(axis="y", labelsize=7 if len(table) > 30 else 8)
    ax.margins(x=0.12)
    fig.tight_layout()
    return fig


def plot_contract_examples(manifest: pd.DataFrame, corpus_root: str | os.PathLike, size: int,
                           n: int = 6) -> Figure:
    """Stored pixels (top) next to what the loading contract hands a model (bottom).

    EXIF-rotated and non-square files are shown first, because that is where the contract acts.
    """
    admitted = manifest[manifest["admitted"]]
    rotated = admitted[admitted["exif_orientation"].fillna(1).astype(int) != 1]
    oblong = admitted[admitted["width"] != admitted["height"]]
    spread = admitted.iloc[:: max(1, len(admitted) // n)]
    picks = pd.concat([rotated.head(2), oblong.head(2), spread]).drop_duplicates("rel_path").head(n)
    fig = Figure(figsize=(1.9 * max(len(picks), 1), 4.4))
    axes = fig.subplots(2, max(len(picks), 1), squeeze=False)
    for column, (_, row) in enumerate(picks.iterrows()):
        path = Path(corpus_root) / row["rel_path"]
        stored = imaging.open_decoded(path).convert("RGB")  # no EXIF transpose, no padding
        orientation = "" if pd.isna(row["exif_orientation"]) else f", EXIF {int(row['exif_orientation'])}"
        axes[0, column].imshow(stored)
        axes[0, column].set_title(f"{row['class_name'][:22]}\n{row['width']}×{row['height']}{orientation}",
                                  fontsize=7)
        axes[1, column].imshow(imaging.load_array(path, size))
        axes[1, column].set_title(f"contract {size}×{size}", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_ylabel("stored", fontsize=8)
    axes[1, 0].set_ylabel("loaded", fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- synthetic cross-check
def planted_check(manifest: pd.DataFrame, truth: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the synthetic generator's ``planted.json`` with what the scan found.

    Checked: every planted file was seen (and nothing else); each planted broken file is quarantined
    for the planted reason and no unbroken file is quarantined for a file-level reason; the singleton
    class is quarantined as below minimum support; the EXIF orientations read match the planted ones;
    the naming rules give the planted crop / condition / type / pest / fruit of every class.
    """
    files = {f["rel_path"]: f for f in truth["files"]}
    by_path = manifest.set_index("rel_path")
    seen = set(by_path.index)
    broken = [{"rel_path": rel, "planted": f["broken_kind"],
               "found": by_path.at[rel, "quarantine_reason"] if rel in seen else "not_seen"}
              for rel, f in sorted(files.items()) if f.get("broken_kind")]
    file_level = set(REASONS) - {CLASS_REASON}
    unplanted = sorted(rel for rel, reason in by_path["quarantine_reason"].items()
                       if reason in file_level and not (rel in files and files[rel].get("broken_kind")))
    singletons = sorted(c["name"] for c in truth.get("classes", []) if c.get("singleton"))
    weak = sorted(set(manifest.loc[manifest["quarantine_reason"] == CLASS_REASON, "class_name"]))
    orientation_mismatch = []
    for rel, f in sorted(files.items()):
        if rel in seen and by_path.at[rel, "decode_status"] == "ok":
            found = by_path.at[rel, "exif_orientation"]
            found = None if pd.isna(found) else int(found)
            if (f.get("exif_orientation") or 1) != (found or 1):
                orientation_mismatch.append({"rel_path": rel, "planted": f.get("exif_orientation"),
                                             "found": found})
    taxonomy_mismatch = []
    for c in truth.get("classes", []):
        info = taxonomy.classify(c["name"])
        got = {k: getattr(info, k) for k in ("crop", "condition", "type", "pest", "fruit")}
        want = {k: c.get(k) for k in got}
        if got != want:
            taxonomy_mismatch.append({"name": c["name"], "planted": want, "rules": got})
    result = {
        "planted_files": len(files),
        "missing_from_scan": sorted(set(files) - seen),
        "not_in_planted": sorted(seen - set(files)),
        "planted_broken": len(broken),
        "broken_matched": sum(b["found"] == b["planted"] for b in broken),
        "broken": broken,
        "quarantined_not_planted": unplanted,
        "planted_singleton_classes": singletons,
        "quarantined_small_classes": weak,
        "exif_rotated_planted": sum((f.get("exif_orientation") or 1) != 1 for f in files.values()),
        "exif_orientation_mismatches": orientation_mismatch,
        "taxonomy_mismatches": taxonomy_mismatch,
    }
    result["all_match"] = (not result["missing_from_scan"] and not result["not_in_planted"]
                           and result["broken_matched"] == len(broken) and not unplanted
                           and singletons == weak and not orientation_mismatch and not taxonomy_mismatch)
    return result


# --------------------------------------------------------------------------- chapter
def _counts(series: pd.Series, top: int | None = None) -> dict[str, int]:
    counts = series.value_counts(dropna=False)
    return {str(k): int(v) for k, v in (counts.head(top) if top else counts).items()}


def run_chapter(ctx: Any, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Scan the run's corpus and write ``corpus/{manifest,quarantine}.parquet``, ``class_map.json``,
    ``class_support.png``, ``contract_examples.png`` and ``corpus.json``; returns the chapter record.

    ``workers`` defaults to the profile's ``audit.workers``, else the CPU count.
    """
    ch = Chapter(ctx.run_dir, "corpus")
    if ctx.is_synthetic:
        from . import synthetic

        synthetic.ensure_corpus(ctx)
    settings = ctx.section("corpus")
    min_support = int(settings.get("min_class_support", 2))
    max_pixels = settings.get("max_image_pixels")
    workers = workers or ctx.section("audit").get("workers") or os.cpu_count()
    # The synthetic corpus is generated at the profile's size (synthetic.*): it is never sampled.
    fraction = None if ctx.is_synthetic else settings.get("sample_fraction")
    keep_copies = bool(settings.get("sample_keeps_cross_split_copies", True))
    result = scan_corpus(ctx.corpus_root, min_support, max_pixels, workers, progress, fraction, keep_copies)
    manifest, not_sampled = result.manifest, result.not_sampled

    ch.write_parquet("corpus/manifest.parquet", manifest)
    ch.write_parquet("corpus/quarantine.parquet", result.quarantine)
    if fraction is not None:
        ch.write_parquet("corpus/not_sampled.parquet", not_sampled)
    ch.write_json("corpus/class_map.json", result.class_map)
    supports = support_table(manifest)
    figure = plot_class_support(supports, min_support)
    ch.save_figure(figure, "corpus/class_support.png", dpi=110)
    if manifest["admitted"].any():
        examples = plot_contract_examples(manifest, result.root, int(ctx.section("image").get("size", 64)))
        ch.save_figure(examples, "corpus/contract_examples.png", dpi=110)

    admitted = manifest[manifest["admitted"]]
    admitted_support = {c["name"]: c["support"] for c in result.class_map["classes"]}
    per_split = split_support_table(manifest).set_index("class_name")
    figures: dict[str, Any] = {
        "corpus_root": str(result.root),
        "data": ctx.data,
        "layout": result.layout.kind,
        "layout_description": result.layout.describe(),
        "split_folders": result.layout.split_folders,
        "files_seen": len(manifest) + len(not_sampled),
        "admitted": int(manifest["admitted"].sum()),
        "quarantined": int((~manifest["admitted"]).sum()),
        "not_sampled": len(not_sampled),
        "sample": {"fraction": fraction, "keeps_cross_split_copies": keep_copies,
                   "not_sampled_list": "corpus/not_sampled.parquet" if fraction is not None else None,
                   "rule": None if fraction is None else "content SHA-256 / 2**256 < fraction"},
        "identity_holds": len(manifest) + len(not_sampled)
        == int(manifest["admitted"].sum()) + len(result.quarantine) + len(not_sampled),
        "skipped": 0,
        "quarantine_reasons": reason_counts(manifest),
        "min_class_support": min_support,
        "max_image_pixels": max_pixels,
        "n_classes_seen": int(len(supports)),
        "n_classes_admitted": len(result.class_map["classes"]),
        "quarantined_classes": result.class_map["quarantined_classes"],
        "empty_class_folders": result.empty_class_folders,
        **imbalance(admitted_support),
        "per_split": {s: int(n) for s, n in admitted["inherited_split"].value_counts().items()},
        "per_class_split": {c: {s: int(n) for s, n in row.items() if s != "total"}
                            for c, row in per_split.iterrows()},
        "formats": _counts(admitted["format"]),
        "modes": _counts(admitted["mode"]),
        "sizes_top10": _counts(admitted["width"].astype(str) + "x" + admitted["height"].astype(str), 10),
        "n_distinct_sizes": int(admitted[["width", "height"]].drop_duplicates().shape[0]),
        "exif_orientations": _counts(admitted["exif_orientation"].astype("string").fillna("untagged")),
        "class_map_fingerprint": result.class_map["fingerprint"],
        "corpus_fingerprint": sha256_json(sorted(zip(admitted["rel_path"], admitted["sha256"], strict=True))),
        "taxonomy": taxonomy.taxonomy_summary(result.class_map),
        "scan": {"workers": result.workers, "seconds": round(result.seconds, 2),
                 "files_per_second": round(len(manifest) / result.seconds, 1) if result.seconds else None},
        "support_plot": "corpus/class_support.png",
        "contract_examples_plot": "corpus/contract_examples.png" if manifest["admitted"].any() else None,
    }
    if ctx.is_synthetic:
        from . import synthetic

        truth_path = ctx.planted_truth_path
        ch.inputs["synthetic/planted.json"] = sha256_file(truth_path)
        figures["planted_check"] = planted_check(manifest, synthetic.load_truth(truth_path))
    return ch.finish(figures=figures)
