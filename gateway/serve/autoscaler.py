"""The autoscaler: one Ray actor per gateway that applies ``ScaleRule`` decisions.

Every ingress replica reports its requests per model twice a second
(``AutoscaleFeed``); the actor adds the reports up, asks each model's rule
(``gateway.core.elastic.autoscale``) and applies a decision with ``rmgate scale``'s
gap-free steps through the Serve controller (``ControllerAdmin``):

* up: the new slot applications start; each must report its model's numerics class (its
  golden probes answered like slot 0's) before the ingress routes to it, else the scale
  rolls back and says why;
* down: the ingress stops routing to the removed slots, each drains (its engine's gate
  paused, the requests inside finished: ``deployments.slot.lifecycle``), then they go;
* to zero: down to one slot, which then sleeps (``slept_by: autoscaler``: the next
  request wakes it, whatever the model's ``on_sleep``).

Each decision is a log line and, through the ingress, ``rmgate_autoscale_decisions_total``
with its reason. The actor belongs to the ingress replica that created it: it ends with
the gateway, and the next report makes a new one if that replica goes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray

from gateway.core.config.elastic import AutoscalingSpec
from gateway.core.elastic.autoscale import ScaleDecision, ScaleRule
from gateway.observability import metrics
from gateway.serve.topology import slot_app_name

logger = logging.getLogger("rmgate")

TICK_S = 0.5
#: A replica's report older than this no longer counts (the replica went away).
STALE_S = 5.0
ACTOR_NAME = "rmgate-autoscaler"
#: How long a model a user put to sleep is left alone before the scaler looks again.
HOLD_S = 10.0
#: Decisions per model that ``/v1/models`` shows.
RECENT = 5


def _slot(model: str, slot: int) -> Any:
    from ray import serve

    return serve.get_app_handle(slot_app_name(model, slot))


@ray.remote(num_cpus=0)
class SlotAutoscaler:
    """Adds up the ingress replicas' reports and applies the rules' decisions."""

    def __init__(self, specs: dict[str, dict[str, Any]], startup_timeout_s: float) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.rules = {m: ScaleRule(m, AutoscalingSpec(**s)) for m, s in specs.items()}
        self.timeout_s = startup_timeout_s
        self.reports: dict[str, tuple[float, dict[str, int]]] = {}
        self.counts: dict[str, int] = {}
        #: Per model, its slots that do not serve yet (an ingress has not described them).
        self.starting: dict[str, int] = {}
        #: What the autoscaler is doing per model now ("scaling 1 -> 2").
        self.scaling: dict[str, str] = {}
        #: Models the autoscaler scaled to zero (slot 0 asleep).
        self.asleep: set[str] = set()
        self.decisions: list[dict[str, Any]] = []
        #: Models asleep by a user's /sleep: not scaled until then (monotonic seconds).
        self.held_until: dict[str, float] = {}
        self._loop: asyncio.Task[None] | None = None

    async def report(
        self,
        replica: str,
        ongoing: dict[str, int],
        counts: dict[str, int],
        seen: int,
        starting: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """One ingress replica's load; answers what is scaling now and the decisions
        after ``seen`` (for that replica's metrics)."""
        self.reports[replica] = (time.monotonic(), ongoing)
        self.counts.update(counts)
        self.starting.update(starting or {})
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(self._run())
        return {"scaling": dict(self.scaling), "decisions": self.decisions[seen:]}

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - one bad tick must not end the scaler
                logger.exception("autoscaler: tick failed")

    def tick(self, now: float) -> None:
        fresh = [o for t, o in self.reports.values() if now - t < STALE_S]
        for model, rule in self.rules.items():
            if model in self.scaling or model not in self.counts:
                continue
            if now < self.held_until.get(model, 0.0):
                continue
            ongoing = sum(o.get(model, 0) for o in fresh)
            current = 0 if model in self.asleep else self.counts[model]
            decision = rule.observe(now, ongoing, current, self.starting.get(model, 0))
            if decision is not None:
                self.scaling[model] = f"scaling {decision.current} -> {decision.target}"
                asyncio.get_running_loop().create_task(self._apply(decision))

    async def _apply(self, d: ScaleDecision) -> None:
        logger.info("autoscaler: %s %d -> %d slots: %s", d.model, d.current, d.target, d.reason)
        record = {"model": d.model, "from": d.current, "to": d.target, "reason": d.reason}
        try:
            state = await _slot(d.model, 0).state.remote()
            if state.get("state") != "awake" and state.get("slept_by") == "user":
                # a user put the model to sleep (a trainer's phase): theirs to wake
                record["outcome"] = "held"
                self.held_until[d.model] = time.monotonic() + HOLD_S
                return
            current = d.current
            if current == 0:  # scaled to zero: slot 0 wakes first
                await _slot(d.model, 0).wake_up.remote()
                self.asleep.discard(d.model)
                current = 1
            n = max(1, d.target)
            if n != current:
                await asyncio.to_thread(self._scale, d.model, n, asyncio.get_running_loop())
                self.counts[d.model] = n
            if d.target == 0:
                await _slot(d.model, 0).sleep.remote(1, "autoscaler")
                self.asleep.add(d.model)
            record["outcome"] = "applied"
        except Exception as exc:  # noqa: BLE001 - reported, and the rule starts afresh
            logger.warning("autoscaler: %s %d -> %d failed: %s", d.model, d.current, d.target, exc)
            record["outcome"], record["error"] = "failed", str(exc)
        finally:
            self.rules[d.model].reset()
            self.scaling.pop(d.model, None)
            self.decisions.append(record)

    def _scale(self, model: str, n: int, loop: asyncio.AbstractEventLoop) -> None:
        """``rmgate scale``'s steps (blocking: run in a thread); the check between them
        runs on the actor's event loop (Serve handles are called from there)."""
        from gateway.serve.admin import ControllerAdmin

        def between(before: int, after: int) -> None:
            asyncio.run_coroutine_threadsafe(self._between(model, before, after), loop).result()

        ControllerAdmin().scale(
            model,
            n,
            self.timeout_s,
            log=lambda line: logger.info("autoscaler: %s", line),
            between=between,
        )

    async def _between(self, model: str, before: int, after: int) -> None:
        """Up: every new slot in slot 0's numerics class, else roll back. Down: the removed
        slots drained (no request cut off)."""
        if after > before:
            want = await _slot(model, 0).endpoint.remote()
            want_class = (want.get("numerics") or {}).get("class_id")
            for i in range(before, after):
                got = await _slot(model, i).endpoint.remote()
                got_class = (got.get("numerics") or {}).get("class_id")
                if want_class is None or got_class != want_class:
                    raise RuntimeError(
                        f"new slot {model}-{i} answered its probes in numerics class "
                        f"{got_class}, not slot 0's {want_class}: not routed to"
                    )
        else:
            for i in range(after, before):
                await _slot(model, i).sleep.remote(0, "autoscaler")


class AutoscaleFeed:
    """An ingress replica's side: report its load, mirror what scales, count decisions."""

    def __init__(
        self, gateway_name: str, specs: Mapping[str, AutoscalingSpec], timeout_s: float
    ) -> None:
        self.name = f"{ACTOR_NAME}-{gateway_name}"
        self.specs = {m: s.model_dump() for m, s in specs.items()}
        self.timeout_s = timeout_s
        self.replica = f"{os.getpid()}-{id(self)}"
        self.seen = 0
        self._actor: Any = None

    def _autoscaler(self) -> Any:
        if self._actor is None:
            self._actor = SlotAutoscaler.options(  # type: ignore[attr-defined]
                name=self.name, get_if_exists=True
            ).remote(self.specs, self.timeout_s)
        return self._actor

    async def run(
        self,
        ongoing: Mapping[str, int],
        counts: Callable[[], dict[str, int]],
        status: dict[str, dict[str, Any]],
        starting: Callable[[dict[str, int]], dict[str, int]],
    ) -> None:
        """Forever: every ``TICK_S`` report ``ongoing``, ``counts()`` and ``starting`` of
        them; keep in ``status`` per model what is scaling now and the last decisions
        (``/v1/models`` shows both)."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                now = counts()
                answer = await self._autoscaler().report.remote(
                    self.replica, dict(ongoing), now, self.seen, starting(now)
                )
            except Exception as exc:  # noqa: BLE001 - its owner went: make a new one
                logger.warning("autoscaler unreachable (%s); starting another", exc)
                self._actor = None
                continue
            for model in self.specs:
                entry = status.setdefault(model, {"scaling": None, "decisions": []})
                entry["scaling"] = answer["scaling"].get(model)
            for record in answer["decisions"]:
                self.seen += 1
                entry = status.setdefault(record["model"], {"scaling": None, "decisions": []})
                entry["decisions"] = [*entry["decisions"], record][-RECENT:]
                direction = "up" if record["to"] > record["from"] else "down"
                metrics.AUTOSCALE_DECISIONS.labels(
                    record["model"], direction, record.get("outcome", "failed")
                ).inc()
