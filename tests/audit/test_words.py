from __future__ import annotations

import numpy as np
from PIL import Image
from skimage import data

from cropcop_utils.audit import geometry, words


def _descriptors(image: Image.Image) -> np.ndarray:
    return geometry.keypoints(image).descriptors


def _scenes() -> dict[str, Image.Image]:
    pictures = {"chelsea": data.chelsea(), "coffee": data.coffee(), "astronaut": data.astronaut(),
                "rocket": data.rocket(), "immunohistochemistry": data.immunohistochemistry(),
                "hubble": data.hubble_deep_field(), "retina": data.retina()}
    return {name: Image.fromarray(np.asarray(p)).convert("RGB") for name, p in pictures.items()}


def _zoomed_out_crop(image: Image.Image) -> Image.Image:
    """A third cropped away, the rest shrunk by a fifth and padded back: pHash and layout move far."""
    w, h = image.size
    crop = image.crop((w // 6, h // 6, w - w // 6, h - h // 6))
    small = crop.resize((int(crop.width * 0.8), int(crop.height * 0.8)), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", crop.size, (128, 128, 128))
    canvas.paste(small, ((crop.width - small.width) // 2, (crop.height - small.height) // 2))
    return canvas


def test_word_counts_hold_every_descriptor_and_the_vocabulary_is_seeded() -> None:
    rng = np.random.default_rng(0)
    descriptors = [rng.integers(0, 256, (n, 32), dtype=np.uint8) for n in (40, 0, 75, 12)]
    first, again = words.vocabulary(descriptors, 16), words.vocabulary(descriptors, 16)
    assert first.shape == (16, 32) and first.dtype == np.uint8 and np.array_equal(first, again)
    counts = words.word_counts(descriptors, first)
    assert counts.shape == (4, 16) and counts.sum(axis=1).tolist() == [40, 0, 75, 12]
    vectors = words.word_vectors(counts)
    assert np.allclose(np.linalg.norm(vectors[[0, 2, 3]], axis=1), 1.0, atol=1e-5)
    assert not vectors[1].any()


def test_a_zoomed_out_crop_is_its_originals_nearest_word_neighbour() -> None:
    scenes = _scenes()
    names = [*scenes, "copy", "blank"]
    descriptors = [_descriptors(p) for p in scenes.values()]
    descriptors += [_descriptors(_zoomed_out_crop(scenes["chelsea"])),
                    _descriptors(Image.new("RGB", (200, 200), (90, 140, 60)))]
    assert len(descriptors[-1]) == 0  # a flat picture has no keypoints: it takes no part
    pairs, cosine = words.neighbour_pairs(descriptors, k=1, words=64)
    named = {tuple(sorted((names[i], names[j]))) for i, j in pairs}
    assert ("chelsea", "copy") in named
    assert not any("blank" in pair for pair in named)
    assert np.all(pairs[:, 0] < pairs[:, 1]) and len(cosine) == len(pairs)
    # the copy's nearest image is its original, clearly ahead of any other scene
    copy = names.index("copy")
    mine = cosine[(pairs == copy).any(axis=1)]
    assert cosine[[tuple(p) == (names.index("chelsea"), copy) for p in pairs.tolist()]][0] == mine.max()


def test_no_pairs_without_two_described_images() -> None:
    empty = np.zeros((0, 32), np.uint8)
    one = np.random.default_rng(1).integers(0, 256, (30, 32), dtype=np.uint8)
    for descriptors in ([], [empty, empty], [one, empty]):
        pairs, cosine = words.neighbour_pairs(descriptors, k=3, words=8)
        assert pairs.shape == (0, 2) and cosine.shape == (0,)
