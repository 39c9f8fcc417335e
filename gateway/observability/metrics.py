"""Prometheus metrics of the ingress (served at ``GET /metrics``).

One registry per ingress replica process (Ray Serve runs each replica in its own process),
so nothing here is shared across replicas: scrape every ingress replica, or run one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

if TYPE_CHECKING:
    from gateway.core.api.results import GatewayResult, Route

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "rmgate_requests",
    "HTTP requests answered by the gateway",
    ["model", "endpoint", "status"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "rmgate_request_seconds",
    "Gateway latency per HTTP request",
    ["model", "endpoint"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
ENGINE_REQUESTS = Counter(
    "rmgate_engine_requests",
    "Engine requests by slot and engine status",
    ["model", "slot", "status"],
    registry=REGISTRY,
)
ENGINE_SECONDS = Histogram(
    "rmgate_engine_seconds",
    "Engine latency per engine request",
    ["model", "slot"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "rmgate_slot_inflight",
    "Engine requests in flight per slot",
    ["model", "slot"],
    registry=REGISTRY,
)
QUEUED = Gauge(
    "rmgate_slot_queued", "Requests waiting for a slot's gate", ["model", "slot"], registry=REGISTRY
)
SLOT_UNAVAILABLE = Counter(
    "rmgate_slot_unavailable",
    "Retries while a slot's engine was unreachable (waiting for a restart)",
    ["model", "slot"],
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "rmgate_failovers",
    "Requests answered by another slot than their own",
    ["model", "from_slot", "to_slot"],
    registry=REGISTRY,
)
SEEDS_DERIVED = Counter(
    "rmgate_seeds_derived",
    "GRM requests whose seed the gateway derived",
    ["model"],
    registry=REGISTRY,
)
PLACED_AWAY = Counter(
    "rmgate_placements_away",
    "Engine requests answered by a class mate of "
    "the key's own slot, by reason (load, drained, unavailable)",
    ["model", "reason"],
    registry=REGISTRY,
)
ANSWER_SECONDS = Gauge(
    "rmgate_slot_answer_seconds",
    "Seconds per answer of each slot's "
    "engine (EWMA of answered round trips, each divided by the requests "
    "it waited behind in a serialized engine)",
    ["model", "slot"],
    registry=REGISTRY,
)
SLOT_CLASS = Gauge(
    "rmgate_slot_class",
    "1 for each slot's numerics class (as last reported)",
    ["model", "slot", "numerics_class"],
    registry=REGISTRY,
)
CANARY_DRIFT = Counter(
    "rmgate_canary_drift",
    "Slots whose probe digest changed under a running gateway (they leave their numerics class)",
    ["model", "slot"],
    registry=REGISTRY,
)
ENGINE_ABORTED = Counter(
    "rmgate_engine_requests_aborted",
    "Engine requests abandoned before "
    "their answer, by reason: `deadline` (the request's deadline passed "
    "in the engine) or `cancelled` (a sibling item failed, or the client "
    "went away); their connection is closed, so vLLM aborts them",
    ["model", "slot", "reason"],
    registry=REGISTRY,
)
CLIENT_DISCONNECTS = Counter(
    "rmgate_client_disconnects",
    "Requests whose client went away before the answer (their work was cancelled)",
    ["endpoint"],
    registry=REGISTRY,
)
LEDGER_WRITTEN = Counter(
    "rmgate_ledger_rows_written", "Rows written to the reward ledger", registry=REGISTRY
)
LEDGER_DROPPED = Counter(
    "rmgate_ledger_rows_dropped",
    "Rows not recorded: the ledger's buffer was full while its store was down or slow",
    registry=REGISTRY,
)
LEDGER_WRITE_ERRORS = Counter(
    "rmgate_ledger_write_errors",
    "Ledger batches the store refused (kept and retried)",
    registry=REGISTRY,
)
LEDGER_BUFFERED = Gauge(
    "rmgate_ledger_buffered", "Rows waiting for the ledger's writer", registry=REGISTRY
)
CACHE = Counter(
    "rmgate_cache",
    "Engine requests by how the ledger's cache answered them: "
    "`hit` (from the ledger, no engine call), `shared` (an identical request's "
    "call in flight), `miss` (its own engine call)",
    ["model", "outcome"],
    registry=REGISTRY,
)
COMPONENT_FAILURES = Counter(
    "rmgate_reward_component_failures",
    "Reward program components that failed for an item "
    "(`reason`: timeout, crashed, error, unparsed, unreadable, engine) and were skipped or "
    "replaced by the default; under `on_failure: error` the request answers 422 instead",
    ["program", "component", "reason"],
    registry=REGISTRY,
)
REWARD_DEFAULTS = Counter(
    "rmgate_reward_defaults",
    "Items whose reward was their program's `on_failure` default",
    ["program"],
    registry=REGISTRY,
)
REWARDS_MASKED = Counter(
    "rmgate_rewards_masked",
    "Items answered with no reward (`mask: true`) under `on_failure: mask`",
    ["model"],
    registry=REGISTRY,
)
SLOTS = Gauge("rmgate_slots", "Configured slots per model", ["model"], registry=REGISTRY)


def exposition() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def export_slot_counts(counts: dict[str, int]) -> None:
    for model, n in counts.items():
        SLOTS.labels(model).set(n)


_EXPORTED_CLASS: dict[tuple[str, int], str] = {}


def export_slot_classes(model: str, classes: tuple[str | None, ...]) -> None:
    """``rmgate_slot_class{model,slot,numerics_class} 1`` per slot (an info-style gauge)."""
    for slot, cls in enumerate(classes):
        label = cls or "unknown"
        old = _EXPORTED_CLASS.get((model, slot))
        if old is not None and old != label:
            SLOT_CLASS.remove(model, str(slot), old)
        _EXPORTED_CLASS[(model, slot)] = label
        SLOT_CLASS.labels(model, str(slot), label).set(1)


def record_request(model: str, endpoint: str, status: int, seconds: float | None) -> None:
    """One HTTP answer of the gateway (labels bounded: known endpoints and models only)."""
    REQUESTS.labels(model, endpoint, str(status)).inc()
    if seconds is not None:
        REQUEST_SECONDS.labels(model, endpoint).observe(seconds)


def record_program(result: GatewayResult) -> None:
    """A reward program's failed components and defaulted items, and the masked items of
    one answered request."""
    for failure in result.component_failures:
        COMPONENT_FAILURES.labels(failure.program, failure.component, failure.reason).inc()
    for program, n in result.defaults_used:
        REWARD_DEFAULTS.labels(program).inc(n)
    for target, n in result.masked:
        REWARDS_MASKED.labels(target).inc(n)


def record_cache(model: str, routes: Iterable[Route]) -> None:
    """How the cache answered each engine request of one answered request."""
    for route in routes:
        if route.cache is not None:
            CACHE.labels(model, route.cache).inc()


SLOT_TRANSITION_SECONDS = Histogram(
    "rmgate_slot_transition_seconds",
    "Time a slot took to sleep or wake (wake includes its numerics re-probe)",
    ["model", "slot", "op", "how"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
SLOT_AWAKE = Gauge(
    "rmgate_slot_awake",
    "1 while a slot serves, 0 while it sleeps or was kept out after a wake (as last seen)",
    ["model", "slot"],
    registry=REGISTRY,
)
SLOT_KEPT_OUT = Counter(
    "rmgate_slot_kept_out",
    "Wakes after which a slot answered its probes in another numerics class",
    ["model", "slot"],
    registry=REGISTRY,
)
AUTOSCALE_DECISIONS = Counter(
    "rmgate_autoscale_decisions",
    "Slot count changes the autoscaler decided, by direction and outcome (applied, failed); "
    "the reason of each is in the gateway's log",
    ["model", "direction", "outcome"],
    registry=REGISTRY,
)


def record_transition(model: str, slot: int, report: dict) -> None:
    """A sleep or wake a slot reported (``deployments.slot.lifecycle``)."""
    labels = (model, str(slot))
    last = report.get("last") or {}
    if report.get("changed") and "seconds" in last:
        SLOT_TRANSITION_SECONDS.labels(*labels, last["op"], str(last.get("how"))).observe(
            last["seconds"]
        )
    SLOT_AWAKE.labels(*labels).set(1 if report.get("state") == "awake" else 0)
    if report.get("changed") and report.get("state") == "kept_out":
        SLOT_KEPT_OUT.labels(*labels).inc()


AUDIT = Counter(
    "rmgate_audit",
    "Recorded rewards the auditor re-answered on a class mate with the cache off, by "
    "outcome: `same` (the recorded bits), `different`, `failed` (no answer to compare)",
    ["model", "numerics_class", "outcome"],
    registry=REGISTRY,
)
AUDIT_SKIPPED = Counter(
    "rmgate_audit_skipped",
    "Sampled rows the auditor did not re-answer, by reason (queue_full: its queue was full; "
    "no_mate: no other slot of the class was serving; no_body: recorded without a body)",
    ["model", "reason"],
    registry=REGISTRY,
)
AUDIT_QUEUED = Gauge(
    "rmgate_audit_queued", "Sampled rows waiting for an idle class mate", registry=REGISTRY
)
AUDIT_SUSPECT = Gauge(
    "rmgate_audit_suspect",
    "1 while a numerics class is suspect (an audit found its slots answering differently)",
    ["model", "numerics_class"],
    registry=REGISTRY,
)
AUDIT_DRAINED = Counter(
    "rmgate_audit_drained",
    "Slots the auditor drained: they answered differently from their class",
    ["model", "slot"],
    registry=REGISTRY,
)


QUEUE_WAIT_BUCKETS = (0.001, *LATENCY_BUCKETS)
QUEUE_WAIT_SECONDS = Histogram(
    "rmgate_queue_wait_seconds",
    "Time an engine request waited for a place in its slot's gate (or in its class queue), "
    "by the slot's numerics class: 0 when a place was free; a wait its deadline ended counts",
    ["model", "numerics_class"],
    buckets=QUEUE_WAIT_BUCKETS,
    registry=REGISTRY,
)
QUEUE_FULL = Counter(
    "rmgate_queue_full",
    "Engine requests refused at once (503 queue_full): their slot's waiting room, or every "
    "class mate's, was full",
    ["model", "numerics_class"],
    registry=REGISTRY,
)
LEDGER_WRITE_LAG = Histogram(
    "rmgate_ledger_write_lag_seconds",
    "Time from a row handed to the ledger's writer to the commit of its batch",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
SLOT_UP = Gauge(
    "rmgate_slot_up",
    "1 while a slot's replica answers this ingress awake or asleep (it serves, or wakes to "
    "serve), 0 after it did not answer (dead, restarting, starting) or was kept out of its "
    "class after a wake; as last seen by the transport",
    ["model", "slot"],
    registry=REGISTRY,
)


def forget_slot_up(model: str, slot: int) -> None:
    """A slot scaling removed has no ``rmgate_slot_up`` series (a stale 1 would count it)."""
    try:
        SLOT_UP.remove(model, str(slot))
    except KeyError:
        pass


CODE_TESTS = Counter(
    "rmgate_code_tests",
    "Tests of code_tests rules run in a sandbox, by rule (program/component) and outcome "
    "(passed, failed, timeout, runtime_error, memory_limit, output_limit, skipped)",
    ["rule", "outcome"],
    registry=REGISTRY,
)
CODE_RUN_SECONDS = Histogram(
    "rmgate_code_run_seconds",
    "One submission's sandbox run (all its tests), by rule, from its start (after the "
    "wait for a free run)",
    ["rule"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
CODE_WAIT_SECONDS = Histogram(
    "rmgate_code_wait_seconds",
    "Time a submission waited for a free run of its rule (`concurrency`)",
    ["rule"],
    buckets=QUEUE_WAIT_BUCKETS,
    registry=REGISTRY,
)
CODE_FAILURES = Counter(
    "rmgate_code_runs_failed",
    "Submissions that got no verdicts, by rule and reason (timeout: the rule's timeout_s; "
    "sandbox: the sandbox itself failed)",
    ["rule", "reason"],
    registry=REGISTRY,
)
