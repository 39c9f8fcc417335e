"""A slot's sleep and wake: the mechanism behind ``/sleep`` and ``/wake_up``.

Sleep: pause the engine's gate (new requests are answered "asleep"), wait until the
requests inside have finished, then free the engine's memory: vLLM's sleep mode where the
engine runs it (CUDA + ``sleep_mode``), else stop the engine process (the CPU build has no
sleep mode); level 0 only pauses. Wake: the reverse, then the slot answers its golden
probes again and serves only if it lands in the numerics class it slept in; otherwise it
is ``kept_out`` and says why (``/v1/models``), so a wake can never change a bit.

One transition at a time (a lock); the replica's health check passes while asleep, so
Ray Serve does not restart a slot that sleeps on purpose.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Protocol

from deployments.engine.sleep_control import EngineControl
from gateway.core.elastic.sleep import SleptBy, SlotState

logger = logging.getLogger("ray.serve")


class SleepingEngine(Protocol):
    """What the lifecycle needs of its slot replica."""

    name: str

    def control(self) -> EngineControl: ...

    def uses_sleep_mode(self) -> bool: ...

    def engine_group(self) -> int | None: ...

    def stop_engine(self) -> None: ...

    def start_engine(self) -> None: ...

    def reprobe(self) -> dict[str, Any]: ...

    def numerics_class(self) -> str | None: ...


def group_rss_bytes(pgid: int | None) -> int:
    """Resident memory of every process in the engine's process group (server, EngineCore,
    workers): what stopping the engine frees on a CPU host."""
    if pgid is None:
        return 0
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss pages
        except (OSError, ValueError, IndexError):
            continue
    return total


class SlotLifecycle:
    """The slot's state (``gateway.core.elastic.sleep.SlotState``) and its transitions."""

    def __init__(self, slot: SleepingEngine) -> None:
        self.slot = slot
        self.state: SlotState = "awake"
        self.slept_by: SleptBy | None = None
        self.level: int | None = None
        #: How the slot sleeps now: ``paused`` (level 0), ``vllm_sleep_mode`` or ``stopped``.
        self.how: str | None = None
        self.kept_out: str | None = None
        self.last: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    def report(self) -> dict[str, Any]:
        """The state as ``/v1/models`` and ``/is_sleeping`` show it."""
        return {
            "state": self.state,
            "is_sleeping": self.state in ("asleep", "sleeping"),
            "level": self.level,
            "slept_by": self.slept_by,
            "how": self.how,
            "kept_out": self.kept_out,
            "last": self.last,
        }

    async def sleep(self, level: int, by: SleptBy = "user") -> dict[str, Any]:
        async with self._lock:
            if self.state in ("asleep", "kept_out") and (self.state == "asleep" or level == 0):
                if by == "user":  # a user's sleep is theirs to end, whoever slept it first
                    self.slept_by = "user"
                return {**self.report(), "changed": False}
            start = time.monotonic()
            self.state = "sleeping"
            control = self.slot.control()
            rss_before = group_rss_bytes(self.slot.engine_group())
            try:
                await control.pause()
                drain_s, cut_off = await control.drain()
                if cut_off:
                    logger.warning(
                        "slot %s: %d requests still inside its engine after %.0fs; sleeping "
                        "anyway (the ingress sends them again)",
                        self.slot.name,
                        cut_off,
                        drain_s,
                    )
                if level == 0:
                    how = "paused"
                elif self.slot.uses_sleep_mode():
                    await control.sleep(level)
                    how = "vllm_sleep_mode"
                else:
                    await asyncio.to_thread(self.slot.stop_engine)
                    how = "stopped"
            except Exception:
                self.state = "awake"
                try:
                    await control.resume()
                except Exception:  # noqa: BLE001 - the original failure is the one to report
                    pass
                raise
            self.state, self.slept_by, self.level, self.how = "asleep", by, level, how
            self.kept_out = None
            self.last = {
                "op": "sleep",
                "level": level,
                "how": how,
                "slept_by": by,
                "drain_s": round(drain_s, 3),
                "seconds": round(time.monotonic() - start, 3),
                "engine_rss_before": rss_before,
                "engine_rss_after": group_rss_bytes(self.slot.engine_group()),
            }
            logger.info("slot %s: asleep %s", self.slot.name, self.last)
            return {**self.report(), "changed": True}

    async def wake_up(self) -> dict[str, Any]:
        async with self._lock:
            if self.state == "awake":
                return {**self.report(), "changed": False}
            start = time.monotonic()
            before = self.slot.numerics_class()
            how, self.state = self.how, "waking"
            try:
                if how == "vllm_sleep_mode":
                    await self.slot.control().wake_up()
                    if self.level == 2:  # level 2 dropped the weights: load them again
                        await self.slot.control().reload_weights()
                elif how == "stopped" or (how is None and self.kept_out):
                    await asyncio.to_thread(self.slot.start_engine)
                numerics = await asyncio.to_thread(self.slot.reprobe)
            except Exception as exc:
                self.state = "asleep"
                self.last = {"op": "wake", "error": f"{type(exc).__name__}: {exc}"}
                raise
            woke_s = time.monotonic() - start
            after = numerics.get("class_id")
            self.how = None
            self.last = {
                "op": "wake",
                "seconds": round(woke_s, 3),
                "how": how,
                "class_before": before,
                "class_after": after,
            }
            if after is None or after != before:
                self.state = "kept_out"
                self.kept_out = (
                    f"woke up in numerics class {after} "
                    f"({numerics.get('error') or 'other probe answers or identity'}), "
                    f"not {before}: kept out of traffic"
                )
                logger.warning("slot %s: %s", self.slot.name, self.kept_out)
                return {**self.report(), "changed": True}
            await self.slot.control().resume()
            self.state, self.slept_by, self.level, self.kept_out = "awake", None, None, None
            logger.info("slot %s: awake %s", self.slot.name, self.last)
            return {**self.report(), "changed": True}
