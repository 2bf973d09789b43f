"""The renderer: deterministic per seed, one subject per uid, a re-shot is the same leaf slightly moved."""

import numpy as np
from PIL import Image

from cropcop_utils.synthetic.drawing import render_upright
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
