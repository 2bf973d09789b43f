"""Audit fingerprints: imagehash-compatible pHash / dHash, dihedral pHashes, and one read per file."""

from __future__ import annotations

import imagehash
import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter

from cropcop_utils.audit import hashing
from cropcop_utils.core import imaging


def _texture(seed: int, side: int = 64) -> Image.Image:
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.normal(size=(side, side, 3)), (3, 3, 0))
    field = (field - field.min()) / (field.max() - field.min())
    return Image.fromarray((30 + 200 * field).astype(np.uint8))


def _bits(a: int, b: int) -> int:
    return bin(int(a) ^ int(b)).count("1")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hashes_match_imagehash(seed: int) -> None:
    grey = _texture(seed).convert("L")
    assert int(hashing.dihedral_phashes(grey)[0]) == int(str(imagehash.phash(grey)), 16)
    assert hashing.dhash64(grey) == int(str(imagehash.dhash(grey)), 16)


def test_each_symmetry_has_the_phash_of_the_transformed_picture() -> None:
    picture = _texture(3)
    eight = hashing.dihedral_phashes(picture.convert("L"))
    for g in range(8):
        channels_first = np.asarray(picture).transpose(2, 0, 1)
        turned = Image.fromarray(hashing.dihedral_apply(channels_first, g).transpose(1, 2, 0).copy())
        assert _bits(hashing.dihedral_phashes(turned.convert("L"))[0], eight[g]) <= 2, g
    # an unrelated picture is far from every symmetry
    other = hashing.dihedral_phashes(_texture(4).convert("L"))[0]
    assert min(_bits(other, h) for h in eight) > 12


def test_dihedral_inverse_undoes_each_symmetry() -> None:
    grid = np.arange(16).reshape(4, 4)
    seen = set()
    for g in range(8):
        turned = hashing.dihedral_apply(grid, g)
        seen.add(turned.tobytes())
        assert np.array_equal(hashing.dihedral_apply(turned, hashing.dihedral_inverse(g)), grid)
    assert len(seen) == 8


def test_fingerprint_reads_once_and_keeps_every_input(tmp_path) -> None:
    path = tmp_path / "x.png"
    _texture(5, 96).save(path)
    out = hashing.fingerprint_image(path, embed_side=48)
    assert out["thumb"].shape == out["weight"].shape
    assert np.array_equal(out["square"], imaging.load_array(path, 48))  # the loading contract's square
    assert len(out["keypoints"].xy) == len(out["keypoints"].descriptors)
    assert out["phash"] == int(out["dihedral"][0])


def test_the_embedding_square_of_a_tall_photo_is_the_contracts_padded_square(tmp_path) -> None:
    path = tmp_path / "tall.png"
    _texture(3, 96).crop((0, 0, 60, 96)).save(path)
    square = hashing.fingerprint_image(path, embed_side=40)["square"]
    assert np.array_equal(square, imaging.load_array(path, 40))
    assert square.shape == (40, 40, 3)


def test_symmetries_in_the_dct_domain_equal_the_dct_of_the_turned_pixels() -> None:
    from scipy.fft import dct

    pixels = np.random.default_rng(9).uniform(0, 255, (32, 32))
    low = dct(dct(pixels, axis=0), axis=1)[:8, :8]
    for g in range(8):
        turned = hashing.dihedral_apply(pixels, g)
        direct = dct(dct(turned, axis=0), axis=1)[:8, :8]
        np.testing.assert_allclose(hashing._coefficient_symmetry(low, g), direct, atol=1e-8)
        vectorised = np.where(hashing._SYMMETRY_TRANSPOSED[g], low.T, low) * hashing._SYMMETRY_SIGNS[g]
        np.testing.assert_allclose(vectorised, direct, atol=1e-8)


def test_ring_sampler_equals_scipy_bilinear_sampling() -> None:
    from scipy.ndimage import map_coordinates

    picture = _texture(6, hashing.RING_SIDE).convert("L")
    pixels = np.asarray(picture, dtype=np.float64)
    theta = np.linspace(0, 2 * np.pi, hashing.RING_ANGLES, endpoint=False)
    centre = (hashing.RING_SIDE - 1) / 2
    ys = centre + hashing.RING_RADII[:, None] * np.sin(theta)[None]
    xs = centre + hashing.RING_RADII[:, None] * np.cos(theta)[None]
    expected = map_coordinates(pixels, [ys, xs], order=1, mode="nearest")
    sampled = (hashing._ring_sampler() @ pixels.ravel()).reshape(expected.shape)
    np.testing.assert_allclose(sampled, expected, atol=1e-9)
    means = hashing.ring_spectrum(picture)[:len(hashing.RING_RADII)]
    assert np.allclose(means, expected.mean(axis=1), atol=1e-3)


def test_a_chunk_hashed_at_once_equals_each_image_hashed_alone() -> None:
    greys = [_texture(seed, side).convert("L") for seed, side in ((10, 64), (11, 96), (12, 64), (13, 50))]
    batch = hashing.batch_hashes([hashing.hash_samples(g) for g in greys])
    for k, grey in enumerate(greys):
        assert np.array_equal(batch["dihedral"][k], hashing.dihedral_phashes(grey))
        assert int(batch["phash"][k]) == int(str(imagehash.phash(grey)), 16)
        assert int(batch["dhash"][k]) == hashing.dhash64(grey) == int(str(imagehash.dhash(grey)), 16)
        np.testing.assert_allclose(batch["rings"][k], hashing.ring_spectrum(grey), rtol=1e-6)
    empty = hashing.batch_hashes([])
    assert empty["dihedral"].shape == (0, 8) and empty["rings"].shape == (0, hashing.RING_FEATURES)
