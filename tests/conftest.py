"""Shared fixtures. The whole book runs once per session on the smoke profile; chapter tests read it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TOMATO = Path(__file__).resolve().parents[2] / "shared" / "data" / "plantvillage-tomato"

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def tomato_root() -> Path:
    if not TOMATO.is_dir():
        pytest.skip(f"real PlantVillage tomato data not present at {TOMATO}")
    return TOMATO


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """The whole chain executed headless (papermill) on the synthetic corpus and rendered with -W."""
    from cropcop_utils.book import run_book

    base = tmp_path_factory.mktemp("smoke_book")
    lines: list[str] = []
    result = run_book(base / "run", profile="smoke", data="synthetic", html=True,
                      book_root=base / "book_root", log=lines.append)
    result["log"] = lines
    result["book_root"] = base / "book_root"
    return result
