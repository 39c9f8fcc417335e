"""Sleep and wake of whole models, as ``/sleep``, ``/wake_up`` and ``/is_sleeping`` ask.

vLLM's endpoints act on one engine; a model here is several slots, so each call acts on
every slot of the named model (or of every model), all at once, and answers vLLM's shape
(``{"status": "sleeping", "level": 1}``, ``{"status": "awake"}``, ``{"is_sleeping": true}``)
plus, per model, each slot's report: its state and how long the transition took.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.core.api.errors import InvalidRequest, RmgateError
from gateway.core.config.settings import ModelSpec
from gateway.core.elastic.sleep import SLEEP_LEVELS, SleptBy, model_state
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.router import Router


class SleepFailed(RmgateError):
    """A slot could not sleep or wake (its replica's error is in the message)."""

    status, code = 502, "sleep_failed"


class ElasticControl:
    """Sleep, wake and state of the router's models, through its transport."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def models(self, name: str | None) -> list[ModelSpec]:
        """The named model (by name or alias), or every model when ``name`` is None."""
        if name is None:
            return list(self.router.config.models)
        return [self.router.resolve_model(name, None)]

    async def _each_slot(self, specs: list[ModelSpec], call: Any) -> dict[str, list[Any]]:
        names = [(s.name, slot) for s in specs for slot in range(self.router.slots.count(s.name))]
        results = await asyncio.gather(*(call(m, i) for m, i in names), return_exceptions=True)
        out: dict[str, list[Any]] = {s.name: [] for s in specs}
        failed = []
        for (model, slot), result in zip(names, results):
            if isinstance(result, BaseException):
                if isinstance(result, RmgateError):
                    raise result
                failed.append(f"{model}-{slot}: {type(result).__name__}: {result}")
                result = {"slot": slot, "state": "error", "error": str(result)}
            out[model].append(result)
        if failed:
            raise SleepFailed("; ".join(failed))
        return out

    @staticmethod
    def _summary(reports: dict[str, list[Any]]) -> dict[str, Any]:
        return {
            model: {"state": model_state([r.get("state", "?") for r in slots]), "slots": slots}
            for model, slots in reports.items()
        }

    async def sleep(
        self, model: str | None, level: int = 1, by: SleptBy = "user"
    ) -> dict[str, Any]:
        """vLLM's ``POST /sleep?level=``, for every slot of ``model`` (or of every model)."""
        if level not in SLEEP_LEVELS:
            raise InvalidRequest(f"level must be one of {SLEEP_LEVELS}", param="level")
        transport = self.router.transport
        reports = await self._each_slot(
            self.models(model), lambda m, i: transport.sleep_slot(m, i, level, by)
        )
        return {"status": "sleeping", "level": level, "models": self._summary(reports)}

    async def wake_up(self, model: str | None, deadline: Deadline) -> dict[str, Any]:
        """vLLM's ``POST /wake_up``: every slot woken and its numerics re-proved; a slot
        that came back in another class is ``kept_out`` (and the status says so)."""
        transport = self.router.transport

        async def wake(m: str, i: int) -> dict[str, Any]:
            left = deadline.left_or_raise(f"waking slot {m}-{i}")
            try:
                return await transport.wake_slot(m, i, left)
            except TimeoutError:
                raise deadline.exceeded(f"waking slot {m}-{i}") from None

        reports = await self._each_slot(self.models(model), wake)
        summary = self._summary(reports)
        states = {s.get("state") for m in reports.values() for s in m}
        status = (
            "awake" if states <= {"awake"} else ("kept_out" if "kept_out" in states else "sleeping")
        )
        return {"status": status, "models": summary}

    async def is_sleeping(self, model: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
        """vLLM's ``GET /is_sleeping``: true when every slot asked sleeps."""
        transport = self.router.transport
        reports = await self._each_slot(
            self.models(model), lambda m, i: transport.slot_state(m, i, timeout_s)
        )
        every = [s for m in reports.values() for s in m]
        return {
            "is_sleeping": bool(every) and all(s.get("is_sleeping") for s in every),
            "models": self._summary(reports),
        }
