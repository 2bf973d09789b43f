"""Chapter 1 — Corpus: scan every file, quarantine what cannot be used, name the classes.

The chapter's code, by topic:

* :mod:`.chapter` — support tables, imbalance, the synthetic planted check and ``run_chapter``.
* :mod:`.layout` — the two corpus layouts (flat, split), their detection and the listing of every file.
* :mod:`.quarantine` — the quarantine reasons and their precedence, OS junk names, counts per reason.
* :mod:`.probe` — the per-file probe (bytes, SHA-256, header, decode outcome), in a process pool.
* :mod:`.scan` — the whole scan of a corpus (:func:`scan_corpus`) and its content-hash sample.
* :mod:`.figures` — the class-support bars and the loading contract's examples.
* :mod:`.field_sets` — the scan of a folder of field photos in lab class folders (``scan_field``), used
  for field-train here and for the scored field cohorts in chapter 10.
* :mod:`.field_train` — the field-train photos (``--field-train``) scanned against the class map.
* :mod:`.taxonomy` — class naming rules (crop, condition, type, pest, fruit) and the class map.
"""

from .chapter import imbalance, planted_check, run_chapter, split_support_table, support_table
from .figures import plot_class_support, plot_contract_examples
from .layout import NO_SPLIT, SPLITS, CorpusLayoutError, FileEntry, Layout, detect_layout, list_files
from .probe import probe_all, probe_file
from .quarantine import CLASS_REASON, QUARANTINE_COLUMNS, REASONS, reason_counts
from .scan import MANIFEST_COLUMNS, NOT_SAMPLED_COLUMNS, CorpusSampleError, ScanResult, in_sample, scan_corpus
from .taxonomy import class_map_table

__all__ = [
    "CLASS_REASON", "MANIFEST_COLUMNS", "NOT_SAMPLED_COLUMNS", "NO_SPLIT", "QUARANTINE_COLUMNS", "REASONS",
    "SPLITS", "CorpusLayoutError", "CorpusSampleError", "FileEntry", "Layout", "ScanResult",
    "class_map_table", "detect_layout", "imbalance", "in_sample", "list_files", "planted_check",
    "plot_class_support", "plot_contract_examples", "probe_all", "probe_file", "reason_counts", "run_chapter",
    "scan_corpus", "split_support_table", "support_table",
]
