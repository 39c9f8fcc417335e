"""What the SQLite and the PostgreSQL ledgers share: the schema, its migrations and every
query, written once; each backend supplies its connection, its placeholder and its types.

Rows are keyed by identity. The first answer recorded for an identity is kept (answers of
one identity are bitwise equal by construction); a row an operator invalidated (``rmgate
ledger invalidate``, a canary drift) is no longer found by lookups and is replaced by the
next fresh answer. Invalidations are also rows of their own, so every running ingress
replica (on any host) learns of them and forgets the rows it holds in memory. Hits, shared
answers and misses are counted per model and class (``cache_counts``) for ``rmgate ledger
stats``. Calls are blocking: the writer and the lookups run them in threads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.audit.policy import AuditRecord
from gateway.core.ledger_policy.row import GroupRow, LedgerRow

#: The schema this code reads and writes.
SCHEMA_VERSION = 4

COLUMNS = (
    "identity",
    "model",
    "numerics_class",
    "endpoint",
    "body_digest",
    "body",
    "answer",
    "status",
    "score",
    "text",
    "slot",
    "fingerprint",
    "seed",
    "latency_s",
    "recorded_at",
)
AUDIT_COLUMNS = (
    "receipt",
    "model",
    "numerics_class",
    "recorded_slot",
    "audit_slot",
    "outcome",
    "blamed_slot",
    "detail",
    "audited_at",
)
GROUP_COLUMNS = (
    "identity",
    "group_identity",
    "program",
    "component",
    "scorer",
    "members",
    "recorded_at",
)


class LedgerTooNew(RuntimeError):
    """The database was written by a newer rmgate (a higher schema version)."""


class LedgerUnavailable(RuntimeError):
    """The ledger's store cannot be opened (its driver is not installed, no DSN)."""


@dataclass(frozen=True)
class Dialect:
    """What differs between the backends' SQL."""

    mark: str  # the parameter placeholder
    blob: str
    real: str
    bigint: str
    serial: str  # an auto-numbered primary key column

    def migrations(self) -> dict[int, tuple[str, ...]]:
        """Statements that take a database from version ``n - 1`` to ``n``."""
        return {
            1: (
                f"""CREATE TABLE rewards (
                       identity TEXT PRIMARY KEY,
                       model TEXT NOT NULL,
                       numerics_class TEXT NOT NULL,
                       endpoint TEXT NOT NULL,
                       body_digest TEXT NOT NULL,
                       body {self.blob},
                       answer {self.blob} NOT NULL,
                       status INTEGER NOT NULL,
                       score {self.real},
                       text TEXT,
                       slot INTEGER NOT NULL,
                       fingerprint TEXT,
                       seed {self.bigint},
                       latency_s {self.real} NOT NULL,
                       recorded_at {self.real} NOT NULL)""",
                "CREATE INDEX rewards_by_model_time ON rewards (model, recorded_at)",
                "CREATE INDEX rewards_by_class ON rewards (numerics_class)",
            ),
            2: (
                f"ALTER TABLE rewards ADD COLUMN invalidated_at {self.real}",
                f"""CREATE TABLE invalidations (
                       id {self.serial},
                       model TEXT NOT NULL,
                       numerics_class TEXT,
                       slot INTEGER,
                       reason TEXT NOT NULL,
                       at {self.real} NOT NULL)""",
                f"""CREATE TABLE cache_counts (
                       model TEXT NOT NULL,
                       numerics_class TEXT NOT NULL,
                       outcome TEXT NOT NULL,
                       n {self.bigint} NOT NULL,
                       PRIMARY KEY (model, numerics_class, outcome))""",
            ),
            3: (
                f"""CREATE TABLE group_rows (
                       identity TEXT PRIMARY KEY,
                       group_identity TEXT NOT NULL,
                       program TEXT NOT NULL,
                       component TEXT NOT NULL,
                       scorer TEXT NOT NULL,
                       members TEXT NOT NULL,
                       recorded_at {self.real} NOT NULL)""",
                "CREATE INDEX group_rows_by_program ON group_rows (program, recorded_at)",
            ),
            4: (
                f"""CREATE TABLE audits (
                       id {self.serial},
                       receipt TEXT NOT NULL,
                       model TEXT NOT NULL,
                       numerics_class TEXT NOT NULL,
                       recorded_slot INTEGER NOT NULL,
                       audit_slot INTEGER,
                       outcome TEXT NOT NULL,
                       blamed_slot INTEGER,
                       detail TEXT NOT NULL,
                       audited_at {self.real} NOT NULL)""",
                "CREATE INDEX audits_by_time ON audits (audited_at)",
                "CREATE INDEX audits_by_receipt ON audits (receipt)",
            ),
        }


@dataclass(frozen=True)
class Invalidation:
    id: int
    model: str
    numerics_class: str | None
    slot: int | None
    reason: str = ""


class SqlLedger:
    """The ledger's queries over a DB-API connection the subclass provides."""

    dialect: Dialect
    where: str  # how the store names itself in messages

    # ---- what a backend provides -------------------------------------------------------
    def _run(
        self, sql: str, params: Sequence[Any] = (), *, many: bool = False, fetch: bool = False
    ) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self.dialect.mark)

    # ---- writing -------------------------------------------------------------------------
    def write(
        self,
        rows: Sequence[LedgerRow],
        counts: Mapping[tuple[str, str, str], int] | None = None,
        groups: Sequence[GroupRow] = (),
    ) -> None:
        """Insert ``rows`` (an identity already recorded is kept unless it was invalidated)
        and ``groups`` (the first row of a group identity is kept), and add ``counts``
        (``(model, class, outcome) -> n``), in one transaction."""
        if not rows and not counts and not groups:
            return
        values = [tuple(getattr(r, c) for c in COLUMNS) for r in map(LedgerRow.readable, rows)]
        marks = ", ".join("?" * len(COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
        statements: list[tuple[str, list[tuple[Any, ...]]]] = []
        if values:
            statements.append(
                (
                    f"INSERT INTO rewards ({', '.join(COLUMNS)}, invalidated_at) "
                    f"VALUES ({marks}, NULL) ON CONFLICT (identity) DO UPDATE SET {updates}, "
                    "invalidated_at = NULL WHERE rewards.invalidated_at IS NOT NULL",
                    values,
                )
            )
        if groups:
            statements.append(
                (
                    f"INSERT INTO group_rows ({', '.join(GROUP_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(GROUP_COLUMNS))}) "
                    "ON CONFLICT (identity) DO NOTHING",
                    [tuple(getattr(g, c) for c in GROUP_COLUMNS) for g in groups],
                )
            )
        if counts:
            statements.append(
                (
                    "INSERT INTO cache_counts (model, numerics_class, outcome, n) "
                    "VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (model, numerics_class, outcome) DO UPDATE SET "
                    "n = cache_counts.n + excluded.n",
                    [(m, c, o, n) for (m, c, o), n in counts.items()],
                )
            )
        self._transaction(statements)

    def _transaction(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        raise NotImplementedError

    def write_audits(self, records: Sequence[AuditRecord]) -> None:
        """Keep the auditor's re-answers (one row each: what was checked, when, found what)."""
        if records:
            self._transaction(
                [
                    (
                        f"INSERT INTO audits ({', '.join(AUDIT_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(AUDIT_COLUMNS))})",
                        [tuple(getattr(r, c) for c in AUDIT_COLUMNS) for r in records],
                    )
                ]
            )

    def audits(
        self, *, model: str | None = None, since: float | None = None, limit: int = 1000
    ) -> list[AuditRecord]:
        """The newest ``limit`` audit rows (of ``model``, at or after ``since``), oldest first."""
        where, params = ["audited_at >= ?"], list[Any]([since if since is not None else 0.0])
        if model is not None:
            where.append("model = ?")
            params.append(model)
        found = self._run(
            f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audits WHERE {' AND '.join(where)} "
            f"ORDER BY audited_at DESC, id DESC LIMIT {int(limit)}",
            params,
            fetch=True,
        )
        return [AuditRecord(*raw) for raw in reversed(found)]

    # ---- reading -------------------------------------------------------------------------
    def get(self, identity: str, *, include_invalidated: bool = False) -> LedgerRow | None:
        """The row of ``identity`` (an invalidated one only when asked: the cache never)."""
        live = "" if include_invalidated else " AND invalidated_at IS NULL"
        found = self._run(
            f"SELECT {', '.join(COLUMNS)} FROM rewards WHERE identity = ?{live}",
            (identity,),
            fetch=True,
        )
        return None if not found else _row(found[0])

    def group_rows(self, *, program: str | None = None) -> list[GroupRow]:
        """Every group row (of ``program``), oldest first."""
        where, params = ("WHERE program = ? ", (program,)) if program is not None else ("", ())
        return [
            GroupRow(*raw)
            for raw in self._run(
                f"SELECT {', '.join(GROUP_COLUMNS)} FROM group_rows {where}"
                "ORDER BY recorded_at, identity",
                params,
                fetch=True,
            )
        ]

    def count(self) -> int:
        return int(self._run("SELECT count(*) FROM rewards", fetch=True)[0][0])

    def rows(
        self, *, model: str | None = None, since: float | None = None, batch: int = 1000
    ) -> Iterator[LedgerRow]:
        """Every live row (of ``model``, recorded at or after ``since``), oldest first,
        read ``batch`` at a time."""
        where, params = ["invalidated_at IS NULL"], list[Any]()
        if model is not None:
            where.append("model = ?")
            params.append(model)
        after: tuple[float, str] = (since if since is not None else float("-inf"), "")
        while True:
            found = self._run(
                f"SELECT {', '.join(COLUMNS)} FROM rewards WHERE {' AND '.join(where)} AND "
                "(recorded_at > ? OR (recorded_at = ? AND identity > ?)) "
                f"ORDER BY recorded_at, identity LIMIT {int(batch)}",
                (*params, after[0], after[0], after[1]),
                fetch=True,
            )
            for raw in found:
                yield _row(raw)
            if len(found) < batch:
                return
            after = (found[-1][COLUMNS.index("recorded_at")], found[-1][0])

    def stats(self) -> list[dict[str, Any]]:
        """Per model and class: rows, and the cache's hits, shared answers and misses."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for model, cls, n, first, last in self._run(
            "SELECT model, numerics_class, count(*), min(recorded_at), max(recorded_at) "
            "FROM rewards WHERE invalidated_at IS NULL GROUP BY model, numerics_class",
            fetch=True,
        ):
            out[(model, cls)] = {
                "model": model,
                "numerics_class": cls,
                "rows": int(n),
                "first": first,
                "last": last,
            }
        for model, cls, outcome, n in self._run(
            "SELECT model, numerics_class, outcome, n FROM cache_counts", fetch=True
        ):
            entry = out.setdefault(
                (model, cls),
                {"model": model, "numerics_class": cls, "rows": 0, "first": None, "last": None},
            )
            entry[outcome] = int(n)
        for entry in out.values():
            asked = sum(entry.get(k, 0) for k in ("hit", "shared", "miss"))
            entry["hit_rate"] = (
                (entry.get("hit", 0) + entry.get("shared", 0)) / asked if asked else None
            )
        return sorted(out.values(), key=lambda e: (e["model"], e["numerics_class"]))

    # ---- invalidation and retention ------------------------------------------------------
    def invalidate(
        self,
        model: str,
        numerics_class: str | None = None,
        slot: int | None = None,
        reason: str = "rmgate ledger invalidate",
    ) -> int:
        """Stop hits for ``model``'s rows (of one class, answered by one slot); returns how
        many rows. Every ingress replica forgets them from memory within seconds."""
        where, params = ["model = ?", "invalidated_at IS NULL"], list[Any]([model])
        if numerics_class is not None:
            where.append("numerics_class = ?")
            params.append(numerics_class)
        if slot is not None:
            where.append("slot = ?")
            params.append(slot)
        now = time.time()
        before = self._run(
            f"SELECT count(*) FROM rewards WHERE {' AND '.join(where)}", params, fetch=True
        )[0][0]
        self._transaction(
            [
                (
                    f"UPDATE rewards SET invalidated_at = ? WHERE {' AND '.join(where)}",
                    [(now, *params)],
                ),
                (
                    "INSERT INTO invalidations (model, numerics_class, slot, reason, at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(model, numerics_class, slot, reason, now)],
                ),
            ]
        )
        return int(before)

    def invalidations_since(self, last_id: int) -> list[Invalidation]:
        return [
            Invalidation(int(i), m, c, s, r)
            for i, m, c, s, r in self._run(
                "SELECT id, model, numerics_class, slot, reason FROM invalidations WHERE id > ? "
                "ORDER BY id",
                (last_id,),
                fetch=True,
            )
        ]

    def last_invalidation(self) -> int:
        return int(self._run("SELECT coalesce(max(id), 0) FROM invalidations", fetch=True)[0][0])

    def prune(self, *, older_than_s: float | None = None, keep_rows: int | None = None) -> int:
        """Delete rows older than ``older_than_s`` and past the newest ``keep_rows``."""
        before = self.count()
        statements: list[tuple[str, list[tuple[Any, ...]]]] = []
        if older_than_s is not None:
            statements.append(
                ("DELETE FROM rewards WHERE recorded_at < ?", [(time.time() - older_than_s,)])
            )
        if keep_rows is not None:
            statements.append(
                (
                    "DELETE FROM rewards WHERE identity IN (SELECT identity FROM rewards "
                    f"ORDER BY recorded_at DESC, identity DESC OFFSET {int(keep_rows)})"
                    if self.dialect.mark == "%s"
                    else "DELETE FROM rewards WHERE identity IN (SELECT identity FROM rewards "
                    f"ORDER BY recorded_at DESC, identity DESC LIMIT -1 OFFSET {int(keep_rows)})",
                    [()],
                )
            )
        if statements:
            self._transaction(statements)
        return before - self.count()


def _row(raw: Sequence[Any]) -> LedgerRow:
    values = list(raw)
    for i in (COLUMNS.index("body"), COLUMNS.index("answer")):
        if values[i] is not None and not isinstance(values[i], bytes):
            values[i] = bytes(values[i])  # PostgreSQL's bytea comes back as memoryview
    return LedgerRow(*values)
