"""Where each slot's engine listens: asked of the slot replica once, cached until it fails.

The ingress asks a slot replica (one Serve handle call, ``SlotReplica.endpoint``) for its
engine's URL, fingerprint, mode and ``max_inflight``, then talks to the engine directly.
A failed call forgets the entry, so a restarted replica (new engine, new port, maybe a new
mode after a self-test fallback) is asked again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.core.routing.engine_access import EngineUnreachable, SlotAsleep, SlotInfo
from gateway.core.routing.slots import SlotTable
from gateway.observability import metrics


class SlotDirectory:
    """``SlotInfo`` per (model, slot) over ``handles[model][slot]``."""

    def __init__(self, handles: Mapping[str, Any], slots: SlotTable) -> None:
        self.handles = handles
        self.slots = slots
        self._info: dict[tuple[str, int], SlotInfo] = {}
        #: The numerics class each slot last reported. Kept when the slot fails (a dead
        #: slot's keys then go to its class mates) and replaced when it reports again.
        self.classes: dict[tuple[str, int], str | None] = {}
        #: Canary verdicts (a drift class) per slot, with the engine they were made about:
        #: kept when the slot's info is asked again from the same engine, dropped when the
        #: slot comes back with another engine (a restart is judged afresh).
        self._verdicts: dict[tuple[str, int], tuple[Any, str | None]] = {}

    def cached(self, model: str, slot: int) -> SlotInfo | None:
        if self.slots.removed(model, slot):
            self._info.pop((model, slot), None)
            metrics.forget_slot_up(model, slot)
            return None
        return self._info.get((model, slot))

    def forget(self, model: str, slot: int) -> None:
        self._info.pop((model, slot), None)

    async def lookup(self, model: str, slot: int, timeout_s: float) -> SlotInfo:
        """The slot's info (cached, else asked within ``timeout_s``); ``EngineUnreachable``
        when the replica does not answer (dead, restarting, still starting), ``SlotAsleep``
        when it answers that it is not awake (never cached)."""
        info = self.cached(model, slot)
        if info is not None:
            return info
        if timeout_s <= 0:
            raise EngineUnreachable(f"slot {model}-{slot}: no time left to ask its replica")
        try:
            raw = await asyncio.wait_for(self.handles[model][slot].endpoint.remote(), timeout_s)
        except Exception as exc:  # noqa: BLE001 - Ray's actor/handle errors, timeouts
            metrics.SLOT_UP.labels(model, str(slot)).set(0)
            raise EngineUnreachable(
                f"slot {model}-{slot}: its replica did not answer ({type(exc).__name__}: {exc})"
            ) from exc
        up = metrics.SLOT_UP.labels(model, str(slot))
        up.set(0 if raw.get("state") == "kept_out" else 1)  # asleep: woken on demand
        if raw.get("state", "awake") != "awake":
            if raw.get("numerics"):  # its class stays known: its keys' mates are found
                self.classes.setdefault((model, slot), (raw["numerics"] or {}).get("class_id"))
            raise SlotAsleep(model, slot, raw.get("sleep") or {"state": raw["state"]})
        info = self._info[(model, slot)] = SlotInfo.from_endpoint(model, slot, raw)
        verdict = self._verdicts.get((model, slot))
        if verdict is not None and verdict[0] == engine_of(info):
            self.classes[(model, slot)] = verdict[1]
        else:
            self._verdicts.pop((model, slot), None)
            self.classes[(model, slot)] = info.numerics_class
        return info

    def known_class(self, model: str, slot: int) -> str | None:
        return self.classes.get((model, slot))

    def set_class(self, model: str, slot: int, numerics_class: str | None) -> None:
        """The canary's verdict: a drifted slot gets a class of its own until it matches.
        The verdict holds for the engine it was made about (see ``lookup``)."""
        self.classes[(model, slot)] = numerics_class
        info = self._info.get((model, slot))
        if info is not None:
            self._verdicts[(model, slot)] = (engine_of(info), numerics_class)

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None:
        try:
            return await self.lookup(model, slot, timeout_s)
        except (EngineUnreachable, SlotAsleep):  # not serving now: its state says why
            return None

    async def health(self, model: str, slot: int, timeout_s: float) -> str:
        """``healthy`` when the slot replica's own health check (its engine's /health)
        passes within ``timeout_s``, else ``unavailable`` (dead, restarting or starting)."""
        try:
            await asyncio.wait_for(self.handles[model][slot].check_health.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - any failure means not serving now
            return "unavailable"
        return "healthy"


def engine_of(info: SlotInfo) -> Any:
    """Which engine process a slot's info describes (a restart gives another one)."""
    return (info.raw.get("engine_pid"), info.url)
