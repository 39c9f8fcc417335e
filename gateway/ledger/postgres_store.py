"""The ledger on a PostgreSQL server: several hosts (or a team) share one record.

psycopg 3 with a small connection pool (``psycopg_pool``); calls are blocking and run in
the writer's and the lookups' threads, off the event loop, like the SQLite store's. The
schema version lives in ``rmgate_schema``; migrations run on open under an advisory lock
(ingress replicas starting at once migrate once), and a database newer than this code is
refused. A server that is down fails the call: the writer keeps its rows and retries,
lookups answer "not found" (the request goes to an engine), nothing fails a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.ledger.sql_store import (
    SCHEMA_VERSION,
    Dialect,
    LedgerTooNew,
    LedgerUnavailable,
    SqlLedger,
)

POSTGRES = Dialect(
    mark="%s",
    blob="BYTEA",
    real="DOUBLE PRECISION",
    bigint="BIGINT",
    serial="BIGSERIAL PRIMARY KEY",
)
#: pg_advisory_xact_lock key of rmgate's migrations ("rmgate" in ASCII).
MIGRATION_LOCK = 0x726D67617465


class PostgresLedger(SqlLedger):
    """Rows by identity in a PostgreSQL database."""

    dialect = POSTGRES

    def __init__(self, dsn: str, *, pool_size: int = 4, connect_timeout_s: float = 5.0) -> None:
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as exc:  # an optional dependency
            raise LedgerUnavailable(
                "ledger.backend postgres needs psycopg: pip install 'rmgate[ledger]'"
            ) from exc
        self.where = _redacted(dsn)
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": int(connect_timeout_s)},
            timeout=connect_timeout_s,
        )
        self._pool.open(wait=True, timeout=connect_timeout_s)
        self._migrate()

    def _migrate(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS rmgate_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT max(version) FROM rmgate_schema").fetchone()
            found = (row[0] if row else 0) or 0
            if found > SCHEMA_VERSION:
                raise LedgerTooNew(
                    f"the ledger at {self.where} has schema version {found}; "
                    f"this rmgate knows up to {SCHEMA_VERSION}: upgrade rmgate "
                    "or use another database"
                )
            steps = POSTGRES.migrations()
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in steps[version]:
                    conn.execute(statement)
                conn.execute("INSERT INTO rmgate_schema (version) VALUES (%s)", (version,))

    def _run(
        self, sql: str, params: Sequence[Any] = (), *, many: bool = False, fetch: bool = False
    ) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            cur = conn.execute(self._sql(sql), tuple(params))
            return list(cur.fetchall()) if fetch else []

    def _transaction(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            for sql, params in statements:
                if params == [()]:
                    cur.execute(self._sql(sql))
                else:
                    cur.executemany(self._sql(sql), params)

    def close(self) -> None:
        self._pool.close()


def _redacted(dsn: str) -> str:
    """The DSN without its password (for messages and logs)."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
        if "password" in parts:
            parts["password"] = "***"
        return make_conninfo("", **parts)
    except Exception:  # noqa: BLE001 - a message, never a failure
        return "<dsn>"
