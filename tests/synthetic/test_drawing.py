"""The renderer: deterministic per seed, one subject per uid, a re-shot is the same leaf slightly moved."""

import numpy as np
import pytest
from PIL import Image

from cropcop_utils.synthetic.drawing import render_upright, render_with_mask
from cropcop_utils.synthetic.world import CLASSES


def _coarse(image: Image.Image) -> np.ndarray:
    return np.asarray(image.resize((16, 16), Image.Resampling.BOX), dtype=float)


def test_same_arguments_same_pixels_for_every_class():
    for spec in CLASSES:
        first = render_upright(11, 48, spec.name, spec.source, uid=5)
        again = render_upright(11, 48, spec.name, spec.source, uid=5)
        assert first.size == (48, 48) and first.mode == "RGB"
        assert np.array_equal(np.asarray(first), np.asarray(again)), spec.name


def test_a_reshot_is_closer_to_its_original_than_another_leaf():
    spec = CLASSES[0]
    original = _coarse(render_upright(11, 64, spec.name, spec.source, uid=5))
    reshot = _coarse(render_upright(11, 64, spec.name, spec.source, uid=5, shot=1))
    other = _coarse(render_upright(11, 64, spec.name, spec.source, uid=6))
    assert not np.array_equal(original, reshot)
    assert np.abs(original - reshot).mean() < np.abs(original - other).mean()


def test_reshot_kinds_differ_in_light_and_backdrop():
    spec = CLASSES[0]
    original = np.asarray(render_upright(11, 64, spec.name, spec.source, uid=5), dtype=np.float32)
    relit = np.asarray(render_upright(11, 64, spec.name, spec.source, uid=5, shot=1, reshot="relit"),
                       dtype=np.float32)
    shaded = np.asarray(render_upright(11, 64, spec.name, spec.source, uid=5, shot=1, reshot="background"),
                        dtype=np.float32)
    assert abs(relit.mean() - original.mean()) > 0.1 * original.mean()
    _, leaf = render_with_mask(11, 64, spec.name, spec.source, uid=5)
    backdrop = ~leaf
    backdrop[:8], backdrop[-8:], backdrop[:, :8], backdrop[:, -8:] = False, False, False, False
    assert abs(shaded[backdrop].mean() - original[backdrop].mean()) > 8
    with pytest.raises(ValueError, match="re-shot kind"):
        render_upright(11, 64, spec.name, spec.source, uid=5, shot=1, reshot="tilted")
