"""Classical leaf masks: IoU arithmetic, mask files, constructed photos and the synthetic true masks."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from cropcop_utils import synthetic
from cropcop_utils.core import imaging, masks

PLANTVILLAGE_APPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "plantvillage-apple"
LAB_BACKDROPS = ("lab_bench", "flatbed_scan", "greenhouse_cam")  # uniform backdrops; field_phone is grass


def _photo(frame: tuple[int, int, int] | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A grey card with a green elliptic leaf, a brown lesion on its margin and a black one inside."""
    size = 128
    image = Image.new("RGB", (size, size), (168, 164, 176))
    leaf = Image.new("L", (size, size), 0)
    ImageDraw.Draw(leaf).ellipse([30, 20, 100, 110], fill=255)
    image.paste((64, 124, 50), mask=leaf)
    draw = ImageDraw.Draw(image)
    draw.ellipse([88, 50, 104, 66], fill=(96, 62, 36))   # brown margin lesion (part leaf, part over the edge)
    draw.ellipse([55, 60, 70, 75], fill=(22, 18, 16))    # black lesion inside
    truth = np.asarray(leaf) > 127
    lesion = Image.new("L", (size, size), 0)
    ImageDraw.Draw(lesion).ellipse([88, 50, 104, 66], fill=255)
    truth = truth | (np.asarray(lesion) > 127)
    if frame is not None:
        draw.rectangle([0, 0, size - 1, size - 1], outline=frame, width=6)
    noise = np.random.default_rng(seed).normal(0, 3, (size, size, 3))
    return np.clip(np.asarray(image, dtype=float) + noise, 0, 255).astype(np.uint8), truth


def test_mask_iou_and_its_undefined_case() -> None:
    a = np.zeros((4, 4), bool)
    b = np.zeros((4, 4), bool)
    assert masks.mask_iou(a, b) is None
    a[:2] = True
    b[1:3] = True
    assert masks.mask_iou(a, b) == pytest.approx(4 / 12)
    assert masks.mask_iou(a, a) == 1.0
    with pytest.raises(ValueError, match="shape"):
        masks.mask_iou(a, np.zeros((3, 4), bool))


def test_load_mask_reads_white_as_leaf(tmp_path: Path) -> None:
    values = np.array([[0, 127, 128, 255]], np.uint8)
    Image.fromarray(values, mode="L").save(tmp_path / "m.png")
    assert masks.load_mask(tmp_path / "m.png").tolist() == [[False, False, True, True]]
    with pytest.raises(FileNotFoundError, match="no such mask"):
        masks.load_mask(tmp_path / "missing.png")


def test_leaf_mask_keeps_lesions_inside_the_leaf() -> None:
    rgb, truth = _photo()
    found = masks.leaf_mask(rgb)
    assert found.dtype == bool and found.shape == truth.shape
    assert masks.mask_iou(found, truth) >= 0.93
    assert found[62:73, 57:68].all()            # the black lesion is leaf, not a hole
    assert found[54:62, 90:97].mean() > 0.9     # so is the brown lesion on the margin


def test_leaf_mask_ignores_a_coloured_frame_and_finds_nothing_on_a_blank_card() -> None:
    rgb, truth = _photo(frame=(24, 126, 112))  # the teal frame of a greenhouse camera
    assert masks.mask_iou(masks.leaf_mask(rgb), truth) >= 0.9
    blank = np.full((64, 64, 3), (170, 168, 174), np.uint8)
    assert not masks.leaf_mask(blank).any()
    with pytest.raises(ValueError, match="RGB"):
        masks.leaf_mask(np.zeros((8, 8), np.uint8))


@pytest.fixture(scope="module")
def synthetic_lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("masks")
    params = {"seed": 20261130, "image_px": 96, "largest_class": 30, "field_per_class": 0}
    return out, synthetic.load_truth(synthetic.generate(out, params))


def test_iou_against_the_synthetic_true_lab_masks(synthetic_lab) -> None:
    out, truth = synthetic_lab
    lab = truth["lab_masks"]["files"]
    by_source: dict[str, list[float]] = defaultdict(list)
    for f in truth["files"]:
        if f["rel_path"] in lab:
            rgb = np.asarray(imaging.open_rgb(out / "corpus" / f["rel_path"]))
            iou = masks.mask_iou(masks.leaf_mask(rgb), masks.load_mask(out / "masks" / lab[f["rel_path"]]))
            by_source[f["source"]].append(iou)
    on_lab_backdrops = [v for s in LAB_BACKDROPS for v in by_source[s]]
    everything = [v for values in by_source.values() for v in values]
    # GrabCut is seeded, so these are fixed figures for this corpus: measured 0.940, 0.938 and 0.816 (191
    # photos); the floors sit one point below, so a real loss of mask quality fails here.
    assert np.mean(on_lab_backdrops) >= 0.93
    assert np.median(everything) >= 0.93
    # Grass behind the leaf is the known weak case of a colour method: measured, not hidden.
    assert np.mean(by_source["field_phone"]) >= 0.80


def test_masks_on_real_plantvillage_leaves_are_single_solid_regions() -> None:
    if not PLANTVILLAGE_APPLE.is_dir():
        pytest.skip(f"real PlantVillage apple photos not present at {PLANTVILLAGE_APPLE}")
    plausible = []
    for folder in sorted(PLANTVILLAGE_APPLE.iterdir()):
        for path in sorted(folder.iterdir())[:10]:
            found = masks.leaf_mask(np.asarray(imaging.open_rgb(path)))
            plausible.append(0.15 < found.mean() < 0.95 and masks.solidity(found) > 0.8)
    # No true masks exist for these photos: a leaf is one solid region covering a sizeable share of the
    # frame.  A dark bluish leaf on the bluish card can still be missed (1 of these 40 on writing).
    assert np.mean(plausible) >= 0.9


def test_a_photos_mask_does_not_depend_on_the_photos_masked_before_it(synthetic_lab) -> None:
    # GrabCut draws its colour models from OpenCV's process-wide RNG: unseeded, the order of calls
    # (another chapter, another run) changed masks.
    out, truth = synthetic_lab
    rgbs = [np.asarray(imaging.open_rgb(out / "corpus" / f["rel_path"])) for f in truth["files"][:24]]
    forward = [masks.leaf_mask(rgb) for rgb in rgbs]
    backward = [masks.leaf_mask(rgb) for rgb in reversed(rgbs)][::-1]
    assert all(np.array_equal(a, b) for a, b in zip(forward, backward, strict=True))
