"""The embedded ledger: one SQLite file under the gateway's state directory.

WAL journal, so readers never block the writer and several ingress replicas on one host
share the file (each writes in short transactions; ``busy_timeout`` waits out the others).
``synchronous=NORMAL``: a committed batch survives a process crash (``kill -9``); only a
power loss can take the last commits. The schema is versioned with ``PRAGMA
user_version``; migrations run on open, and a database newer than this code is refused
with a clear error instead of being misread. Calls are blocking: the writer runs them in
a thread, off the event loop (``gateway.ledger.writer``).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Iterable, Sequence

from gateway.core.ledger_row import LedgerRow

#: The schema this code reads and writes.
SCHEMA_VERSION = 1

#: Statements that take a database from version ``n - 1`` to ``n``.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("""CREATE TABLE rewards (
               identity TEXT PRIMARY KEY,
               model TEXT NOT NULL,
               numerics_class TEXT NOT NULL,
               endpoint TEXT NOT NULL,
               body_digest TEXT NOT NULL,
               body BLOB,
               answer BLOB NOT NULL,
               status INTEGER NOT NULL,
               score REAL,
               text TEXT,
               slot INTEGER NOT NULL,
               fingerprint TEXT,
               seed INTEGER,
               latency_s REAL NOT NULL,
               recorded_at REAL NOT NULL)""",
        "CREATE INDEX rewards_by_model_time ON rewards (model, recorded_at)",
        "CREATE INDEX rewards_by_class ON rewards (numerics_class)"),
}

COLUMNS = ("identity", "model", "numerics_class", "endpoint", "body_digest", "body", "answer",
           "status", "score", "text", "slot", "fingerprint", "seed", "latency_s",
           "recorded_at")


class LedgerTooNew(RuntimeError):
    """The database was written by a newer rmgate (a higher schema version)."""


def migrate(conn: sqlite3.Connection, path: Path | str) -> int:
    """Bring the database to ``SCHEMA_VERSION``; returns the version it had."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise LedgerTooNew(f"the ledger {path} has schema version {found}; this rmgate "
                           f"knows up to {SCHEMA_VERSION}: upgrade rmgate, or point "
                           "gateway.ledger.state_dir at another directory")
    for version in range(found + 1, SCHEMA_VERSION + 1):
        with conn:  # one transaction per step: a crash mid-migration leaves the old version
            conn.execute("BEGIN IMMEDIATE")
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
    return found


class SqliteLedger:
    """Rows by identity in one SQLite file (first answer recorded wins: answers of one
    identity are bitwise equal by construction)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one connection, used from the writer's thread and the readers' threads in turn
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                     timeout=30.0)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
            migrate(self._conn, self.path)

    def write(self, rows: Sequence[LedgerRow]) -> None:
        """Insert ``rows`` in one transaction (an identity already recorded is kept)."""
        if not rows:
            return
        values = [tuple(getattr(r, c) for c in COLUMNS) for r in rows]
        marks = ", ".join("?" * len(COLUMNS))
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany(
                f"INSERT OR IGNORE INTO rewards ({', '.join(COLUMNS)}) VALUES ({marks})", values)

    def get(self, identity: str) -> LedgerRow | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {', '.join(COLUMNS)} FROM rewards "
                                     "WHERE identity = ?", (identity,)).fetchone()
        return None if row is None else LedgerRow(*row)

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM rewards").fetchone()[0])

    def identities(self) -> Iterable[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT identity FROM rewards")]

    def integrity_ok(self) -> bool:
        with self._lock:
            return self._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    def close(self) -> None:
        with self._lock:
            self._conn.close()
