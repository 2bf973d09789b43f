"""The embedded synthetic corpus: what is drawn (:mod:`.world`), how a photograph is rendered
(:mod:`.drawing`), the cluttered field cohort (:mod:`.field`), and the generator that plans the corpus,
plants its duplicates and writes ``planted.json`` (:mod:`.generator`).

Callers use this package's names; the generator's public API is re-exported here.
"""
from .generator import (
    CORPUS_DIR,
    DEFAULTS,
    FIELD_DIR,
    GENERATOR,
    GENERATOR_VERSION,
    GEOMETRIC_TRANSFORMS,
    HASH_NEAR_TRANSFORMS,
    MASKS_DIR,
    OUTPUT_DIRS,
    PAIR_KINDS,
    PARTIAL_PREFIX,
    PENDING_NAME,
    RESHOT_KINDS,
    SOURCES,
    SPLITS,
    TRANSFORMS,
    TRUTH_NAME,
    SyntheticCorpusConflict,
    SyntheticError,
    SyntheticParamsError,
    SyntheticTruthError,
    class_sizes,
    corpus_matches,
    ensure_corpus,
    generate,
    lab_mask_paths,
    lab_mask_rel_path,
    label_conflicts,
    listed_files,
    load_truth,
    params_fingerprint,
    planted_groups,
    planted_pairs,
    render_upright,
    resolve_params,
)

__all__ = [
    "CORPUS_DIR", "DEFAULTS", "FIELD_DIR", "GENERATOR", "GENERATOR_VERSION", "GEOMETRIC_TRANSFORMS",
    "HASH_NEAR_TRANSFORMS", "MASKS_DIR", "OUTPUT_DIRS", "PAIR_KINDS", "PARTIAL_PREFIX", "PENDING_NAME",
    "RESHOT_KINDS", "SOURCES", "SPLITS", "TRANSFORMS", "TRUTH_NAME",
    "SyntheticCorpusConflict", "SyntheticError", "SyntheticParamsError", "SyntheticTruthError",
    "class_sizes", "corpus_matches", "ensure_corpus", "generate", "lab_mask_paths", "lab_mask_rel_path",
    "label_conflicts", "listed_files", "load_truth", "params_fingerprint", "planted_groups",
    "planted_pairs", "render_upright", "resolve_params",
]
