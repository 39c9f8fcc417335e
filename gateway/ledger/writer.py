"""Recording off the request path: a bounded buffer and one writer task.

``record`` never blocks and never fails a request: it appends to a buffer. One task per
ingress process flushes the buffer in batches, every ``flush_interval_s`` or as soon as a
batch is full, running the store's blocking write in a thread. When the store is slow or
unreachable the rows stay buffered (in order) and the writer tries again; past
``max_buffered`` rows a new row is dropped and counted (``rmgate_ledger_rows_dropped_total``
and a log line), never a request. ``aclose`` (a clean shutdown) flushes what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.core.ledger_policy.row import GroupRow, LedgerRow
from gateway.observability import metrics

logger = logging.getLogger("rmgate")


class LedgerStore(Protocol):
    """Where rows go (``SqliteLedger``, the PostgreSQL store): blocking calls."""

    def write(
        self,
        rows: Sequence[LedgerRow],
        counts: Mapping[tuple[str, str, str], int] | None = None,
        groups: Sequence[GroupRow] = (),
    ) -> None: ...

    def get(self, identity: str) -> LedgerRow | None: ...

    def close(self) -> None: ...


class LedgerWriter:
    """Buffers rows and writes them in batches from one task."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        max_buffered: int = 100_000,
        batch_rows: int = 512,
        flush_interval_s: float = 0.2,
        retry_s: float = 1.0,
    ) -> None:
        self.store = store
        self.max_buffered = max_buffered
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self._buffer: deque[LedgerRow] = deque()
        #: When each buffered row was handed over (monotonic), in the buffer's order: the
        #: commit of its batch observes ``rmgate_ledger_write_lag_seconds``.
        self._since: deque[float] = deque()
        #: Cache outcomes per (model, class, outcome) not written yet.
        self._counts: Counter[tuple[str, str, str]] = Counter()
        #: Group rows not written yet (few: one per group scorer run).
        self._groups: list[GroupRow] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        self.written = 0
        #: Rows taken from the buffer for the batch being written (they count toward the
        #: bound: a batch that fails goes back to the buffer).
        self._writing = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer) + self._writing

    def record(self, row: LedgerRow) -> None:
        """Queue ``row`` for the next batch (dropped and counted past the bound)."""
        if self.buffered >= self.max_buffered:
            self.dropped += 1
            metrics.LEDGER_DROPPED.inc()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.error(
                    "ledger: buffer full (%d rows, the store is not keeping up); "
                    "%d rows not recorded so far",
                    self.max_buffered,
                    self.dropped,
                )
            return
        self._buffer.append(row)
        self._since.append(time.monotonic())
        metrics.LEDGER_BUFFERED.set(len(self._buffer))
        if len(self._buffer) >= self.batch_rows:
            self._wake.set()

    def record_group(self, row: GroupRow) -> None:
        """Queue a group row for the next batch (dropped and counted past the bound)."""
        if self.buffered + len(self._groups) >= self.max_buffered:
            self.dropped += 1
            metrics.LEDGER_DROPPED.inc()
            return
        self._groups.append(row)

    def count(self, model: str, numerics_class: str, outcome: str) -> None:
        """Count one cache outcome (written with the next batch)."""
        self._counts[(model, numerics_class, outcome)] += 1

    def start(self) -> None:
        """Start the writer task in the running loop (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._closed:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            if not await self.flush():
                await asyncio.sleep(self.retry_s)  # the store is down: keep the rows, wait

    async def flush(self) -> bool:
        """Write what is buffered, batch by batch; False when the store refused a batch
        (its rows stay at the front of the buffer, in order)."""
        while self._buffer or self._counts or self._groups:
            batch = [self._buffer.popleft() for _ in range(min(self.batch_rows, len(self._buffer)))]
            since = [self._since.popleft() for _ in batch]
            counts, self._counts = self._counts, Counter()
            groups, self._groups = self._groups, []
            self._writing = len(batch)
            try:
                # a group row after its members' rows: in the same transaction
                await asyncio.to_thread(self.store.write, batch, counts, groups)
            except Exception as exc:  # noqa: BLE001 - any store failure: keep the rows
                self._buffer.extendleft(reversed(batch))
                self._since.extendleft(reversed(since))
                self._counts.update(counts)
                self._groups[:0] = groups
                metrics.LEDGER_WRITE_ERRORS.inc()
                logger.warning(
                    "ledger: write of %d rows failed (%s: %s); %d rows buffered, retrying",
                    len(batch),
                    type(exc).__name__,
                    exc,
                    len(self._buffer),
                )
                return False
            finally:
                self._writing = 0
                metrics.LEDGER_BUFFERED.set(len(self._buffer))
            self.written += len(batch)
            metrics.LEDGER_WRITTEN.inc(len(batch))
            committed = time.monotonic()
            for handed in since:
                metrics.LEDGER_WRITE_LAG.observe(committed - handed)
        return True

    async def aclose(self) -> None:
        """Stop the task, write what is left (one last try), close the store."""
        self._closed = True
        self._wake.set()
        if self._task is not None:  # let a batch in progress finish (its thread cannot stop)
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.retry_s + 5.0)
            except TimeoutError:
                self._task.cancel()
        if not await self.flush():
            logger.error("ledger: %d rows could not be written at shutdown", len(self._buffer))
        await asyncio.to_thread(self.store.close)
