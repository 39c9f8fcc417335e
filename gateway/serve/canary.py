"""The canary: every ``canary_interval_s`` each slot re-answers the golden probes.

Batch invariance and bitwise equality are properties of kernels, drivers and builds, which
can change under a running gateway (a driver update, a replica restarted on other
hardware under the same name). The canary sends each slot the same probes the replica
answered at start-up (``deployments.engine.selftest.probe_requests``), one at a time and
through the slot's gate (a serialized engine stays serialized), and hashes the answers with
the one definition (``gateway.core.routing.numerics.probe_digest_of``). A slot whose digest differs
from the one it reported leaves its class: it gets a class of its own (``drift-<digest>``),
so under ``class_policy: strict`` it is drained and its keys go to its class mates, with
both digests in the log and the metric ``rmgate_canary_drift_total``. It is re-admitted
when its digest matches again. A slot that does not answer is not judged (that is the
transport's business).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from deployments.engine.selftest import probe_requests
from gateway.core.api.answers import answer_of
from gateway.core.api.errors import RmgateError
from gateway.core.config.settings import AppConfig
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.keys import canonical_json
from gateway.core.routing.numerics import AUDIT_PREFIX, DRIFT_PREFIX, probe_digest_of
from gateway.core.routing.placement import Placement
from gateway.core.routing.slots import SlotTable
from gateway.observability import metrics
from gateway.transport.directory import engine_of
from gateway.transport.slot_transport import SlotTransport

logger = logging.getLogger("rmgate")


@dataclass(frozen=True)
class CanaryVerdict:
    model: str
    slot: int
    expected: str | None
    observed: str | None
    #: ``match``, ``drift``, ``readmitted``, ``unreachable``, ``restarted`` (another engine
    #: answered than the one described), ``held`` (drained by the audit) or ``unknown``
    #: (no digest).
    outcome: str


class Canary:
    """Re-answers the probes on every slot; drains the ones whose numerics changed."""

    def __init__(
        self,
        config: AppConfig,
        transport: SlotTransport,
        slots: SlotTable,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_drift: Callable[[str, int, str], Awaitable[Any]] | None = None,
    ) -> None:
        self.config = config
        #: Told ``(model, slot, class it left)`` when a slot drifts: the ledger stops hits
        #: for what that slot recorded in that class.
        self.on_drift = on_drift
        self.transport = transport
        self.slots = slots
        self.sleep = sleep

    async def check(self, model: str, slot: int) -> CanaryVerdict:
        spec = self.config.model(model)
        assert spec is not None
        info = await self.transport.describe(model, slot, 5.0)
        numerics = (info.raw.get("numerics") or {}) if info is not None else {}
        expected, reported = numerics.get("probe_digest"), numerics.get("class_id")
        if info is None or expected is None:
            return CanaryVerdict(
                model, slot, expected, None, "unreachable" if info is None else "unknown"
            )
        answers = []
        pinned = Placement(((slot, self.config.gateway.slot_wait_s),))
        try:
            for path, body in probe_requests(spec.kind, spec.name, spec.max_model_len):
                reply = await self.transport.post(
                    model,
                    pinned,
                    path,
                    canonical_json(body),
                    Deadline.after(self.config.gateway.request_timeout_s),
                )
                if reply.status != 200:
                    raise ValueError(f"probe answered {reply.status}")
                answers.append(answer_of(path, json.loads(reply.body)).canonical)
        except (RmgateError, ValueError) as exc:
            logger.warning("canary: slot %s-%d not judged: %s", model, slot, exc)
            return CanaryVerdict(model, slot, expected, None, "unreachable")
        observed = probe_digest_of(answers)
        now = self.transport.directory.cached(model, slot)
        if now is None or engine_of(now) != engine_of(info):
            # The slot restarted during the check: the answers may be the new engine's,
            # the expected digest the old one's. Not judged; the new engine reported its
            # own digest at start-up and is checked on the next pass.
            logger.info("canary: slot %s-%d restarted during its check; not judged", model, slot)
            return CanaryVerdict(model, slot, expected, None, "restarted")
        current = self.transport.directory.known_class(model, slot)
        if observed != expected:
            drifted = DRIFT_PREFIX + observed[:12]
            if current != drifted:
                logger.warning(
                    "canary: slot %s-%d changed its numerics: probe digest %s at "
                    "start-up, %s now; it leaves class %s",
                    model,
                    slot,
                    expected[:12],
                    observed[:12],
                    reported,
                )
                metrics.CANARY_DRIFT.labels(model, str(slot)).inc()
                if self.on_drift is not None and reported:
                    await self.on_drift(model, slot, reported)
            self.transport.directory.set_class(model, slot, drifted)
            return CanaryVerdict(model, slot, expected, observed, "drift")
        if current is not None and current.startswith(AUDIT_PREFIX):
            # The audit caught it answering differently on real requests, which its probes
            # may not show: it stays out until its engine restarts (``SlotDirectory``).
            return CanaryVerdict(model, slot, expected, observed, "held")
        if current != reported:
            logger.warning(
                "canary: slot %s-%d matches its probe digest again; back in class %s",
                model,
                slot,
                reported,
            )
            self.transport.directory.set_class(model, slot, reported)
            return CanaryVerdict(model, slot, expected, observed, "readmitted")
        return CanaryVerdict(model, slot, expected, observed, "match")

    async def check_all(self) -> list[CanaryVerdict]:
        verdicts = []
        for spec in self.config.models:
            for slot in range(self.slots.count(spec.name)):
                verdicts.append(await self.check(spec.name, slot))
        return verdicts

    async def run(self) -> None:
        """Forever: wait an interval, check every slot (one slot at a time)."""
        interval = self.config.gateway.canary_interval_s
        if interval <= 0:
            return
        while True:
            await self.sleep(interval)
            try:
                await self.check_all()
            except Exception:  # noqa: BLE001 - the canary must never take the ingress down
                logger.exception("canary pass failed")
