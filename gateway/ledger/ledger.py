"""The ledger as the request path sees it: look an identity up, record an answer.

A bounded in-memory LRU of recent rows sits in front of the store: a hit there costs a
dict lookup, not a database read. A miss in memory asks the store (in a thread, off the
event loop). Recording puts the row in memory at once (so an identical request right after
is a hit even before the batch is written) and hands it to the writer.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.writer import LedgerStore, LedgerWriter


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

    def forget(self, model: str, numerics_class: str | None = None) -> int:
        """Drop a model's rows (of one class): what ``ledger invalidate`` stops hitting."""
        gone = [k for k, r in self._rows.items() if r.model == model
                and (numerics_class is None or r.numerics_class == numerics_class)]
        for k in gone:
            del self._rows[k]
        return len(gone)


class Ledger:
    """Recent rows in memory over a store, and the writer that fills the store."""

    def __init__(self, store: LedgerStore, writer: LedgerWriter, recent: int = 100_000) -> None:
        self.store = store
        self.writer = writer
        self.recent = RecentRows(recent)

    async def lookup(self, identity: str) -> LedgerRow | None:
        """The recorded row of ``identity``: memory first, then the store."""
        row = self.recent.get(identity)
        if row is None:
            row = await asyncio.to_thread(self.store.get, identity)
            if row is not None:
                self.recent.put(row)
        return row

    def record(self, row: LedgerRow) -> None:
        """Keep ``row`` (never blocks, never fails the request)."""
        self.recent.put(row)
        self.writer.record(row)
