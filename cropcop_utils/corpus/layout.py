"""Corpus layouts and the file listing: which of the two layouts a corpus folder uses, and every file
under it placed in that layout (with its layout reason when it sits outside it).

Layouts (detected from the corpus root's visible top-level folders):

* ``flat`` — ``PATH/<class>/<image>``; every row's inherited split is ``"none"``.
* ``split`` — ``PATH/{train,val,test}/<class>/<image>``, any subset of the three (folder names are
  matched case-insensitively; ``valid`` / ``validation`` count as ``val``).

A mix of split folders and class folders, a split folder holding images but no class folders, or a
corpus with no image at the layout's depth is refused with :class:`CorpusLayoutError`.

Symbolic links are resolved once.  A file link inside the root is probed like any file (through the
link) and its row says ``is_link``.  Folders are walked without following links: a folder link whose
target lies inside the root is not descended, because every file there is already listed once at its
real path (link cycles therefore cannot loop or duplicate rows); a folder link that leaves the root is
one ``outside_corpus`` row and is never entered.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .quarantine import OS_JUNK_DIRS, OUTSIDE_REASON, _is_junk_name

SPLITS = ("train", "val", "test")
NO_SPLIT = "none"
SPLIT_ALIASES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


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


def _storable(rel_path: str) -> tuple[str, bool]:
    """A UTF-8-safe path for Parquet, and whether the name had to be escaped."""
    try:
        rel_path.encode("utf-8")
        return rel_path, True
    except UnicodeEncodeError:
        return rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"), False
