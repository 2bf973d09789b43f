"""Chapter 11's out-of-scope inputs: non-plant images, the rejection rate, another crop's leaves."""

from __future__ import annotations

import numpy as np
import pytest
from abstention.abstention_fixtures import PARAMS

from cropcop_utils.abstention.out_of_scope import other_crop_rows, out_of_scope_images, rejection_block
from cropcop_utils.nets.predict import records_from_logits


# --------------------------------------------------------------------------- out-of-scope images
def test_out_of_scope_images_are_deterministic_and_not_plants():
    first = out_of_scope_images(noise_images=2, seed=0, side=32)
    second = out_of_scope_images(noise_images=2, seed=0, side=32)
    assert [n for n, _, _ in first] == [n for n, _, _ in second]
    assert all(np.array_equal(a, b) for (_, _, a), (_, _, b) in zip(first, second, strict=True))
    assert "grass" not in {n for n, _, _ in first}
    assert {k for _, k, _ in first} == {"photo", "texture", "noise"}
    assert all(a.shape == (32, 32, 3) and a.dtype == np.uint8 for _, _, a in first)


def test_rejection_rate_counts_rows_below_the_threshold():
    logits = np.array([[4, 0, 0], [0.1, 0, 0], [0, 0, 0]], dtype=np.float32)
    frame = records_from_logits(["a", "b", "c"], [-1, -1, -1], logits, "c" * 64).assign(
        source=["photo", "noise", "noise"])
    result = rejection_block(frame, 1.0, 0.5, "msp", 0.95)
    assert result["rejection_rate"]["value"] == pytest.approx(2 / 3)
    assert result["by_source"]["noise"]["value"] == 1.0 and result["by_source"]["photo"]["value"] == 0.0


def write_images(root, rel_paths):
    from PIL import Image

    for rel in rel_paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (0, 120, 0)).save(root / rel)


def test_other_crop_leaves_are_sampled_deterministically_for_a_one_crop_corpus(tmp_path):
    from cropcop_utils.core.config import RunContext

    other = tmp_path / "tomato"
    write_images(other, [f"train/Tomato___healthy/{i}.jpg" for i in range(5)]
                 + ["train/Apple___scab/0.jpg", "train/.hidden.jpg"])
    (other / "notes.txt").write_text("not an image")
    ctx = RunContext(run_dir=tmp_path / "run", params={"data": str(tmp_path / "apple")}, fingerprint="x")
    apple = {"classes": [{"name": "Apple_scab", "crop": "apple"}, {"name": "Apple_rust", "crop": "apple"}]}
    params = {**PARAMS, "other_crop_data": str(other), "other_crop_images": 3}
    rows, root, note = other_crop_rows(ctx, apple, params)
    assert note is None and root == other.resolve() and len(rows) == 3
    assert all(r.startswith("train/Tomato___healthy/") for r in rows["rel_path"])
    assert rows.equals(other_crop_rows(ctx, apple, params)[0]) and (rows["source"] == "other_crop").all()

    mixed = {"classes": [*apple["classes"], {"name": "Tomato_healthy", "crop": "tomato"}]}
    assert "2 crops" in other_crop_rows(ctx, mixed, params)[2]
    assert "no other-crop folder" in other_crop_rows(ctx, apple, {**params, "other_crop_data": None})[2]
    assert "does not exist" in other_crop_rows(ctx, apple, {**params, "other_crop_data": "/nope"})[2]
    own = RunContext(run_dir=tmp_path / "run", params={"data": str(other)}, fingerprint="x")
    assert "own corpus" in other_crop_rows(own, apple, params)[2]
