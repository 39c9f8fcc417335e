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


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server from the machine's own binaries, for the session."""
    from gateway.harness.postgres import ThrowawayPostgres, find_pg_bin

    if find_pg_bin() is None:
        pytest.skip("no PostgreSQL server binaries (pg_ctl, initdb) on this machine")
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def postgres_ledger(postgres_server):
    """A ``PostgresLedger`` on a database of its own (created for the test)."""
    import uuid

    import psycopg

    from gateway.ledger.postgres_store import PostgresLedger

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    store = PostgresLedger(postgres_server.dsn.rsplit("/", 1)[0] + "/" + name)
    yield store
    store.close()
