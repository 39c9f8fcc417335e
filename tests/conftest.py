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


def pytest_collection_modifyitems(session, config, items) -> None:
    """The order of the session, by file (a file's tests stay together, so a module's
    gateway starts once):

    0. unit tests that need no demo model, while the session gateway boots in the
       background (``tests/integration/session_gateway.py``): they take one core of two;
    1. unit tests that read the demo models (built by that boot when the checkout has none);
    2. integration files that use the session gateway (it is stopped after the last);
    3. integration files with gateways of their own (numerics classes, ``serve run``, the
       wheel's demo), each then alone on the machine;
    4. files marked ``timing`` (they assert a duration or a CPU share), when nothing else
       runs: a booting gateway takes the CPU they measure.
    """

    def rank(item: pytest.Item) -> int:
        unit = "integration" not in item.path.parts
        names = module_fixtures.get(item.path, set())
        if item.path in timing:
            return 4
        if unit:
            return 1 if "demo_models" in names else 0
        return 2 if "gateway" in names else 3

    module_fixtures: dict[Path, set[str]] = {}
    timing: set[Path] = set()
    for item in items:
        module_fixtures.setdefault(item.path, set()).update(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("timing") is not None:
            timing.add(item.path)
    items[:] = sorted(items, key=rank)  # stable: file order kept within a rank


@pytest.fixture(scope="session")
def demo_models(request) -> Path:
    from deployments.demo.models import build_demo_models, demo_models_present

    try:  # the session gateway's boot builds them first when the checkout has none
        from tests.integration.session_gateway import STARTED

        started = request.config.stash.get(STARTED, None)
    except ImportError:
        started = None
    if started is not None:
        started.wait_built()
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
