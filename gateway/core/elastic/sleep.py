"""Sleep and wake, as policy: a slot's states, what a request does when its slot sleeps,
and how an engine says it is asleep.

A slot sleeps in one of two ways (``deployments.slot.lifecycle``): vLLM's sleep mode frees
the engine's GPU memory in place, or the engine process stops (engines without sleep mode:
the CPU build). Either way the engine's gate (``deployments.engine.sleep_gate``) first
refuses new requests with ``ASLEEP_CODE`` and lets the ones inside finish, so no request is
cut off by a sleep; the transport reads that refusal and applies ``action_for``.
"""

from __future__ import annotations

from typing import Literal

from gateway.core.config.elastic import OnSleep

#: ``awake`` serves; ``sleeping``/``waking`` are on their way; ``asleep`` holds no engine
#: memory; ``kept_out`` woke up with other numerics than it slept with (it does not serve).
SlotState = Literal["awake", "sleeping", "asleep", "waking", "kept_out"]
#: Who put a slot to sleep: a user (``/sleep``: the model's ``on_sleep`` applies) or the
#: autoscaler (scaled to zero: the next request always wakes it).
SleptBy = Literal["user", "autoscaler"]
#: The error code a paused engine answers with (503), read by the transport.
ASLEEP_CODE = "rmgate_slot_asleep"
#: vLLM's sleep levels: 0 pauses (nothing freed), 1 offloads weights to host memory and
#: drops the KV cache, 2 drops both.
SLEEP_LEVELS = (0, 1, 2)


def engine_is_asleep(status: int, content: bytes) -> bool:
    """Whether an engine's answer is its gate's "asleep" refusal (not an engine failure)."""
    return status == 503 and ASLEEP_CODE.encode() in content[:256]


def action_for(on_sleep: OnSleep, slept_by: SleptBy) -> OnSleep:
    """What a request does on finding its slot asleep: the model's ``on_sleep``, except that
    a slot the autoscaler put to sleep (scale to zero) is always woken."""
    return "wake" if slept_by == "autoscaler" else on_sleep


def model_state(states: list[str]) -> str:
    """One word for a model's slots in ``/v1/models``: ``awake`` or ``asleep`` when all
    agree, else the first transitional state found, else ``mixed``."""
    kinds = set(states)
    if len(kinds) == 1:
        return states[0]
    for state in ("waking", "sleeping", "kept_out"):
        if state in kinds:
            return state
    return "mixed" if kinds else "starting"
