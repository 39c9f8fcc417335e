"""The continuous audit's settings: how much of the record is re-answered, how fast.

The ledger holds, for every reward, the request and the bits it was answered with. The
auditor (``gateway.serve.auditor``) re-answers a sample of those rows on another slot of the
same numerics class, with the cache off, and compares the bits: the promise "same request,
same bits" checked while the gateway serves, not only when someone runs ``rmgate check``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: What the auditor does with a slot the evidence names (see ``gateway.core.audit.policy``):
#: drain it out of its class (and stop cache hits of what it recorded there), or only
#: report it (metrics, log line, ``GET /v1/audit``).
OnMismatch = Literal["drain", "report"]


class AuditSettings(BaseModel):
    """``gateway.audit``: off while ``sample`` is 0."""

    model_config = ConfigDict(extra="forbid")

    sample: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "Share of freshly recorded rewards the auditor re-answers on a class mate (chosen "
            "by the receipt's hash: the same rows on every run). 0 turns the audit off; it "
            "needs the ledger (`gateway.ledger.backend`) with `keep_bodies: true`."
        ),
    )
    max_per_minute: int = Field(
        default=60,
        ge=1,
        description="At most this many re-answers a minute per ingress replica.",
    )
    queue: int = Field(
        default=1000,
        ge=1,
        description=(
            "Sampled rows waiting for an idle class mate; past it the oldest is skipped "
            '(`rmgate_audit_skipped_total{reason="queue_full"}`).'
        ),
    )
    idle_only: bool = Field(
        default=True,
        description=(
            "Send a re-answer only to a slot with nothing in flight and nothing queued, so a "
            "trainer's request never waits behind more than one audit request."
        ),
    )
    on_mismatch: OnMismatch = Field(
        default="drain",
        description=(
            "`drain`: a slot the evidence names (it does not reproduce its own answer, or a "
            "majority of its class answers otherwise) leaves its class until its engine "
            "restarts, and the ledger stops answering what it recorded there. `report`: "
            "metrics, log and `GET /v1/audit` only."
        ),
    )
    clear_after: int = Field(
        default=100,
        ge=1,
        description="A suspect class is cleared after this many identical re-answers in a row.",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="Deadline of one re-answer (the engine call)."
    )
