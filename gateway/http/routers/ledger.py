"""``GET /v1/ledger/{receipt}``: the recorded row of a reward (auth as the other routes).

A trainer keeps the receipts (``x-rmgate-receipt``, ``/v1/rewards`` details) next to its
samples and can audit any reward later: what was asked (the canonical engine body, when
the ledger keeps bodies), what was answered, by which slot, fingerprint and seed, when.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.core.api.errors import InvalidRequest, LedgerOff, ReceiptNotFound
from gateway.http.auth import auth_dependencies
from gateway.http.errors import ERROR_RESPONSES

RECEIPT = re.compile(r"^[0-9a-f]{64}$")


def router(auth: bool = True) -> APIRouter:
    r = APIRouter(dependencies=auth_dependencies(auth), responses=ERROR_RESPONSES, tags=["ledger"])

    @r.get("/v1/ledger/{receipt}")
    async def ledger_row(receipt: str, request: Request) -> JSONResponse:
        """The ledger's row of one receipt: model, numerics class, endpoint, body (or its
        digest), answer, score or text, slot, fingerprint, seed, latency, time."""
        ledger = getattr(request.app.state, "ledger", None)
        if ledger is None:
            raise LedgerOff("this gateway keeps no ledger (gateway.ledger.backend: off)")
        if not RECEIPT.match(receipt):
            raise InvalidRequest(
                "a receipt is 64 lowercase hex characters (the x-rmgate-receipt header)",
                param="receipt",
            )
        row = await ledger.row(receipt)
        if row is None:
            raise ReceiptNotFound(
                f"no reward recorded under {receipt} (recorded rows reach "
                "the store within the flush interval)",
                param="receipt",
            )
        return JSONResponse(row.as_dict())

    return r
