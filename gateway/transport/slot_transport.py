"""Reaching a slot's engine: the ``Transport`` the core posts through, over Ray Serve slots.

Composed of small parts, each with one job: the ``SlotDirectory`` (where each engine
listens), one ``SlotGate`` per slot (at most the slot mode's ``max_inflight`` in the engine,
a bounded waiting room), a ``RetryState`` per attempt (explicit outcomes, injected clock)
and one ``EngineClient`` per transport kind (HTTP/1.1 straight to the engine, or the slot
replica's handle). It walks the core's ``Placement`` in order and records what happened
in the metrics; it decides nothing about where a key may go.

A request never moves to another slot unless the placement lists one (``failover:
next_slot``): when a slot's engine is unreachable, the request waits (up to the slot's
budget) for Ray Serve to restart that replica, because another slot could answer with
other bits. The one exception is a slot that scaling removed: its requests are handed back
(``SlotRemoved``) to be placed again under the new count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from gateway.core.api.errors import (
    EngineFailed,
    ModelAsleep,
    SlotClassChanged,
    SlotRemoved,
    SlotUnavailable,
)
from gateway.core.api.results import EngineReply
from gateway.core.config.settings import GatewaySettings
from gateway.core.elastic.sleep import action_for, engine_is_asleep
from gateway.core.routing.class_queue import admit_in_class
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.engine_access import (
    EngineClient,
    EngineConnectionLost,
    EngineNoAnswer,
    EngineUnreachable,
    SlotAsleep,
    SlotInfo,
    SlotView,
)
from gateway.core.routing.gate import SlotGate
from gateway.core.routing.numerics import ModelClasses
from gateway.core.routing.placement import Placement
from gateway.core.routing.retry import Decision, RetryConfig, RetryState
from gateway.core.routing.slots import SlotTable
from gateway.observability import metrics, tracing
from gateway.transport.answer_times import AnswerTimes
from gateway.transport.directory import SlotDirectory
from gateway.transport.engine_client import HandleEngineClient, Http1EngineClient
from gateway.transport.queue_wait import timed_wait

logger = logging.getLogger("rmgate")


def engine_client_for(kind: str, handles: Mapping[str, Any]) -> EngineClient:
    """The engine client of a transport kind (``gateway.transport`` in the config)."""
    if kind == "handle":
        return HandleEngineClient(handles)
    return Http1EngineClient()


class SlotTransport:
    """``Transport`` over Ray Serve slot deployments (``handles[model][slot]``)."""

    def __init__(
        self,
        handles: Mapping[str, Any],
        settings: GatewaySettings,
        slots: SlotTable,
        queue_limits: Mapping[str, int] | None = None,
        *,
        engine_client: EngineClient | None = None,
        retry: RetryConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_sleep: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.slots = slots
        self.queue_limits = dict(queue_limits or {})
        self.directory = SlotDirectory(handles, slots)
        self.engine_client = engine_client or engine_client_for(settings.transport, handles)
        self.retry = retry or RetryConfig()
        self.clock = clock
        self.sleep = sleep
        self._gates: dict[tuple[str, int], SlotGate] = {}
        #: Round-trip times per slot, which bounded load weighs loads by.
        self._answer_times: dict[tuple[str, int], AnswerTimes] = {}
        self._discovering: set[tuple[str, int]] = set()
        self._logged_classes: dict[str, dict[str, list[int]]] = {}
        #: Each model's ``on_sleep`` (``gateway.core.elastic.sleep.action_for``).
        self.on_sleep = dict(on_sleep or {})
        #: One wake per slot at a time from this ingress, shared by the requests that wait.
        self._waking: dict[tuple[str, int], asyncio.Task[dict[str, Any]]] = {}
        #: Requests of each model in this ingress now (what the autoscaler weighs).
        self.ongoing: dict[str, int] = {}

    # ---- ops ----------------------------------------------------------------------------
    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None:
        return await self.directory.describe(model, slot, timeout_s)

    async def health(self, model: str, slot: int, timeout_s: float) -> str:
        return await self.directory.health(model, slot, timeout_s)

    async def aclose(self) -> None:
        await self.engine_client.aclose()

    def slot_load(self, model: str, slot: int) -> int:
        """Requests in a slot's gate now, in flight and queued (the auditor waits for 0)."""
        gate = self._gates.get((model, slot))
        return 0 if gate is None else gate.inflight + gate.waiting

    # ---- sleep and wake (deployments.slot.lifecycle) ------------------------------------
    async def slot_state(self, model: str, slot: int, timeout_s: float) -> dict[str, Any]:
        try:
            handle = self.directory.handles[model][slot]
            report = await asyncio.wait_for(handle.state.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - dead, restarting or starting
            return {"slot": slot, "state": "unavailable"}
        metrics.record_transition(model, slot, report)
        return report

    async def sleep_slot(self, model: str, slot: int, level: int, by: str) -> dict[str, Any]:
        self.directory.forget(model, slot)
        report = await self.directory.handles[model][slot].sleep.remote(level, by)
        self.directory.forget(model, slot)
        metrics.record_transition(model, slot, report)
        return report

    async def wake_slot(self, model: str, slot: int, timeout_s: float) -> dict[str, Any]:
        key = (model, slot)
        task = self._waking.get(key)
        if task is None or task.done():
            task = self._waking[key] = asyncio.get_running_loop().create_task(
                self._wake_once(model, slot)
            )
        # shielded: a waiter whose deadline passes leaves; the wake goes on for the others
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)

    async def _wake_once(self, model: str, slot: int) -> dict[str, Any]:
        report = await self.directory.handles[model][slot].wake_up.remote()
        self.directory.forget(model, slot)
        metrics.record_transition(model, slot, report)
        return report

    async def _while_asleep(self, asleep: SlotAsleep, deadline: Deadline) -> None:
        """A request's slot is not awake: wake it, wait for it, or refuse (``on_sleep``).
        Returns when the request should look at its slot again."""
        model, slot, report = asleep.model, asleep.slot, asleep.report
        if asleep.state == "kept_out":
            raise SlotUnavailable(f"slot {model}-{slot}: {report.get('kept_out')}")
        action = action_for(
            deadline.on_sleep or self.on_sleep.get(model, "wake"),  # type: ignore[arg-type]
            report.get("slept_by") or "user",
        )
        if action == "refuse":
            raise ModelAsleep(
                f"model {model} is asleep (slot {slot}); POST /wake_up wakes it",
            )
        if action == "wait":
            await self.sleep(min(4 * self.retry.backoff_s, deadline.remaining()))
            return
        left = deadline.left_or_raise(f"waiting for slot {model}-{slot} to wake")
        try:
            woke = await self.wake_slot(model, slot, left)
        except TimeoutError:
            raise deadline.exceeded(f"waiting for slot {model}-{slot} to wake") from None
        except Exception as exc:  # noqa: BLE001 - the replica's error, reported
            raise SlotUnavailable(f"slot {model}-{slot} did not wake: {exc}") from exc
        if woke.get("state") == "kept_out":
            raise SlotUnavailable(f"slot {model}-{slot}: {woke.get('kept_out')}")

    def slot_view(self, model: str, slots: int) -> SlotView:
        """The classes (as last reported) and load of ``model``'s slots. A slot whose class
        is not known yet is asked in the background; until then its keys stay on it."""
        classes: list[str | None] = []
        load: dict[int, int] = {}
        for slot in range(slots):
            if (model, slot) not in self.directory.classes:
                self._discover(model, slot)
            classes.append(self.directory.known_class(model, slot))
            gate = self._gates.get((model, slot))
            load[slot] = gate.inflight + gate.waiting if gate is not None else 0
        view = SlotView(
            ModelClasses(tuple(classes), self.settings.class_policy),
            load,
            self._service_s(model, range(slots)),
        )
        groups = view.classes.groups
        if len(groups) > 1 and self._logged_classes.get(model) != groups:
            self._logged_classes[model] = groups
            logger.warning(
                "model %s: its slots fall into %d numerics classes %s; each key "
                "stays in its own slot's class (class_policy %s%s)",
                model,
                len(groups),
                groups,
                self.settings.class_policy,
                f": slots outside {view.classes.majority} are drained"
                if self.settings.class_policy == "strict"
                else "",
            )
        return view

    def _service_s(self, model: str, slots: Iterable[int]) -> dict[int, float]:
        """Each slot's seconds per answer, where placement weighs loads by it
        (``load_weight: answer_time``); empty otherwise (every request counts as one)."""
        if self.settings.experimental.load_weight != "answer_time":
            return {}
        return {
            s: times.seconds()
            for s in slots
            if (times := self._answer_times.get((model, s))) is not None
        }

    def undescribed(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Per model, how many of its ``counts`` slots this replica has not described yet
        (starting: nothing known of them); each is asked in the background, as in
        ``slot_view``. The autoscaler never scales down a model with such slots."""
        out: dict[str, int] = {}
        for model, n in counts.items():
            unknown = [s for s in range(n) if (model, s) not in self.directory.classes]
            for slot in unknown:
                self._discover(model, slot)
            out[model] = len(unknown)
        return out

    def _discover(self, model: str, slot: int) -> None:
        key = (model, slot)
        if key in self._discovering:
            return
        self._discovering.add(key)

        async def ask() -> None:
            try:
                await self.directory.describe(model, slot, self.settings.slot_wait_s)
            finally:
                self._discovering.discard(key)

        try:
            asyncio.get_running_loop().create_task(ask())
        except RuntimeError:  # no loop (a sync caller): asked on the first request instead
            self._discovering.discard(key)

    # ---- requests -----------------------------------------------------------------------
    def gate(self, info: SlotInfo) -> SlotGate:
        """The slot's gate, sized to the mode the slot reports now."""
        key = (info.model, info.slot)
        gate = self._gates.get(key)
        if gate is None:
            labels = (info.model, str(info.slot))
            limit = self.queue_limits.get(info.model, self.settings.max_queue_per_slot)
            gate = self._gates[key] = SlotGate(
                info.max_inflight,
                limit,
                queued=metrics.QUEUED.labels(*labels),
                inflight=metrics.INFLIGHT.labels(*labels),
            )
        elif gate.capacity != info.max_inflight:
            logger.info(
                "slot %s-%d now runs %s: gate %d -> %d",
                info.model,
                info.slot,
                info.mode,
                gate.capacity,
                info.max_inflight,
            )
            gate.resize(info.max_inflight)
        return gate

    async def post(
        self, model: str, placement: Placement, path: str, body: bytes, deadline: Deadline
    ) -> EngineReply:
        """Answer on the placement's slots in order: each keeps the request for its wait
        budget while unreachable, then the next takes it; the last one's 503 is final.
        Every wait (gate, class queue, engine, backoff, candidate) ends at ``deadline``:
        ``DeadlineExceeded`` (504) then."""
        self.ongoing[model] = self.ongoing.get(model, 0) + 1
        try:
            return await self._post(model, placement, path, body, deadline)
        finally:
            self.ongoing[model] -= 1

    async def _post(
        self, model: str, placement: Placement, path: str, body: bytes, deadline: Deadline
    ) -> EngineReply:
        candidates = placement.candidates
        admitted: SlotGate | None = None
        if (
            placement.within_class
            and len(candidates) > 1
            and self.settings.experimental.class_queue
        ):
            members = self._class_mates(model, placement)
            weighed = self.settings.experimental.load_weight == "answer_time"
            # fewer than two mates: no class wait (the slot's own gate times the request)
            timer = (
                timed_wait(model, placement.numerics_class, self.clock)
                if len(members) > 1
                else contextlib.nullcontext()
            )
            with timer:
                admitting = admit_in_class(
                    placement,
                    members,
                    deadline,
                    self._service_s(model, [s for s, _ in members]) if weighed else None,
                    model,
                )
                admitted, candidates = await (
                    admitting
                    if not tracing.ENABLED or len(members) < 2
                    else tracing.queued(
                        admitting,
                        model,
                        None,
                        {"mates": len(members)},
                        lambda admission: admission[1][0][0],  # the first candidate now
                    )
                )
        # placed on another mate by the class queue: for load (its own slot: drained, if so)
        reason = (
            None
            if candidates[0][0] == placement.first
            else ("drained" if placement.reason == "drained" else "load")
        )
        for n, (slot, wait_s) in enumerate(candidates):
            first, admitted = admitted, None  # the class queue's place: the first attempt's
            try:
                reply = await self._post_slot(
                    model,
                    slot,
                    path,
                    body,
                    wait_s,
                    deadline,
                    placement.numerics_class if placement.within_class else None,
                    admitted=first,
                    last=n == len(candidates) - 1,
                )
            except SlotRemoved:
                raise
            except SlotUnavailable:
                if n == len(candidates) - 1:
                    raise
                continue
            except EngineFailed as exc:
                # An engine that keeps answering 5xx is as gone as an unreachable one (one
                # shutting down with its node answers "cannot schedule new futures after
                # shutdown"): a class mate gives the same bits, so it takes the request.
                # Outside a class the 502 stands: another slot could change the answer.
                if not placement.within_class or n == len(candidates) - 1:
                    raise
                logger.warning("%s; a class mate takes the request", exc)
                continue
            if slot != placement.home and not placement.within_class:
                metrics.FAILOVERS.labels(model, str(placement.home), str(slot)).inc()
            return dataclasses.replace(reply, reason=reason) if n == 0 and reason else reply
        raise AssertionError("a placement has at least one candidate")  # pragma: no cover

    def _class_mates(self, model: str, placement: Placement) -> list[tuple[int, SlotGate]]:
        """The placement's class mates that can wait for a place now: reachable as far as
        the transport knows (their engine's address is cached) and still of the
        placement's class; the others are left to the walk."""
        members: list[tuple[int, SlotGate]] = []
        for slot, _ in placement.candidates:
            info = self.directory.cached(model, slot)
            if (
                info is not None
                and self.directory.known_class(model, slot) == placement.numerics_class
            ):
                members.append((slot, self.gate(info)))
        return members

    async def _post_slot(
        self,
        model: str,
        slot: int,
        path: str,
        body: bytes,
        wait_s: float,
        deadline: Deadline,
        expected_class: str | None = None,
        *,
        admitted: SlotGate | None = None,
        last: bool = True,
    ) -> EngineReply:
        """``admitted``: a place in this slot's gate already taken (the class queue), used
        by the first attempt (released whatever happens); later attempts queue anew. A
        slot found asleep passes the request to the next candidate (a class mate: same
        bits) unless it is the ``last``, which applies the model's ``on_sleep``."""
        state = RetryState(self.retry, wait_s, self.clock)
        labels = (model, str(slot))
        while True:
            held, admitted = admitted, None  # a place taken for this attempt only
            try:
                if self.slots.removed(model, slot):
                    raise SlotRemoved(f"slot {model}-{slot} was scaled away")
                left = deadline.left_or_raise(f"waiting for slot {model}-{slot}")
                if state.remaining() <= 0 and self.directory.cached(model, slot) is None:
                    self._discover(model, slot)  # skipped now (a class mate answers), asked anew
                info = await self.directory.lookup(model, slot, min(state.remaining(), left))
                if (
                    expected_class is not None
                    and self.directory.known_class(model, slot) != expected_class
                ):
                    # Placed while the slot was a class mate; it is not one now.
                    raise SlotClassChanged(
                        f"slot {model}-{slot} is now of class "
                        f"{self.directory.known_class(model, slot)}, not {expected_class}"
                    )
                times = self._answer_times.get((model, slot))
                if times is None:
                    times = self._answer_times[(model, slot)] = AnswerTimes(
                        self.clock, gauge=metrics.ANSWER_SECONDS.labels(*labels)
                    )
                gate = self.gate(info)  # the one gate of (model, slot): ``held`` if any
                place = held if held is not None else gate
                if held is None:
                    left = deadline.left_or_raise(f"slot {model}-{slot}'s gate")
                    try:
                        with timed_wait(model, self.directory.known_class(model, slot), self.clock):
                            waiting = gate.acquire(left)
                            await (
                                waiting
                                if not tracing.ENABLED
                                else tracing.queued(
                                    waiting,
                                    model,
                                    slot,
                                    {"inflight": gate.inflight, "queued": gate.queued},
                                )
                            )
                    except TimeoutError:
                        raise deadline.exceeded(
                            f"waiting at slot {model}-{slot}'s gate ({gate.inflight} in its engine)"
                        ) from None
                held = None
                try:
                    status, content = await self._call_engine(
                        info,
                        path,
                        body,
                        deadline,
                        times,
                        gate.inflight if info.mode == "serialize" else 1,
                        labels,
                    )
                finally:
                    place.release()
            except EngineNoAnswer:
                raise deadline.exceeded(f"slot {model}-{slot}'s engine had not answered") from None
            except SlotAsleep as asleep:
                if not last:
                    raise SlotUnavailable(f"slot {model}-{slot} is {asleep.state}") from None
                await self._while_asleep(asleep, deadline)
                continue
            except (EngineUnreachable, EngineConnectionLost) as exc:
                logger.warning("slot %s-%d unreachable (%s); waiting for it", model, slot, exc)
                decision = state.record_unreachable()
                metrics.SLOT_UNAVAILABLE.labels(*labels).inc()
                last_error = str(exc)
            else:
                if engine_is_asleep(status, content):  # went to sleep since we looked
                    self.directory.forget(model, slot)
                    await self.sleep(min(self.retry.backoff_s, deadline.remaining()))
                    continue
                decision = state.record_reply(status)
                if decision is Decision.RETURN:
                    return EngineReply(status, content, info.fingerprint, slot, info.numerics_class)
                logger.warning("slot %s-%d answered %d; retrying", model, slot, status)
                last_error = f"{status}: {content[:500]!r}"
            finally:
                if held is not None:  # the attempt ended before its engine call
                    held.release()
            self.directory.forget(model, slot)
            if decision is Decision.ENGINE_FAILED:
                raise EngineFailed(f"engine of slot {model}-{slot} failed ({last_error})")
            if decision is Decision.GIVE_UP:
                raise SlotUnavailable(
                    f"slot {model}-{slot} is unavailable; it did not come back within {wait_s:.0f}s"
                )
            await self.sleep(min(self.retry.backoff_s, deadline.remaining()))

    async def _call_engine(
        self,
        info: SlotInfo,
        path: str,
        body: bytes,
        deadline: Deadline,
        times: AnswerTimes,
        ahead: int,
        labels: tuple[str, str],
    ) -> tuple[int, bytes]:
        """One engine call within what is left of the deadline, timed and counted. A call
        abandoned before its answer (the deadline passed, a sibling item failed, the client
        went away) closes its connection, which makes vLLM abort the request: counted in
        ``rmgate_engine_requests_aborted_total``."""
        start = self.clock()
        # a serialized engine answers the ones in it one after another
        token = times.started(ahead)
        answered = False
        try:
            call = self.engine_client.post(
                info,
                path,
                body,
                deadline.left_or_raise(f"calling slot {info.model}-{info.slot}'s engine"),
            )
            status, content = await (
                call if not tracing.ENABLED else tracing.engine_call(call, info, path)
            )
            answered = status < 500
        except EngineNoAnswer:
            metrics.ENGINE_ABORTED.labels(*labels, "deadline").inc()
            raise
        except asyncio.CancelledError:
            metrics.ENGINE_ABORTED.labels(*labels, "cancelled").inc()
            raise
        finally:
            times.finished(token, answered)
        metrics.ENGINE_SECONDS.labels(*labels).observe(self.clock() - start)
        metrics.ENGINE_REQUESTS.labels(*labels, str(status)).inc()
        return status, content
