"""Shared fixtures: offline model hub, paths to the shared evaluation data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the checkout (SciFact, CMRC2018, GloVe-100k); never copied in."""
    for candidate in (REPO.parent / "shared" / "data", REPO / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"shared evaluation data not found beside {REPO} (expected ../shared/data)")
