"""Metrics against scikit-learn, the paired bootstrap, McNemar and the support bins."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score

from cropcop_utils.core import metrics

K = 6


def _fixed(n: int = 300, seed: int = 1, error_rate: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    pred = np.where(rng.random(n) < error_rate, rng.integers(0, K, n), y)
    return y, pred


def _sk(y: np.ndarray, pred: np.ndarray, labels: list[int]) -> dict[str, float]:
    return {
        "accuracy": accuracy_score(y, pred),
        "macro_f1": f1_score(y, pred, labels=labels, average="macro", zero_division=0),
        "balanced_accuracy": balanced_accuracy_score(y, pred),
        "weighted_f1": f1_score(y, pred, labels=labels, average="weighted", zero_division=0),
    }


def test_counts_reproduce_sklearn_on_full_rows() -> None:
    y, pred = _fixed()
    labels = list(range(K))
    from_counts = metrics.metrics_from_counts(*metrics.class_counts(y, pred, K), labels)
    expected = _sk(y, pred, labels)
    for name in metrics.METRICS:
        assert from_counts[name] == pytest.approx(expected[name], abs=1e-12), name
    assert metrics.state_metrics(y, pred, labels) == pytest.approx(expected)


def test_each_resample_matches_sklearn_on_the_resampled_rows() -> None:
    y, pred = _fixed(n=120, seed=3)
    labels = list(range(K))
    indices = metrics.bootstrap_indices(len(y), 20, seed=7)
    result = metrics.bootstrap_metrics(y, pred, labels, K, indices)
    for b in range(indices.shape[0]):
        rows = indices[b]
        # A resample can miss a class entirely; scikit-learn then warns about balanced accuracy.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            expected = _sk(y[rows], pred[rows], labels)
        for name in metrics.METRICS:
            assert result.resampled[name][b] == pytest.approx(expected[name], abs=1e-12), (b, name)


def test_per_class_scores_match_sklearn() -> None:
    y, pred = _fixed()
    table = metrics.per_class_scores(y, pred, K)
    assert list(table["label"]) == list(range(K))
    f1 = f1_score(y, pred, labels=list(range(K)), average=None, zero_division=0)
    np.testing.assert_allclose(table["f1"], f1)
    assert table["support"].sum() == len(y)


def test_resample_weights_count_draws() -> None:
    indices = np.array([[0, 0, 2], [1, 2, 1]])
    np.testing.assert_array_equal(metrics.resample_weights(indices), [[2, 0, 1], [0, 2, 1]])


def test_paired_bootstrap_shares_resamples() -> None:
    y, pred = _fixed(seed=5)
    # Same predictions: with shared resamples every resample's delta is exactly zero; two
    # independent draws would scatter around zero instead.
    same = metrics.paired_bootstrap(y, pred, pred.copy(), list(range(K)), K, n_boot=200, seed=0)
    for metric in metrics.PAIRED_METRICS:
        np.testing.assert_array_equal(same.b.resampled[metric] - same.a.resampled[metric], 0.0)
    np.testing.assert_array_equal(same.a.support, same.b.support)
    # And the resample b of each state is scikit-learn on rows indices[b].
    other = np.where(np.arange(len(y)) % 7 == 0, (y + 1) % K, y)
    paired = metrics.paired_bootstrap(y, pred, other, list(range(K)), K, n_boot=5, seed=2)
    for b, rows in enumerate(paired.indices):
        assert paired.a.resampled["accuracy"][b] == pytest.approx(accuracy_score(y[rows], pred[rows]))
        assert paired.b.resampled["accuracy"][b] == pytest.approx(accuracy_score(y[rows], other[rows]))


def test_known_zero_delta_covers_zero_and_known_shift_does_not() -> None:
    rng = np.random.default_rng(11)
    n = 1000
    y = rng.integers(0, K, n)
    wrong = (y + 1) % K
    order = rng.permutation(n)
    wrong_a, wrong_b = order[:150], order[150:300]
    pred_a = y.copy()
    pred_a[wrong_a] = wrong[wrong_a]
    # b swaps which rows are wrong: same error count, different rows -> a true delta of zero
    pred_b = y.copy()
    pred_b[wrong_b] = wrong[wrong_b]
    zero = metrics.paired_bootstrap(y, pred_a, pred_b, list(range(K)), K, n_boot=500, seed=0).table
    accuracy = zero.set_index("metric").loc["accuracy"]
    assert accuracy["delta"] == pytest.approx(0.0)
    assert accuracy["lo"] < 0 < accuracy["hi"]
    assert not accuracy["excludes_zero"]
    # c is a plus 100 extra errors: a known shift of -0.10 accuracy
    pred_c = pred_a.copy()
    pred_c[order[300:400]] = wrong[order[300:400]]
    shift = metrics.paired_bootstrap(y, pred_a, pred_c, list(range(K)), K, n_boot=500, seed=0).table
    for metric in metrics.PAIRED_METRICS:
        row = shift.set_index("metric").loc[metric]
        assert row["hi"] < 0 and row["excludes_zero"], metric
        assert row["lo"] <= row["delta"] <= row["hi"]
    assert shift.set_index("metric").loc["accuracy", "delta"] == pytest.approx(-0.10)


def test_paired_delta_refuses_unpaired_resamples() -> None:
    y, pred = _fixed()
    a = metrics.bootstrap_metrics(y, pred, list(range(K)), K, metrics.bootstrap_indices(len(y), 10, 0))
    b = metrics.bootstrap_metrics(y, pred, list(range(K)), K, metrics.bootstrap_indices(len(y), 10, 1))
    with pytest.raises(metrics.MetricInputError, match="same labels and resamples"):
        metrics.paired_delta_table(a, b)


def test_mcnemar_exact_hand_computed() -> None:
    # 8 rows only a gets right, 2 only b gets right, 5 both, 3 neither.
    a = [True] * 8 + [False] * 2 + [True] * 5 + [False] * 3
    b = [False] * 8 + [True] * 2 + [True] * 5 + [False] * 3
    result = metrics.mcnemar_exact(a, b)
    assert (result["only_a_correct"], result["only_b_correct"], result["discordant"]) == (8, 2, 10)
    # two-sided exact: 2 * P(X <= 2 | n=10, p=1/2) = 2 * (1 + 10 + 45) / 1024
    assert result["p_value"] == pytest.approx(112 / 1024)
    assert metrics.mcnemar_exact([True, False], [True, False])["p_value"] == 1.0


def test_support_bin_edges() -> None:
    edges = [100, 200, 500, 1000]
    assert metrics.support_bin_labels(edges) == ["<100", "100–199", "200–499", "500–999", "≥1000"]
    bins = metrics.assign_support_bins([0, 99, 100, 199, 200, 499, 500, 999, 1000, 5000], edges)
    assert list(bins) == ["<100", "<100", "100–199", "100–199", "200–499", "200–499", "500–999",
                          "500–999", "≥1000", "≥1000"]
    for bad in ([], [100, 100], [200, 100], [0, 10]):
        with pytest.raises(metrics.MetricInputError):
            metrics.support_bin_labels(bad)


def test_bad_labels_are_refused() -> None:
    with pytest.raises(metrics.MetricInputError, match="outside"):
        metrics.class_counts([0, 1], [0, 7], 3)
    with pytest.raises(metrics.MetricInputError, match="rows"):
        metrics.class_counts([0, 1], [0], 3)


def test_interval_ignores_undefined_resamples() -> None:
    low, high = metrics.interval(np.array([np.nan, 0.0, 1.0, 2.0, 3.0, 4.0]), level=0.5)
    assert (low, high) == pytest.approx((1.0, 3.0))


def _correlated(seed: int = 21, n: int = 800) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two states that agree on most rows: b fixes 12 % of a's errors and breaks 1 % of its hits."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    wrong = (y + 1) % K
    pred_a = np.where(rng.random(n) < 0.3, wrong, y)
    u = rng.random(n)
    pred_b = np.where((pred_a != y) & (u < 0.12), y, np.where((pred_a == y) & (u < 0.01), wrong, pred_a))
    return y, pred_a, pred_b


def test_pairing_narrows_the_interval_of_a_correlated_change() -> None:
    y, pred_a, pred_b = _correlated()
    n, n_boot, labels = len(y), 1000, list(range(K))
    paired = metrics.paired_bootstrap(y, pred_a, pred_b, labels, K, n_boot=n_boot, seed=0)
    # Paired means row by row: on every resample the accuracy change is the mean of the per-row changes
    # (correct under b minus correct under a) of that resample's rows.
    per_row = (pred_b == y).astype(float) - (pred_a == y).astype(float)
    np.testing.assert_allclose(paired.b.resampled["accuracy"] - paired.a.resampled["accuracy"],
                               per_row[paired.indices].mean(1), atol=1e-12)
    # Its width is the normal-theory width of a mean of per-row changes (measured ratio 1.03).
    theory = 2 * 1.96 * per_row.std() / np.sqrt(n)
    table = paired.table.set_index("metric")
    assert 0.85 < (table.loc["accuracy", "hi"] - table.loc["accuracy", "lo"]) / theory < 1.15
    # Breaking the pairing (b scored on its own resamples) widens every interval about threefold and
    # loses the conclusion: the paired interval excludes zero, the unpaired one does not.
    apart = metrics.bootstrap_metrics(y, pred_b, labels, K, metrics.bootstrap_indices(n, n_boot, seed=1))
    for metric in metrics.PAIRED_METRICS:
        row = table.loc[metric]
        low, high = metrics.interval(apart.resampled[metric] - paired.a.resampled[metric])
        # measured: paired widths 0.030 against unpaired 0.086-0.087 (ratio 0.34-0.35)
        assert (row["hi"] - row["lo"]) < 0.45 * (high - low), metric
        assert row["excludes_zero"] and row["lo"] > 0, metric
        assert low < 0 < high, metric


def test_state_metrics_on_rows_of_one_class_or_foreign_predictions_leave_no_warning_on_the_page():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here would print into the chapter's notebook
        one = metrics.state_metrics([1, 1, 1], [1, 1, 1], [1])
        foreign = metrics.state_metrics([0, 0, 1], [0, 2, 1], [0, 1])
    assert one["balanced_accuracy"] == 1.0 and foreign["balanced_accuracy"] == 0.75
