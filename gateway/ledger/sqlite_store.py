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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.ledger.sql_store import COLUMNS, SCHEMA_VERSION, Dialect, LedgerTooNew, SqlLedger  # noqa: F401

SQLITE = Dialect(
    mark="?", blob="BLOB", real="REAL", bigint="INTEGER", serial="INTEGER PRIMARY KEY AUTOINCREMENT"
)


def migrate(conn: sqlite3.Connection, path: Path | str) -> int:
    """Bring the database to ``SCHEMA_VERSION``; returns the version it had."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise LedgerTooNew(
            f"the ledger {path} has schema version {found}; this rmgate "
            f"knows up to {SCHEMA_VERSION}: upgrade rmgate, or point "
            "gateway.ledger.state_dir at another directory"
        )
    steps = SQLITE.migrations()
    for version in range(found + 1, SCHEMA_VERSION + 1):
        with conn:  # one transaction per step: a crash mid-migration leaves the old version
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute("PRAGMA user_version").fetchone()[0] >= version:
                continue  # another replica migrated meanwhile
            for statement in steps[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
    return found


class SqliteLedger(SqlLedger):
    """Rows by identity in one SQLite file."""

    dialect = SQLITE

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one connection, used from the writer's thread and the readers' threads in turn
        self._conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
            migrate(self._conn, self.path)

    def _run(
        self, sql: str, params: Sequence[Any] = (), *, many: bool = False, fetch: bool = False
    ) -> list[tuple[Any, ...]]:
        with self._lock:
            cur = self._conn.execute(sql, tuple(params))
            return cur.fetchall() if fetch else []

    def _transaction(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                self._conn.executemany(sql, params)

    def identities(self) -> list[str]:
        return [r[0] for r in self._run("SELECT identity FROM rewards", fetch=True)]

    def integrity_ok(self) -> bool:
        return self._run("PRAGMA integrity_check", fetch=True)[0][0] == "ok"

    def close(self) -> None:
        with self._lock:
            self._conn.close()
