"""Shared fixtures: the demo models, built once per checkout (byte-identical builds)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "demo"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# the gateways a test starts keep their SQLite ledgers here, never in the user's state dir
os.environ.setdefault("RMGATE_STATE_DIR", tempfile.mkdtemp(prefix="rmgate-test-state-"))


@pytest.fixture(scope="session")
def demo_models() -> Path:
    from deployments.demo.models import build_demo_models, demo_models_present

    if not demo_models_present(MODELS):
        build_demo_models(MODELS)
    return MODELS
