"""What is quarantined and why: the reasons a seen file is not admitted, in order of precedence, what
counts as operating-system junk, the quarantine table's columns and the count per reason.

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

The layout reasons are given by :func:`.layout.list_files`, the decode reasons by
:func:`.probe.probe_file`, and the class reason by :func:`.scan.scan_corpus`.
"""

from __future__ import annotations

import pandas as pd

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
QUARANTINE_COLUMNS = ["row_id", "rel_path", "class_name", "inherited_split", "reason", "detail"]


def _is_junk_name(name: str) -> bool:
    low = name.lower()
    return low in OS_JUNK_FILES or name.startswith("._")


def reason_counts(manifest: pd.DataFrame) -> dict[str, int]:
    """Quarantined files per reason, every known reason listed (zeros included)."""
    counts = manifest["quarantine_reason"].value_counts()
    return {reason: int(counts.get(reason, 0)) for reason in REASONS}
