"""``rmgate top``'s reading of ``GET /metrics``: the few series it shows, and rates between
two scrapes.

Pure (no HTTP): the Prometheus text is parsed with prometheus_client's own parser, so a
name that changes in ``gateway/observability/metrics.py`` shows up here as a missing
column, never as a misread number. Counters are totals since the ingress replica started;
a rate needs two scrapes, and a total that went down (the replica restarted, or another
replica answered the scrape) is counted from zero, as Prometheus' ``rate()`` does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: Counter samples are named with their ``_total`` suffix in the text format.
REQUESTS = "rmgate_requests_total"
CACHE = "rmgate_cache_total"
INFLIGHT = "rmgate_slot_inflight"
QUEUED = "rmgate_slot_queued"
LEDGER_BUFFERED = "rmgate_ledger_buffered"
LEDGER_DROPPED = "rmgate_ledger_rows_dropped_total"
LEDGER_WRITTEN = "rmgate_ledger_rows_written_total"
#: Cache outcomes that spared an engine call (``shared``: an identical call in flight).
CACHE_SAVED = ("hit", "shared")
CACHE_OUTCOMES = ("hit", "shared", "miss")


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` answer, reduced to what ``rmgate top`` shows; ``at`` is a monotonic
    time (seconds) taken when it was fetched."""

    at: float
    requests: dict[str, float] = field(default_factory=dict)  # model -> answered
    errors: dict[str, float] = field(default_factory=dict)  # model -> answered with >= 500
    cache: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, outcome)
    inflight: dict[tuple[str, int], float] = field(default_factory=dict)  # (model, slot)
    queued: dict[tuple[str, int], float] = field(default_factory=dict)
    ledger_buffered: float | None = None
    ledger_dropped: float | None = None
    ledger_written: float | None = None


def _status_is_error(status: str) -> bool:
    return status.isdigit() and int(status) >= 500


def _slot(labels: dict[str, str]) -> tuple[str, int] | None:
    slot = labels.get("slot", "")
    return (labels.get("model", ""), int(slot)) if slot.isdigit() else None


def parse_scrape(text: str, at: float) -> Scrape:
    """The series ``rmgate top`` shows, from Prometheus text (raises ``ValueError`` on text
    that is not Prometheus', e.g. an HTML error page)."""
    requests: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = defaultdict(float)
    cache: dict[tuple[str, str], float] = defaultdict(float)
    inflight: dict[tuple[str, int], float] = {}
    queued: dict[tuple[str, int], float] = {}
    single: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == REQUESTS:
                model = s.labels.get("model", "")
                requests[model] += s.value
                if _status_is_error(s.labels.get("status", "")):
                    errors[model] += s.value
            elif s.name == CACHE:
                cache[(s.labels.get("model", ""), s.labels.get("outcome", ""))] += s.value
            elif s.name in (INFLIGHT, QUEUED) and (slot := _slot(s.labels)) is not None:
                (inflight if s.name == INFLIGHT else queued)[slot] = s.value
            elif s.name in (LEDGER_BUFFERED, LEDGER_DROPPED, LEDGER_WRITTEN):
                single[s.name] = s.value
    return Scrape(
        at=at,
        requests=dict(requests),
        errors=dict(errors),
        cache=dict(cache),
        inflight=inflight,
        queued=queued,
        ledger_buffered=single.get(LEDGER_BUFFERED),
        ledger_dropped=single.get(LEDGER_DROPPED),
        ledger_written=single.get(LEDGER_WRITTEN),
    )


@dataclass(frozen=True)
class Rates:
    """What happened between two scrapes, per second (``cache_hit``: the share of engine
    requests the ledger's cache spared, ``None`` where there were none)."""

    seconds: float
    requests: dict[str, float]
    errors: dict[str, float]
    cache_hit: dict[str, float | None]
    ledger_written: float | None


def _increase(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:  # new series, or a reset: count from zero
        return after
    return after - before


def _per_second(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    return {k: (_increase(before.get(k), v) or 0.0) / seconds for k, v in after.items()}


def cache_hit(cache: dict[tuple[str, str], float], model: str) -> float | None:
    """The share of ``model``'s engine requests answered without their own engine call."""
    total = sum(cache.get((model, o), 0.0) for o in CACHE_OUTCOMES)
    return sum(cache.get((model, o), 0.0) for o in CACHE_SAVED) / total if total else None


def rates(before: Scrape, after: Scrape) -> Rates | None:
    """Rates between two scrapes; ``None`` when no time passed between them."""
    seconds = after.at - before.at
    if seconds <= 0:
        return None
    delta = {k: _increase(before.cache.get(k), v) or 0.0 for k, v in after.cache.items()}
    written = _increase(before.ledger_written, after.ledger_written)
    return Rates(
        seconds=seconds,
        requests=_per_second(before.requests, after.requests, seconds),
        errors=_per_second(before.errors, after.errors, seconds),
        cache_hit={m: cache_hit(delta, m) for m, _ in after.cache},
        ledger_written=None if written is None else written / seconds,
    )
