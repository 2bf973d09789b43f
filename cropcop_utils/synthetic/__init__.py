"""The embedded synthetic corpus: a seeded plant-health image folder with its planted truth.

* :mod:`.world` — what is drawn: sources, crops, classes and their cues.
* :mod:`.leaves` — the subject's canvas and shape (leaf outlines, the banana hand); :mod:`.lesions` —
  one lesion pattern per condition; :mod:`.drawing` — the photograph around them (pose, backdrop,
  light, noise): :func:`render_upright`.
* :mod:`.field` — the cluttered field cohort of chapter 10, with the leaf's true masks.
* :mod:`.plan` — the parameters (:data:`DEFAULTS`), the long tail of class sizes and the plan of every
  file: which originals get which planted copies.
* :mod:`.planting` — the kinds of planted copy (:data:`TRANSFORMS`, :data:`RESHOT_KINDS`,
  :data:`PAIR_KINDS`) and the pixels each transform produces.
* :mod:`.generator` — rendering and writing the folders, ``planted.json`` and the safety rules
  (:func:`generate`, :func:`ensure_corpus`, :func:`load_truth`).
* :mod:`.relations` — the planted relations read back from a truth (pairs, groups, label conflicts).
* :mod:`.errors` — the generator's errors.

Callers use this package's names; the public API is re-exported here.
"""
from .errors import SyntheticCorpusConflict, SyntheticError, SyntheticParamsError, SyntheticTruthError
from .generator import (
    CORPUS_DIR,
    FIELD_DIR,
    GENERATOR,
    GENERATOR_VERSION,
    MASKS_DIR,
    OUTPUT_DIRS,
    PARTIAL_PREFIX,
    PENDING_NAME,
    TRUTH_NAME,
    corpus_matches,
    ensure_corpus,
    generate,
    lab_mask_paths,
    lab_mask_rel_path,
    listed_files,
    load_truth,
    params_fingerprint,
    render_upright,
)
from .plan import DEFAULTS, SPLITS, class_sizes, resolve_params
from .planting import GEOMETRIC_TRANSFORMS, HASH_NEAR_TRANSFORMS, PAIR_KINDS, RESHOT_KINDS, TRANSFORMS
from .relations import label_conflicts, planted_groups, planted_pairs
from .world import SOURCES

__all__ = [
    "CORPUS_DIR", "DEFAULTS", "FIELD_DIR", "GENERATOR", "GENERATOR_VERSION", "GEOMETRIC_TRANSFORMS",
    "HASH_NEAR_TRANSFORMS", "MASKS_DIR", "OUTPUT_DIRS", "PAIR_KINDS", "PARTIAL_PREFIX", "PENDING_NAME",
    "RESHOT_KINDS", "SOURCES", "SPLITS", "TRANSFORMS", "TRUTH_NAME",
    "SyntheticCorpusConflict", "SyntheticError", "SyntheticParamsError", "SyntheticTruthError",
    "class_sizes", "corpus_matches", "ensure_corpus", "generate", "lab_mask_paths", "lab_mask_rel_path",
    "label_conflicts", "listed_files", "load_truth", "params_fingerprint", "planted_groups",
    "planted_pairs", "render_upright", "resolve_params",
]
