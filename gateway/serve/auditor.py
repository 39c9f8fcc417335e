"""The continuous audit: recorded rewards re-answered on a class mate, their bits compared.

Every row the ledger records passes ``Auditor.offer``; a share of them (``audit.sample``,
chosen by the receipt's hash) waits in a bounded queue until another slot of the same
numerics class is idle (``audit.idle_only``: nothing in flight, nothing queued, so a
trainer's request waits behind at most one audit request), then is sent there with the
cache out of the way (the transport, not the router: no ledger lookup, no single flight)
and compared with the recorded answer by the one definition of "the same answer"
(``gateway.core.api.answers``). At most ``audit.max_per_minute`` a minute.

A mismatch is pursued until the evidence names a slot or cannot
(``gateway.core.audit.policy.blame``): the recorded slot answers again, the peer answers
again, a third class mate answers if there is one. The named slot is drained
(``audit-<class>``: a class of its own until its engine restarts), what it recorded in the
class stops being answered from the ledger, and every ingress replica learns it from the
ledger's invalidation. The class is suspect until ``audit.clear_after`` identical
re-answers in a row. Every re-answer is a row of the ledger's ``audits`` table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.core.api.answers import answer_of
from gateway.core.api.errors import RmgateError
from gateway.core.audit.policy import AuditBook, AuditRecord, Evidence, Outcome, blame, sampled
from gateway.core.config.settings import AppConfig
from gateway.core.ledger_policy.row import LedgerRow
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.numerics import AUDIT_PREFIX, set_aside
from gateway.core.routing.placement import Placement
from gateway.core.routing.slots import SlotTable
from gateway.ledger.ledger import Ledger
from gateway.ledger.sql_store import Invalidation
from gateway.observability import metrics
from gateway.transport.slot_transport import SlotTransport

logger = logging.getLogger("rmgate")

#: How often the auditor looks again for an idle class mate.
IDLE_POLL_S = 0.2
#: The reason an audit's drain writes with its invalidation (how other replicas know it).
DRAIN_REASON = "audit"


class Auditor:
    """One ingress replica's auditor (``run`` is one of its background jobs)."""

    def __init__(
        self,
        config: AppConfig,
        transport: SlotTransport,
        slots: SlotTable,
        ledger: Ledger | None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.settings = config.gateway.audit
        #: Rows of these are engine answers a class mate can re-answer (not rule results,
        #: such as a code_tests rule's, recorded under a name of their own).
        self.served = frozenset(m.name for m in config.models)
        self.transport = transport
        self.slots = slots
        self.ledger = ledger
        self.sleep = sleep
        self.enabled = ledger is not None and self.settings.sample > 0
        self.book = AuditBook(self.settings.clear_after)
        self.queue: deque[LedgerRow] = deque()
        self._arrived: asyncio.Event | None = None
        #: Engine requests the auditor sent, per model, and those not answered yet: what
        #: the engines' own counts include beside the trainers' requests.
        self.calls: dict[str, int] = {}
        self.in_flight = 0
        if ledger is not None:
            ledger.on_invalidation.append(self._learn_drain)
            if self.enabled:
                ledger.on_record.append(self.offer)

    # ---- what GET /v1/audit shows -------------------------------------------------------
    def report(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "sample": self.settings.sample,
            "max_per_minute": self.settings.max_per_minute,
            "on_mismatch": self.settings.on_mismatch,
            "queued": len(self.queue),
            "engine_calls": dict(self.calls),
            "in_flight": self.in_flight,
            **self.book.as_dict(),
        }

    # ---- sampling -----------------------------------------------------------------------
    def offer(self, row: LedgerRow) -> None:
        """A freshly recorded row: queued when it is in the sample (never blocks)."""
        if row.status != 200 or set_aside(row.numerics_class) or row.model not in self.served:
            return
        if not sampled(row.identity, self.settings.sample):
            return
        if row.body is None:
            metrics.AUDIT_SKIPPED.labels(row.model, "no_body").inc()
            return
        if len(self.queue) >= self.settings.queue:
            old = self.queue.popleft()
            metrics.AUDIT_SKIPPED.labels(old.model, "queue_full").inc()
        self.queue.append(row)
        metrics.AUDIT_QUEUED.set(len(self.queue))
        if self._arrived is not None:
            self._arrived.set()

    async def run(self) -> None:
        """Forever: the oldest sampled row, on an idle class mate, at the configured rate."""
        if not self.enabled:
            return
        self._arrived = asyncio.Event()
        interval = 60.0 / self.settings.max_per_minute
        while True:
            if not self.queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            row = self.queue[0]
            peer = self._mate(row, idle=self.settings.idle_only)
            if peer is None:
                if not self._mates(row):
                    self.queue.popleft()
                    metrics.AUDIT_SKIPPED.labels(row.model, "no_mate").inc()
                    metrics.AUDIT_QUEUED.set(len(self.queue))
                    continue
                await self.sleep(IDLE_POLL_S)  # every mate busy: trainers first
                continue
            self.queue.popleft()
            metrics.AUDIT_QUEUED.set(len(self.queue))
            try:
                await self.audit(row, peer)
            except Exception:  # noqa: BLE001 - the auditor must never take the ingress down
                logger.exception("audit of %s failed", row.identity[:12])
            await self.sleep(interval)

    # ---- slots --------------------------------------------------------------------------
    def _serving(self, model: str, numerics_class: str) -> list[int]:
        """Slots of the class that serve now (described, awake, not set aside)."""
        directory = self.transport.directory
        return [
            s
            for s in range(self.slots.count(model))
            if directory.known_class(model, s) == numerics_class
            and directory.cached(model, s) is not None
        ]

    def _mates(self, row: LedgerRow) -> list[int]:
        """Where ``row`` may be re-answered: its class's other serving slots, else (a class
        of one slot) the recorded slot itself, which then checks that it still agrees
        with its own record."""
        serving = self._serving(row.model, row.numerics_class)
        others = [s for s in serving if s != row.slot]
        return others or [s for s in serving if s == row.slot]

    def _mate(self, row: LedgerRow, idle: bool) -> int | None:
        mates = self._mates(row)
        if idle:
            mates = [s for s in mates if self.transport.slot_load(row.model, s) == 0]
        if not mates:
            return None
        # the least loaded, then the next in order after the recorded slot (spread evenly)
        n = max(1, self.slots.count(row.model))
        return min(
            mates,
            key=lambda s: (self.transport.slot_load(row.model, s), (s - row.slot - 1) % n),
        )

    # ---- one audit ----------------------------------------------------------------------
    async def _answer(self, row: LedgerRow, slot: int) -> str | None:
        """Slot ``slot``'s canonical answer to ``row``'s request now (None: it failed)."""
        self.in_flight += 1
        try:
            reply = await self.transport.post(
                row.model,
                Placement(((slot, 0.0),)),
                row.endpoint,
                row.body or b"",
                Deadline.after(self.settings.timeout_s, on_sleep="refuse"),
            )
            if reply.status != 200:
                return None
            return answer_of(row.endpoint, json.loads(reply.body)).canonical
        except (RmgateError, ValueError) as exc:
            logger.info("audit: slot %s-%d did not answer: %s", row.model, slot, exc)
            return None
        finally:
            self.calls[row.model] = self.calls.get(row.model, 0) + 1
            self.in_flight -= 1

    async def audit(self, row: LedgerRow, peer: int) -> AuditRecord:
        """Re-answer ``row`` on ``peer``; pursue a mismatch; act; record."""
        recorded = answer_of(row.endpoint, json.loads(row.answer)).canonical
        got = await self._answer(row, peer)
        outcome: Outcome
        blamed: int | None = None
        if got is None:
            outcome, detail = "failed", f"slot {peer} did not answer"
        elif got == recorded:
            outcome, detail = "same", ""
        else:
            outcome = "different"
            found = blame(await self._evidence(row, peer, recorded, got))
            blamed, detail = found.slot, found.reason
        record = AuditRecord(
            row.identity,
            row.model,
            row.numerics_class,
            row.slot,
            peer,
            outcome,
            blamed,
            detail,
            time.time(),
        )
        self._count(record)
        if outcome == "different":
            logger.error(
                "audit: %s class %s: receipt %s recorded by slot %d, answered otherwise by "
                "slot %d: %s",
                row.model,
                row.numerics_class,
                row.identity,
                row.slot,
                peer,
                detail,
            )
            if blamed is not None:
                await self._drain(row.model, blamed, row.numerics_class, row.identity, detail)
        await self._keep(record)
        return record

    async def _evidence(self, row: LedgerRow, peer: int, recorded: str, got: str) -> Evidence:
        """More answers to the same request, to find which side of a mismatch is off."""
        original = await self._answer(row, row.slot) if row.slot != peer else None
        peer_again = await self._answer(row, peer)
        others = [s for s in self._mates(row) if s not in (row.slot, peer)]
        third_slot = others[0] if others else None
        third = await self._answer(row, third_slot) if third_slot is not None else None
        return Evidence(row.slot, recorded, peer, got, original, peer_again, third_slot, third)

    def _count(self, record: AuditRecord) -> None:
        tally = self.book.add(record)
        labels = (record.model, record.numerics_class)
        metrics.AUDIT.labels(*labels, record.outcome).inc()
        metrics.AUDIT_SUSPECT.labels(*labels).set(1 if tally.suspect else 0)

    async def _keep(self, record: AuditRecord) -> None:
        if self.ledger is None:
            return
        try:
            await asyncio.to_thread(self.ledger.store.write_audits, [record])
        except Exception as exc:  # noqa: BLE001 - the record is best effort, like the ledger's
            logger.warning("audit: row not recorded (%s: %s)", type(exc).__name__, exc)

    # ---- acting on a mismatch -----------------------------------------------------------
    async def _drain(
        self, model: str, slot: int, numerics_class: str, receipt: str, reason: str
    ) -> None:
        if self.settings.on_mismatch != "drain":
            return
        if self.transport.directory.known_class(model, slot) != numerics_class:
            return  # already drained (an earlier row of the same slot found it out)
        if not [s for s in self._serving(model, numerics_class) if s != slot]:
            logger.error(
                "audit: slot %s-%d not drained: it is the last slot serving class %s",
                model,
                slot,
                numerics_class,
            )
            return
        self.transport.directory.set_class(model, slot, AUDIT_PREFIX + numerics_class)
        metrics.AUDIT_DRAINED.labels(model, str(slot)).inc()
        self.book.drain(model, slot, numerics_class, receipt)
        logger.error(
            "audit: slot %s-%d drained out of class %s (%s); its keys go to its class mates",
            model,
            slot,
            numerics_class,
            reason,
        )
        if self.ledger is not None:
            n = await self.ledger.invalidate(
                model, numerics_class, slot, reason=f"{DRAIN_REASON}: {reason}"
            )
            logger.warning(
                "ledger: %d rows of %s slot %d (class %s) invalidated after the audit",
                n,
                model,
                slot,
                numerics_class,
            )

    def _learn_drain(self, inv: Invalidation) -> None:
        """Another ingress replica's auditor drained a slot: drain it here too."""
        if not inv.reason.startswith(DRAIN_REASON) or inv.slot is None or not inv.numerics_class:
            return
        directory = self.transport.directory
        if directory.known_class(inv.model, inv.slot) == inv.numerics_class:
            directory.set_class(inv.model, inv.slot, AUDIT_PREFIX + inv.numerics_class)
            logger.warning(
                "audit: slot %s-%d drained out of class %s (by another ingress replica)",
                inv.model,
                inv.slot,
                inv.numerics_class,
            )

    # ---- on demand (POST /v1/audit, rmgate ledger audit) ----------------------------------
    async def audit_now(
        self,
        model: str | None = None,
        since: float | None = None,
        sample: int = 100,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Audit up to ``sample`` recorded rows (drawn reproducibly from those of ``model``
        recorded at or after ``since``) now, one at a time, on any serving class mate
        (busy or not: an operator asked)."""
        ledger = self.ledger
        if ledger is None:
            return {"audited": 0, "records": [], "skipped": {"no_ledger": 1}}
        rows = await asyncio.to_thread(
            lambda: [
                r
                for r in ledger.store.rows(model=model, since=since)
                if r.status == 200 and not set_aside(r.numerics_class) and r.model in self.served
            ]
        )
        if len(rows) > sample:
            rows = random.Random(seed).sample(rows, sample)
            rows.sort(key=lambda r: (r.recorded_at, r.identity))
        records: list[AuditRecord] = []
        skipped: dict[str, int] = {}
        for row in rows:
            peer = self._mate(row, idle=False) if row.body is not None else None
            if peer is None:
                reason = "no_body" if row.body is None else "no_mate"
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            records.append(await self.audit(row, peer))
        counts = {o: sum(r.outcome == o for r in records) for o in ("same", "different", "failed")}
        return {
            "audited": len(records),
            **counts,
            "skipped": skipped,
            "records": [r.as_dict() for r in records],
        }
