"""The audit's pools start clean workers: a verifier pool opened after this process ran OpenCV on several
threads must finish (forked workers hung in OpenCV's setNumThreads on the real apple sets)."""

from __future__ import annotations

import threading

import numpy as np
from PIL import Image

from cropcop_utils.audit import geometry


def test_geometry_pool_after_threaded_opencv_finishes() -> None:
    import cv2

    rng = np.random.default_rng(0)
    cv2.setNumThreads(2)
    big = rng.integers(0, 255, (1024, 1024), dtype=np.uint8)
    cv2.warpPerspective(big, np.eye(3), (1024, 1024))  # OpenCV's thread pool is now live in this process
    points = [geometry.keypoints(Image.fromarray(rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)))
              for _ in range(4)]
    pairs = np.array([[0, 1], [1, 2], [2, 3], [0, 3]])
    found: dict[str, geometry.GeometryScores] = {}
    worker = threading.Thread(target=lambda: found.update(
        scores=geometry.verify_pairs(points, pairs, workers=2, task=1)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert "scores" in found, "the geometric verifier's pool did not finish"
    alone = geometry.verify_pairs(points, pairs, workers=1)
    assert found["scores"].inliers.tolist() == alone.inliers.tolist()


def test_every_module_the_server_preloads_exists() -> None:
    # the forkserver skips a preload that fails to import without a word: a renamed module would quietly
    # bring back one import per worker and pool
    import importlib

    from cropcop_utils.audit import pools

    assert "cropcop_utils.audit.geometry" in pools.WORKER_MODULES
    for name in pools.WORKER_MODULES:
        importlib.import_module(name)
