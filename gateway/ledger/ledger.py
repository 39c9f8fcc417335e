"""The ledger as the request path sees it: look an identity up, record an answer.

A bounded in-memory LRU of recent rows sits in front of the store: a hit there costs a
dict lookup, not a database read. A miss in memory asks the store (in a thread, off the
event loop). Recording puts the row in memory at once (so an identical request right after
is a hit even before the batch is written) and hands it to the writer. ``run`` is the
ledger's life in an ingress process: the writer's task, the invalidations other processes
wrote (forgotten from memory within ``poll_s``), retention, and a flush at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

from gateway.core.config.settings import LedgerSettings
from gateway.core.ledger_policy.row import GroupRow, LedgerRow
from gateway.ledger.sql_store import Invalidation, SqlLedger
from gateway.ledger.writer import LedgerWriter

logger = logging.getLogger("rmgate")

#: How often a running ingress checks for retention work.
RETENTION_EVERY_S = 3600.0


class RecentRows:
    """At most ``capacity`` rows by identity, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[str, LedgerRow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, identity: str) -> LedgerRow | None:
        row = self._rows.get(identity)
        if row is not None:
            self._rows.move_to_end(identity)
        return row

    def put(self, row: LedgerRow) -> None:
        if self.capacity <= 0:
            return
        self._rows[row.identity] = row
        self._rows.move_to_end(row.identity)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def forget(self, model: str, numerics_class: str | None = None, slot: int | None = None) -> int:
        """Drop a model's rows (of one class, of one slot): what an invalidation stops
        hitting."""
        gone = [
            k
            for k, r in self._rows.items()
            if r.model == model
            and (numerics_class is None or r.numerics_class == numerics_class)
            and (slot is None or r.slot == slot)
        ]
        for k in gone:
            del self._rows[k]
        return len(gone)


class Ledger:
    """Recent rows in memory over a store, and the writer that fills the store."""

    def __init__(
        self,
        store: SqlLedger,
        writer: LedgerWriter,
        recent: int = 100_000,
        *,
        poll_s: float = 2.0,
        retention_days: float | None = None,
        retention_rows: int | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.recent = RecentRows(recent)
        self.poll_s = poll_s
        self.retention_days = retention_days
        self.retention_rows = retention_rows
        self._seen_invalidation = 0
        #: Told of every recorded row (the auditor samples them); must not block.
        self.on_record: list[Callable[[LedgerRow], None]] = []
        #: Told of every invalidation any process wrote (an audit's drain reaches every
        #: ingress replica this way); must not block.
        self.on_invalidation: list[Callable[[Invalidation], None]] = []

    @classmethod
    def open(cls, settings: LedgerSettings) -> Ledger:
        """The ledger ``settings`` describe (raises ``LedgerTooNew``/``LedgerUnavailable``)."""
        store = open_store(settings)
        writer = LedgerWriter(
            store,
            max_buffered=settings.max_buffered,
            batch_rows=settings.batch_rows,
            flush_interval_s=settings.flush_interval_s,
        )
        ledger = cls(
            store,
            writer,
            settings.memory_rows,
            retention_days=settings.retention_days,
            retention_rows=settings.retention_rows,
        )
        try:
            ledger._seen_invalidation = store.last_invalidation()
        except Exception:  # noqa: BLE001 - a store down at start: learn them later
            pass
        return ledger

    async def lookup(self, identity: str) -> LedgerRow | None:
        """The recorded row of ``identity``: memory first, then the store (a store that
        cannot answer is a miss: the request goes to an engine)."""
        row = self.recent.get(identity)
        if row is None:
            try:
                row = await asyncio.to_thread(self.store.get, identity)
            except Exception as exc:  # noqa: BLE001 - never fail a request on the ledger
                logger.warning(
                    "ledger: lookup failed (%s: %s); answering from an engine",
                    type(exc).__name__,
                    exc,
                )
                return None
            if row is not None:
                self.recent.put(row)
        return row

    def peek(self, identity: str) -> LedgerRow | None:
        """The row of ``identity`` if it is in memory (no I/O, never blocks)."""
        return self.recent.get(identity)

    async def row(self, identity: str) -> LedgerRow | None:
        """The row of a receipt, for ``GET /v1/ledger/{receipt}`` (invalidated ones too)."""
        row = self.recent.get(identity)
        if row is None:
            row = await asyncio.to_thread(self.store.get, identity, include_invalidated=True)
        return None if row is None else row.readable()

    def record(self, row: LedgerRow, remember: bool = True) -> None:
        """Keep ``row`` (never blocks, never fails the request). ``remember``: answer it
        from memory too, unless memory holds the identity already (the first row of an
        identity is the one kept, in the store as in memory). Not remembered: a row whose
        identity the store was not asked for (cache off for it, its class unknown when it
        was placed): the store may hold an earlier answer, whose bytes a hit returns."""
        if remember and self.recent.get(row.identity) is None:
            self.recent.put(row)
        self.writer.record(row)
        for observer in self.on_record:
            observer(row)

    def record_group(self, row: GroupRow) -> None:
        """Keep a group scorer's row (never blocks, never fails the request)."""
        self.writer.record_group(row)

    def counted(self, model: str, numerics_class: str | None, outcome: str) -> None:
        self.writer.count(model, numerics_class or "", outcome)

    async def run(self) -> None:
        """The ledger's background work until cancelled; then a last flush."""
        self.writer.start()
        await self._retain()
        next_retention = asyncio.get_running_loop().time() + RETENTION_EVERY_S
        try:
            while True:
                await asyncio.sleep(self.poll_s)
                await self._learn_invalidations()
                if asyncio.get_running_loop().time() >= next_retention:
                    await self._retain()
                    next_retention += RETENTION_EVERY_S
        finally:
            await self.writer.aclose()

    async def _learn_invalidations(self) -> None:
        try:
            found = await asyncio.to_thread(self.store.invalidations_since, self._seen_invalidation)
        except Exception:  # noqa: BLE001 - the store is down: ask again next time
            return
        for inv in found:
            gone = self.recent.forget(inv.model, inv.numerics_class, inv.slot)
            self._seen_invalidation = inv.id
            for observer in self.on_invalidation:
                observer(inv)
            logger.warning(
                "ledger: rows of model %s%s%s invalidated; %d forgotten from memory",
                inv.model,
                f" class {inv.numerics_class}" if inv.numerics_class else "",
                f" slot {inv.slot}" if inv.slot is not None else "",
                gone,
            )

    async def _retain(self) -> None:
        if self.retention_days is None and self.retention_rows is None:
            return
        try:
            gone = await asyncio.to_thread(
                self.store.prune,
                older_than_s=None if self.retention_days is None else self.retention_days * 86400.0,
                keep_rows=self.retention_rows,
            )
        except Exception as exc:  # noqa: BLE001
            logger.warning("ledger: retention failed (%s: %s)", type(exc).__name__, exc)
            return
        if gone:
            logger.info("ledger: retention deleted %d rows", gone)

    async def invalidate(
        self,
        model: str,
        numerics_class: str | None = None,
        slot: int | None = None,
        reason: str = "invalidated",
    ) -> int:
        """Invalidate in the store (every process learns of it) and in memory now."""
        self.recent.forget(model, numerics_class, slot)
        return await asyncio.to_thread(self.store.invalidate, model, numerics_class, slot, reason)


def open_store(settings: LedgerSettings) -> SqlLedger:
    """The store of ``settings``' backend."""
    from gateway.ledger.sql_store import LedgerUnavailable

    if settings.backend == "postgres":
        dsn = settings.resolved_dsn()
        if not dsn:
            raise LedgerUnavailable(
                f"ledger.backend postgres needs `dsn` or the environment "
                f"variable {settings.dsn_env}"
            )
        from gateway.ledger.postgres_store import PostgresLedger

        return PostgresLedger(dsn)
    if settings.backend == "sqlite":
        from gateway.ledger.sqlite_store import SqliteLedger

        return SqliteLedger(settings.sqlite_path())
    raise LedgerUnavailable("the ledger is off (gateway.ledger.backend: off)")
