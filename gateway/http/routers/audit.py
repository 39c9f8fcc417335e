"""``GET /v1/audit``: what the continuous audit found (counts per class, suspect classes,
drained slots, the last mismatch); ``POST /v1/audit``: audit recorded rows now, as
``rmgate ledger audit`` does (an admin route: it can drain slots)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.core.api.errors import LedgerOff
from gateway.core.service import RewardService
from gateway.http.auth import admin_gateway, auth_dependencies
from gateway.http.errors import ERROR_RESPONSES

#: What ``GET /v1/audit`` answers where no auditor runs (a gateway without a ledger).
OFF: dict[str, Any] = {
    "enabled": False,
    "queued": 0,
    "engine_calls": {},
    "in_flight": 0,
    "classes": [],
    "drained": [],
    "last_mismatch": None,
}


class AuditNow(BaseModel):
    """``POST /v1/audit``'s body."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, description="Only this model's rows.")
    since: float | None = Field(default=None, description="Rows recorded at or after (Unix s).")
    sample: int = Field(default=100, ge=1, le=100_000, description="At most this many rows.")
    seed: int = Field(default=0, description="Which rows a sample draws (reproducible).")


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(responses=ERROR_RESPONSES, tags=["audit"])

    @r.get("/v1/audit", dependencies=auth_dependencies(auth))
    async def audit_report(request: Request) -> JSONResponse:
        """Re-answers by class and outcome, suspect classes, drained slots, last mismatch."""
        auditor = getattr(request.app.state, "auditor", None)
        return JSONResponse(OFF if auditor is None else auditor.report())

    @r.post("/v1/audit")
    async def audit_now(
        ask: AuditNow, request: Request, _: RewardService = Depends(admin_gateway)
    ) -> JSONResponse:
        """Audit up to ``sample`` recorded rows now (drawn reproducibly), acting on a
        mismatch as the continuous audit does."""
        auditor = getattr(request.app.state, "auditor", None)
        if auditor is None or auditor.ledger is None:
            raise LedgerOff("this gateway keeps no ledger (gateway.ledger.backend: off)")
        return JSONResponse(await auditor.audit_now(ask.model, ask.since, ask.sample, ask.seed))

    return r
