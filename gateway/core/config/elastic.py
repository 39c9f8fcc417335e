"""A model's elastic settings: how its slots sleep and wake, and how many it runs.

Sleep and wake follow vLLM's own endpoints (``/sleep?level=``, ``/wake_up``,
``/is_sleeping``); autoscaling follows Ray Serve's ``autoscaling_config`` names where they
mean the same thing (``min_replicas`` -> ``min_slots``, ``target_ongoing_requests`` ->
``target_ongoing_per_slot``, ``upscale_delay_s``, ``downscale_delay_s``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: What a request does when its slot sleeps: wake the slot and answer (the wait counts
#: against the request's deadline), wait for someone else to wake it, or be refused at once
#: (503 + ``Retry-After``).
OnSleep = Literal["wake", "wait", "refuse"]


class AutoscalingSpec(BaseModel):
    """Slots follow load inside the model's numerics class (``gateway.core.elastic.autoscale``)."""

    model_config = ConfigDict(extra="forbid")

    min_slots: int = Field(
        default=1,
        ge=0,
        description=(
            "Fewest slots. 0 scales to zero: after `downscale_delay_s` without load, slot 0 "
            "sleeps (its engine stopped, or asleep in vLLM's sleep mode) and the next request "
            "wakes it."
        ),
    )
    max_slots: int = Field(default=2, ge=1, description="Most slots.")
    target_ongoing_per_slot: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Requests in the gateway per slot the scaler aims for (in flight and waiting, over "
            "every ingress replica): it asks for ceil(ongoing / target) slots."
        ),
    )
    upscale_delay_s: float = Field(
        default=30.0,
        ge=0,
        description="How long more slots must be asked for before one is added (Serve's default).",
    )
    downscale_delay_s: float = Field(
        default=600.0,
        ge=0,
        description="How long fewer slots must be enough before one is removed (Serve's default).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_slots > self.max_slots:
            raise ValueError(
                f"autoscaling: min_slots ({self.min_slots}) exceeds max_slots ({self.max_slots})"
            )
        return self
