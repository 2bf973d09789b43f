"""Chapter 4 — Probes: frozen representation, acquisition cues, split membership.

The chapter's code, by topic:

* :mod:`.chapter` — settings, the representations probed, ``run_chapter`` and the synthetic corpus's
  planted check.
* :mod:`.classifiers` — the class probe: classifiers, chance levels, bootstrap scoring against chance.
* :mod:`.membership` — the split-membership probe: out-of-fold ROC AUC of telling test from train.
* :mod:`.cues` — the acquisition cues: metadata frame, JPEG quality, thumbnail, border and corner pixels.
* :mod:`.features` — the hand-crafted frozen representation and the one pixel pass over every image.
* :mod:`.backbone` — the frozen pretrained backbone: which one (never downloaded) and its pooled features.
* :mod:`.cache` — feature arrays kept in the run folder, keyed by the split fingerprint.
* :mod:`.report` — the summary table, its plot and the notebook's text helpers.
* :mod:`.errors` — the chapter's one error type.
"""

from .backbone import BackboneChoice, extract_backbone_features, resolve_backbone
from .cache import FeatureCache
from .chapter import DEFAULTS, chapter_paths, probe_params, run_chapter
from .classifiers import chance_levels, class_probe, make_classifier, score_classes
from .cues import CUE_SETS, metadata_frame
from .errors import ProbeInputError
from .features import HANDCRAFTED, PixelSettings, extract_pixel_features
from .membership import membership_probe
from .report import describe_backbone, fmt, plot_probe_summary, results_table, summary_table

__all__ = [
    "CUE_SETS", "DEFAULTS", "HANDCRAFTED",
    "BackboneChoice", "FeatureCache", "PixelSettings", "ProbeInputError",
    "chance_levels", "chapter_paths", "class_probe", "describe_backbone", "extract_backbone_features",
    "extract_pixel_features", "fmt", "make_classifier", "membership_probe", "metadata_frame",
    "plot_probe_summary", "probe_params", "resolve_backbone", "results_table", "run_chapter",
    "score_classes", "summary_table",
]
