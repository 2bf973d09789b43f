"""The training augmentation: deterministic per seed, mild, each operation switchable and bounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as F

from cropcop_utils.training.augment import (
    AugmentConfigError,
    AugmentParams,
    as_uint8_chw,
    augment,
    jitter_colour,
)

OFF = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip=0.0, vflip=0.0, rotate_deg=0.0, translate=0.0,
           scale=(1.0, 1.0), brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0, jpeg_p=0.0, blur_p=0.0,
           noise_p=0.0)


@pytest.fixture(scope="module")
def leaf() -> np.ndarray:
    """A 48-px leaf-like image: a green ellipse with a brown spot on a pale background, plus texture."""
    yy, xx = np.mgrid[0:48, 0:48]
    image = np.empty((48, 48, 3), dtype=np.float64)
    image[:] = (215, 210, 195)
    leaf_mask = ((xx - 24) / 18) ** 2 + ((yy - 24) / 12) ** 2 < 1
    image[leaf_mask] = (60, 140, 50)
    image[(xx - 28) ** 2 + (yy - 22) ** 2 < 16] = (120, 80, 30)
    image += np.random.default_rng(0).normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_same_seed_same_sample_and_the_global_rng_is_untouched(leaf):
    params = AugmentParams(jpeg_p=1.0, blur_p=1.0, noise_p=1.0)
    before = torch.get_rng_state()
    a = augment(leaf, params, _gen(7))
    b = augment(leaf, params, _gen(7))
    assert torch.equal(torch.get_rng_state(), before)
    assert a.dtype == torch.uint8 and a.shape == (3, 48, 48)
    assert torch.equal(a, b)
    assert not torch.equal(a, augment(leaf, params, _gen(8)))


def test_disabled_and_all_off_return_the_input_exactly(leaf):
    assert torch.equal(augment(leaf, AugmentParams(enabled=False), _gen(1)), as_uint8_chw(leaf))
    assert torch.equal(augment(leaf, AugmentParams(**OFF), _gen(1)), as_uint8_chw(leaf))


def test_flips_alone_are_exact_mirrors(leaf):
    out = augment(leaf, AugmentParams(**{**OFF, "hflip": 1.0}), _gen(3))
    assert torch.equal(out, as_uint8_chw(np.ascontiguousarray(leaf[:, ::-1])))
    out = augment(leaf, AugmentParams(**{**OFF, "vflip": 1.0}), _gen(3))
    assert torch.equal(out, as_uint8_chw(np.ascontiguousarray(leaf[::-1])))


@pytest.mark.parametrize("op", [{"jpeg_p": 1.0, "jpeg_quality": (60, 60)}, {"blur_p": 1.0},
                                {"noise_p": 1.0, "noise_std": 0.03}, {"brightness": 0.2},
                                {"rotate_deg": 10.0}, {"crop_scale": (0.75, 0.8)}])
def test_each_operation_changes_pixels_but_only_a_little(leaf, op):
    original = as_uint8_chw(leaf).float()
    diffs = []
    for seed in range(5):
        out = augment(leaf, AugmentParams(**{**OFF, **op}), _gen(seed)).float()
        diffs.append((out - original).abs().mean().item())
    assert max(diffs) > 0.5, f"{op} did nothing"
    assert max(diffs) < 30.0, f"{op} is not mild: mean abs change {max(diffs):.1f} grey levels"


def test_default_pipeline_keeps_the_picture_recognisable(leaf):
    original = as_uint8_chw(leaf).float()
    for seed in range(10):
        out = augment(leaf, AugmentParams(), _gen(seed)).float()
        corr = np.corrcoef(out.flatten().numpy(), original.flatten().numpy())[0, 1]
        assert corr > 0.6, f"seed {seed}: correlation with the original only {corr:.2f}"
        # the leaf's colour survives: mean green minus mean red stays clearly positive
        assert (out[1] - out[0]).mean() > 0.3 * (original[1] - original[0]).mean()


def test_colour_jitter_matches_torchvision_brightness_and_saturation(leaf):
    x = as_uint8_chw(leaf)

    def ours(*factors: float) -> torch.Tensor:
        return torch.from_numpy(np.clip(np.rint(jitter_colour(leaf, *factors)), 0, 255)).permute(2, 0, 1)

    assert (ours(1.15, 1.0, 1.0, 0.0).int() - F.adjust_brightness(x, 1.15).int()).abs().max() <= 1
    assert (ours(1.0, 1.0, 0.7, 0.0).int() - F.adjust_saturation(x, 0.7).int()).abs().max() <= 1
    assert (ours(1.0, 0.8, 1.0, 0.0).int() - F.adjust_contrast(x, 0.8).int()).abs().max() <= 1
    # hue: a rotation about the grey axis in the same direction as torchvision's HSV shift
    shift = jitter_colour(leaf, 1.0, 1.0, 1.0, 0.05) - leaf.astype(np.float32)
    theirs = (F.adjust_hue(x, 0.05).float() - x.float()).permute(1, 2, 0).numpy()
    assert float((shift * theirs).sum()) > 0


@pytest.mark.parametrize("section, word", [
    ({"hflip": 1.5}, "hflip"), ({"jpeg_quality": [10, 120]}, "jpeg_quality"), ({"sharpen": 1}, "sharpen"),
    ({"crop_scale": [0.5, 1.2]}, "crop_scale"), ({"brightness": -0.1}, "brightness")])
def test_bad_settings_are_refused_by_name(section, word):
    with pytest.raises(AugmentConfigError, match=word):
        AugmentParams.from_dict(section)


def test_yaml_lists_become_tuples_and_round_trip():
    params = AugmentParams.from_dict({"crop_scale": [0.8, 1.0], "jpeg_quality": [70, 90]})
    assert params.crop_scale == (0.8, 1.0)
    assert AugmentParams.from_dict(params.to_dict()) == params
