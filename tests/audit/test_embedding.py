"""The embedding candidate source: mutual nearest neighbours by cosine, and unit-length Lite0 features."""

from __future__ import annotations

import numpy as np
import pytest

from cropcop_utils.audit import embedding
from cropcop_utils.nets import pretrained


def test_neighbour_pairs_are_symmetric_unique_and_thresholded() -> None:
    features = np.array([[1, 0, 0], [0.99, 0.14, 0], [0, 1, 0], [0, 0.95, 0.31], [0, 0, 1]], np.float32)
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    pairs, cosine = embedding.neighbour_pairs(features, k=1, min_cosine=0.9)
    assert pairs.tolist() == [[0, 1], [2, 3]]
    assert np.all(cosine >= 0.9) and np.all(pairs[:, 0] < pairs[:, 1])
    assert len(embedding.neighbour_pairs(features, k=4, min_cosine=-1)[0]) == 10
    assert embedding.neighbour_pairs(features[:1], k=3, min_cosine=0)[0].shape == (0, 2)


def test_neighbour_pairs_equal_a_brute_force_search_on_unnormalised_features() -> None:
    rng = np.random.default_rng(3)
    features = (rng.normal(size=(300, 16)) * rng.uniform(0.5, 9, (300, 1))).astype(np.float32)
    pairs, cosine = embedding.neighbour_pairs(features, k=3, min_cosine=0.3)
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argsort(-similarity, axis=1)[:, :3]
    expected = {(min(i, j), max(i, j)) for i in range(300) for j in nearest[i] if similarity[i, j] >= 0.3}
    assert set(map(tuple, pairs.tolist())) == expected
    assert np.allclose(cosine, similarity[pairs[:, 0], pairs[:, 1]], atol=1e-5)


@pytest.mark.skipif(not pretrained.has_package_weights(embedding.ARCH), reason="no packaged weights")
def test_embedding_is_unit_length_and_sees_a_flip_as_close() -> None:
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(0)
    fields = gaussian_filter(rng.normal(size=(3, 96, 96, 3)), (0, 3, 3, 0))
    squares = (128 + 60 * fields / fields.std()).clip(0, 255).astype(np.uint8)
    squares[1] = squares[0, :, ::-1]
    features = embedding.embed_squares(squares)
    assert features.shape == (3, embedding.DIM)
    assert np.allclose(np.linalg.norm(features, axis=1), 1, atol=1e-5)
    assert features[0] @ features[1] > features[0] @ features[2]


@pytest.mark.skipif(not pretrained.has_package_weights(embedding.ARCH), reason="no packaged weights")
def test_saved_features_are_reused_only_for_the_same_computation(tmp_path) -> None:
    rng = np.random.default_rng(1)
    squares = rng.integers(0, 255, (3, 40, 40, 3), dtype=np.uint8)
    raw = embedding.pooled_features(squares)
    assert np.allclose(embedding.unit(raw), embedding.embed_squares(squares), atol=1e-6)
    path = tmp_path / "embedding.npz"
    path.write_bytes(embedding.features_bytes(["a", "b", "c"], raw, 40))
    sha = embedding.weights_description()["sha256"]
    args = (embedding.ARCH, sha, 40, [0.5] * 3, [0.5] * 3)
    values, why = embedding.reusable_features(path, *args, np.array(["c", "a"]))
    assert why == "reused" and np.array_equal(values, raw[[2, 0]])
    missing = embedding.reusable_features(path, *args, np.array(["a", "z"]))[1]
    assert missing == "1 row(s) were not embedded by the audit"
    assert "side" in embedding.reusable_features(path, embedding.ARCH, sha, 64, [0.5] * 3, [0.5] * 3,
                                                 np.array(["a"]))[1]
    assert "mean" in embedding.reusable_features(path, embedding.ARCH, sha, 40, [0.4] * 3, [0.5] * 3,
                                                 np.array(["a"]))[1]
    assert "weights" in embedding.reusable_features(path, embedding.ARCH, "0" * 64, 40, [0.5] * 3, [0.5] * 3,
                                                    np.array(["a"]))[1]
