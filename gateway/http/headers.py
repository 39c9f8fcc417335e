"""The one place a request's typed outcome becomes ``x-rmgate-*`` headers.

``x-rmgate-model``, ``x-rmgate-key`` (crc32 of the canonical body, hex), ``x-rmgate-slot``
(the answering slot, one per item for list inputs), ``x-rmgate-seed`` (GRM),
``x-rmgate-fingerprint`` (what the answering replicas' bits depend on) and
``x-rmgate-failover: <from>-><to>`` when a slot of another class answered (``next_slot``),
``x-rmgate-class`` (the answering slots' numerics classes) and ``x-rmgate-placement:
<own>-><slot>:<reason>`` when a class mate answered (reason ``load``, ``drained`` or
``unavailable``; same bits by the class invariant), ``x-rmgate-max-tokens-clamped:
max_tokens=<asked>-><sent>`` when a request asked for more tokens than the context holds,
``x-rmgate-receipt`` (each item's reward identity in the ledger, hex; ``GET
/v1/ledger/{receipt}`` returns its row) and ``x-rmgate-cache: hit|shared|miss``.
"""

from __future__ import annotations

from gateway.core.api.results import GatewayResult

TIMEOUT_HEADER = "x-rmgate-timeout"
#: Sent by a client: what the request does if its model sleeps (wake, wait, refuse).
ON_SLEEP_HEADER = "x-rmgate-on-sleep"
ON_SLEEP_VALUES = frozenset({"wake", "wait", "refuse"})
#: Sent by a client: ``off`` asks for an engine's answer; answered: hit, shared or miss.
CACHE_HEADER = "x-rmgate-cache"
CACHE_OFF_VALUES = frozenset({"off", "no-cache", "bypass"})


def result_headers(result: GatewayResult) -> dict[str, str]:
    headers = {"x-rmgate-model": result.model} if result.model else {}
    if result.key is not None:
        headers["x-rmgate-key"] = result.key_hex or ""
    if result.routes:
        headers["x-rmgate-slot"] = ",".join(map(str, result.slots))
        if result.failovers:
            headers["x-rmgate-failover"] = ",".join(f"{a}->{b}" for a, b in result.failovers)
        if result.placements:
            headers["x-rmgate-placement"] = ",".join(
                f"{a}->{b}:{why}" for a, b, why in result.placements
            )
        if result.numerics_classes:
            headers["x-rmgate-class"] = ",".join(result.numerics_classes)
        if result.fingerprints:
            headers["x-rmgate-fingerprint"] = ",".join(result.fingerprints)
        if any(result.receipts):
            headers["x-rmgate-receipt"] = ",".join(result.receipts)
        if result.cache is not None:
            headers[CACHE_HEADER] = result.cache
    if result.seed is not None:
        headers["x-rmgate-seed"] = str(result.seed)
    if result.max_tokens_clamped is not None:
        name, asked, sent = result.max_tokens_clamped
        headers["x-rmgate-max-tokens-clamped"] = f"{name}={asked}->{sent}"
    headers.update(result.extra)
    return headers
