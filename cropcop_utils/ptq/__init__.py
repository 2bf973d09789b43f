"""Chapter 6 — Post-training quantisation: predeclared candidates chosen on validation.

The chapter's code, by topic:

* :mod:`.chapter` — settings, the compact model and its float records, one candidate's evaluation, the
  locked-test read, ``run_chapter`` / ``run_regime``.
* :mod:`.candidates` — the declared candidates, the validation gate, the selection rule, the gate figure.
* :mod:`.pt2e` — calibration rows (train only), export with a dynamic batch, the ReLU6 rewrite, quantise,
  serialise.
* :mod:`.graph_ops` — what got quantised: operator counts, stored bytes, the quantizer's patterns.
"""

from .candidates import (
    GATE_DECIMALS,
    SELECTION_RULE,
    Candidate,
    Gate,
    PTQConfigError,
    apply_gate,
    declaration,
    gate_points,
    macro_f1_drop,
    parse_candidates,
    plot_gate,
    rank_candidates,
    select_candidate,
)
from .chapter import (
    CHECKPOINT,
    DEFAULTS,
    FLOAT_TEST,
    FLOAT_VAL,
    SELECTED,
    TEST_RECORD,
    CheckpointMismatch,
    GateFailure,
    agreement,
    aligned,
    evaluate_candidate,
    float_record,
    load_compact,
    ptq_params,
    run_chapter,
    run_regime,
    score_locked_test,
)
from .graph_ops import quantised_ops, quantizer_patterns, stored_bytes, summarise_ops
from .pt2e import (
    RELU6,
    CalibrationLeak,
    assert_train_only,
    calibration_order,
    export_dynamic,
    image_batches,
    quantise,
    serialise,
    split_relu6,
)

__all__ = [
    "CHECKPOINT", "DEFAULTS", "FLOAT_TEST", "FLOAT_VAL", "GATE_DECIMALS", "RELU6", "SELECTED",
    "SELECTION_RULE", "TEST_RECORD", "CalibrationLeak", "Candidate", "CheckpointMismatch", "Gate",
    "GateFailure", "PTQConfigError", "agreement", "aligned", "apply_gate", "assert_train_only",
    "calibration_order", "declaration", "evaluate_candidate", "export_dynamic", "float_record", "gate_points",
    "image_batches", "load_compact", "macro_f1_drop", "parse_candidates", "plot_gate", "ptq_params",
    "quantise", "quantised_ops", "quantizer_patterns", "rank_candidates", "run_chapter", "run_regime",
    "score_locked_test", "select_candidate", "serialise", "split_relu6", "stored_bytes", "summarise_ops",
]
