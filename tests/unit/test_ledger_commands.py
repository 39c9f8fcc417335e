"""The ledger's stores beyond the request path, on SQLite and a real PostgreSQL server:
retention, an invalidation learned by another process's ledger, a database newer than the
code, and the ``rmgate ledger`` commands (stats, export to JSON lines and Parquet,
invalidate) as a user runs them."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.core.ledger_policy.row import LedgerRow
from gateway.ledger.ledger import Ledger
from gateway.ledger.sql_store import LedgerTooNew
from gateway.ledger.sqlite_store import SqliteLedger
from gateway.ledger.writer import LedgerWriter


def row(i: int, model: str = "rm", cls: str = "A", at: float | None = None) -> LedgerRow:
    answer = json.dumps({"data": [{"index": 0, "probs": [i / 10]}]}).encode()
    return LedgerRow(
        f"{i:064x}",
        model,
        cls,
        "/classify",
        "d" * 64,
        json.dumps({"model": model, "input": f"x{i}"}).encode(),
        answer,
        200,
        None,
        None,
        i % 2,
        "fp",
        None,
        0.01,
        at if at is not None else time.time(),
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        found = SqliteLedger(tmp_path / "ledger.sqlite3")
        found.dsn_or_path = str(tmp_path / "ledger.sqlite3")
        return found
    found = request.getfixturevalue("postgres_ledger")
    found.dsn_or_path = found._pool.conninfo
    return found


def test_retention_by_age_and_by_rows(store):
    now = time.time()
    store.write([row(i, at=now - 86400 * (10 - i)) for i in range(10)])  # 10..1 days old
    assert store.prune(older_than_s=5.5 * 86400) == 5
    assert store.prune(keep_rows=2) == 3
    assert sorted(r.identity for r in store.rows()) == [f"{8:064x}", f"{9:064x}"]


async def test_an_invalidation_reaches_the_other_processes_memory(store):
    mine = Ledger(store, LedgerWriter(store), recent=100)
    theirs = Ledger(store, LedgerWriter(store), recent=100)  # another ingress, same store
    for i in range(4):
        theirs.record(row(i, cls="A" if i < 3 else "B"))
    await theirs.writer.flush()
    assert await mine.invalidate("rm", "A") == 3
    assert len(theirs.recent) == 4
    await theirs._learn_invalidations()
    assert len(theirs.recent) == 1  # class B stays
    assert await theirs.lookup(f"{0:064x}") is None  # the store skips it too
    assert (await theirs.row(f"{0:064x}")) is not None  # kept for audit


def test_a_newer_schema_is_refused(store):
    if isinstance(store, SqliteLedger):
        store._run("PRAGMA user_version = 99")
        with pytest.raises(LedgerTooNew, match="schema version 99"):
            SqliteLedger(store.path)
    else:
        store._run("INSERT INTO rmgate_schema (version) VALUES (99)")
        from gateway.ledger.postgres_store import PostgresLedger

        with pytest.raises(LedgerTooNew, match="schema version 99"):
            PostgresLedger(store.dsn_or_path)


def test_the_commands_read_stats_export_and_invalidate(store, tmp_path):
    store.write(
        [row(i, model="rm" if i < 6 else "judge") for i in range(8)],
        {("rm", "A", "hit"): 3, ("rm", "A", "miss"): 1},
    )
    db = ["--db", store.dsn_or_path]
    runner = CliRunner()
    stats = runner.invoke(app, ["ledger", "stats", *db, "--json"])
    assert stats.exit_code == 0, stats.output
    by_model = {e["model"]: e for e in json.loads(stats.output)}
    assert by_model["rm"]["rows"] == 6 and by_model["rm"]["hit_rate"] == 0.75
    out = tmp_path / "rows.jsonl"
    done = runner.invoke(app, ["ledger", "export", str(out), "--model", "rm", *db])
    assert done.exit_code == 0 and "6 rows" in done.output, done.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["score"] for x in lines] == [i / 10 for i in range(6)]
    parquet = tmp_path / "rows.parquet"
    done = runner.invoke(app, ["ledger", "export", str(parquet), "--format", "parquet", *db])
    assert done.exit_code == 0, done.output
    import pyarrow.parquet as pq

    assert pq.read_table(parquet).num_rows == 8
    gone = runner.invoke(app, ["ledger", "invalidate", "--model", "judge", *db])
    assert gone.exit_code == 0 and "2 rows of judge" in gone.output, gone.output
    assert sum(1 for _ in store.rows(model="judge")) == 0


def test_a_missing_ledger_is_a_clear_exit(tmp_path):
    result = CliRunner().invoke(app, ["ledger", "stats", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 2 and "does not exist" in result.output
