"""The embedded ledger (a real SQLite file) and its writer: schema versions, batches off
the event loop, a store that is down, a bounded buffer, a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.core.ledger_policy.identity import group_row_identity, reward_identity
from gateway.core.ledger_policy.row import GroupRow, LedgerRow
from gateway.ledger.sqlite_store import SCHEMA_VERSION, SQLITE, LedgerTooNew, SqliteLedger
from gateway.ledger.writer import LedgerWriter

REPO = Path(__file__).resolve().parents[2]


def row(i: int, answer: bytes | None = None) -> LedgerRow:
    body = f'{{"input":"{i}","model":"rm"}}'.encode()
    return LedgerRow(
        identity=reward_identity("rm", "c1", "/classify", body),
        model="rm",
        numerics_class="c1",
        endpoint="/classify",
        body_digest=hashlib.sha256(body).hexdigest(),
        body=body,
        answer=answer or f'{{"data":[{{"probs":[{i}.5]}}]}}'.encode(),
        status=200,
        score=i + 0.5,
        text=None,
        slot=i % 2,
        fingerprint="fp",
        seed=None,
        latency_s=0.01,
        recorded_at=time.time(),
    )


def test_rows_round_trip_and_the_first_answer_of_an_identity_stays(tmp_path):
    store = SqliteLedger(tmp_path / "ledger.sqlite")
    first = row(1)
    store.write([first, row(2)])
    store.write([row(1, answer=b"other")])  # the same identity again: kept as first recorded
    assert store.get(first.identity) == first and store.count() == 2
    assert store.get("0" * 64) is None and store.integrity_ok()
    store.close()
    again = SqliteLedger(tmp_path / "ledger.sqlite")  # reopened: nothing migrates twice
    assert again.count() == 2
    mode = sqlite3.connect(tmp_path / "ledger.sqlite").execute("PRAGMA journal_mode").fetchone()
    assert mode[0] == "wal"
    again.close()


def test_a_database_newer_than_the_code_is_refused_clearly(tmp_path):
    path = tmp_path / "ledger.sqlite"
    SqliteLedger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerTooNew, match=f"schema version {SCHEMA_VERSION + 1}"):
        SqliteLedger(path)


class FlakyStore:
    """A store that is down until ``up`` is set."""

    def __init__(self) -> None:
        self.up = False
        self.rows: list[LedgerRow] = []

    def write(self, rows, counts=None, groups=()) -> None:
        if not self.up:
            raise ConnectionError("database unreachable")
        self.rows.extend(rows)

    def get(self, identity):
        return None

    def close(self) -> None:
        pass


async def test_a_store_that_is_down_keeps_rows_in_order_until_it_returns():
    store = FlakyStore()
    writer = LedgerWriter(
        store, max_buffered=1000, batch_rows=8, flush_interval_s=0.01, retry_s=0.01
    )
    writer.start()
    rows = [row(i) for i in range(50)]
    for r in rows:
        writer.record(r)
    await asyncio.sleep(0.1)
    assert store.rows == [] and writer.buffered == 50
    store.up = True
    deadline = time.monotonic() + 5
    while writer.buffered and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert store.rows == rows and writer.dropped == 0
    await writer.aclose()


async def test_a_full_buffer_drops_and_counts_never_blocks():
    store = FlakyStore()
    writer = LedgerWriter(store, max_buffered=10, batch_rows=4, flush_interval_s=0.01, retry_s=0.01)
    start = time.monotonic()
    for i in range(25):
        writer.record(row(i))
    assert time.monotonic() - start < 0.1
    assert writer.buffered == 10 and writer.dropped == 15
    store.up = True
    await writer.aclose()  # a clean shutdown flushes
    assert len(store.rows) == 10


async def test_the_writer_batches_into_sqlite_and_flushes_on_close(tmp_path):
    store = SqliteLedger(tmp_path / "ledger.sqlite")
    writer = LedgerWriter(store, batch_rows=64, flush_interval_s=0.05)
    writer.start()
    for i in range(300):
        writer.record(row(i))
    await writer.aclose()
    check = SqliteLedger(tmp_path / "ledger.sqlite")
    assert check.count() == 300 and check.integrity_ok()
    check.close()


CRASHER = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[2])
from tests.unit.test_ledger_store import row
from gateway.ledger.sqlite_store import SqliteLedger
from gateway.ledger.writer import LedgerWriter

async def main():
    writer = LedgerWriter(SqliteLedger(sys.argv[1]), batch_rows=50, flush_interval_s=0.05)
    writer.start()
    i = 0
    while True:
        writer.record(row(i))
        i += 1
        if i % 50 == 0:
            print(writer.written, flush=True)
            await asyncio.sleep(0.01)

asyncio.run(main())
"""


def test_kill_9_under_load_leaves_a_sound_database_with_every_flushed_row(tmp_path):
    path = tmp_path / "ledger.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(path), str(REPO)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    written = 0
    for line in proc.stdout:
        written = int(line)
        if written >= 2000:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = SqliteLedger(path)
    assert store.integrity_ok()
    assert store.count() >= written  # every batch the writer saw committed is there
    store.close()


def test_recent_rows_keep_the_most_recently_used():
    from gateway.ledger.ledger import RecentRows

    recent = RecentRows(2)
    a, b, c = row(1), row(2), row(3)
    recent.put(a)
    recent.put(b)
    assert recent.get(a.identity) == a  # a is now the most recent
    recent.put(c)
    assert recent.get(b.identity) is None and recent.get(a.identity) == a and len(recent) == 2
    assert recent.forget("rm", "other") == 0 and recent.forget("rm") == 2


async def test_a_recorded_answer_is_found_in_memory_then_in_the_store(tmp_path):
    from gateway.ledger.ledger import Ledger

    store = SqliteLedger(tmp_path / "ledger.sqlite")
    writer = LedgerWriter(store, flush_interval_s=0.01)
    ledger = Ledger(store, writer, recent=10)
    first = row(1)
    ledger.record(first)
    assert await ledger.lookup(first.identity) == first  # before any batch is written
    await writer.flush()
    cold = Ledger(store, writer, recent=10)  # a new process: nothing in memory
    assert await cold.lookup(first.identity) == first
    assert await cold.lookup("f" * 64) is None
    await writer.aclose()


async def test_rows_being_written_count_toward_the_bound():
    """A batch in a slow write is still held: it goes back to the buffer if the write
    fails, so it counts (measured: without this, 271 of 300 rows were held with a bound of
    200 while PostgreSQL was down)."""
    import threading

    release = threading.Event()

    class SlowDown:
        def write(self, rows, counts=None, groups=()):
            release.wait(5)
            raise ConnectionError("down")

        def close(self):
            pass

    writer = LedgerWriter(
        SlowDown(), max_buffered=10, batch_rows=8, flush_interval_s=0.01, retry_s=0.01
    )
    for i in range(6):
        writer.record(row(i))
    flushing = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.05)  # the writer holds a batch of 6 in its (slow) write
    for i in range(6, 20):
        writer.record(row(i))
    assert writer.buffered == 10 and writer.dropped == 10
    release.set()
    assert not await flushing
    assert writer.buffered == 10


def group_row(n: int, receipts: list[str]) -> GroupRow:
    members = [{"item": f"i{k}", "score": k / 2, "receipts": [r]} for k, r in enumerate(receipts)]
    return GroupRow(
        identity=group_row_identity("pairs", "p", f"g{n}"),
        group_identity=f"g{n}",
        program="pairs",
        component="p",
        scorer="pairwise",
        members=json.dumps(members),
        recorded_at=time.time() + n,
    )


async def test_group_rows_are_written_with_their_members_rows_and_read_back(tmp_path):
    """A group scorer's row names the receipts its members' scores were read from; it is
    written with the rows (one transaction), kept as first recorded, and migrated into a
    database of the previous schema version."""
    path = tmp_path / "ledger.sqlite"
    old = sqlite3.connect(path)  # a version-2 database: rewards, no group rows
    for version in (1, 2):
        for statement in SQLITE.migrations()[version]:
            old.execute(statement)
    old.execute("PRAGMA user_version = 2")
    old.commit()
    old.close()
    store = SqliteLedger(path)
    writer = LedgerWriter(store, flush_interval_s=0.01)
    writer.start()
    rows = [row(i) for i in range(3)]
    for r in rows:
        writer.record(r)
    first = group_row(1, [r.identity for r in rows])
    writer.record_group(first)
    writer.record_group(group_row(2, [rows[0].identity]))
    await writer.flush()
    store.write([], groups=[dataclasses.replace(first, scorer="listwise")])  # kept as first
    assert store.group_rows()[0] == first and len(store.group_rows(program="pairs")) == 2
    assert store.group_rows(program="other") == []
    assert first.receipts() == [r.identity for r in rows]
    assert all(store.get(r) is not None for r in first.receipts())
    await writer.aclose()


def test_a_group_changes_when_any_of_its_answers_changed_or_is_missing():
    from gateway.client.check import RunVerdict
    from gateway.client.ledger_replay import ReplayReport, changed_groups, group_receipts

    a, b = group_row(1, ["r1", "r2"]), group_row(2, ["r2", "r3"])
    verdict = RunVerdict("replay", 3, 3, 0, 0, 0.0)
    assert group_receipts([a, b]) == ["r1", "r2", "r3"]
    assert changed_groups([a, b], ReplayReport(verdict), set()) == []
    assert changed_groups([a, b], ReplayReport(verdict, changed={"r1"}), set()) == [a.identity]
    assert changed_groups([a, b], ReplayReport(verdict), {"r3"}) == [b.identity]
