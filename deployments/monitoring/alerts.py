"""rmgate's Prometheus alert rules, as data (rendered to a rule file by ``render``).

Every metric is per ingress replica (one registry per process), so the rules keep
Prometheus' own ``instance`` label wherever one replica's view is what matters (its
ledger, which slots its transport can reach) and sum over replicas where the question is
the gateway's (request and error rates). Thresholds are defaults to adjust, not findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Alert:
    """One alerting rule: ``expr`` fires while true for ``for_``."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        """The rule as Prometheus' rule file writes it."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def ratio(part: str, by: str, window: str = "5m") -> str:
    """The share of ``rmgate_requests_total`` whose status matches ``part`` (a matcher)."""
    total = f"sum by ({by}) (rate(rmgate_requests_total[{window}]))"
    return f"sum by ({by}) (rate(rmgate_requests_total{{{part}}}[{window}])) / {total}"


ALERTS: tuple[Alert, ...] = (
    Alert(
        "RmgateAuditMismatch",
        'sum by (model, numerics_class) (increase(rmgate_audit_total{outcome="different"}[15m]))'
        " > 0",
        "0m",
        "critical",
        "An audit re-answer of {{ $labels.model }} differed from the recorded reward",
        "The auditor re-answered recorded rewards of numerics class "
        "{{ $labels.numerics_class }} on a class mate and got different bits "
        "({{ $value }} in 15 minutes): the class's slots do not all answer alike. The "
        "class is marked suspect (rmgate_audit_suspect) and the slot that differed is "
        "drained (rmgate_audit_drained_total).",
    ),
    Alert(
        "RmgateAuditSuspectClass",
        "max by (model, numerics_class) (rmgate_audit_suspect) == 1",
        "0m",
        "critical",
        "Numerics class {{ $labels.numerics_class }} of {{ $labels.model }} is suspect",
        "An audit found slots of this class answering differently "
        "(rmgate_audit_suspect is 1). /v1/models shows each slot's class and "
        "fingerprint.",
    ),
    Alert(
        "RmgateHigh5xxRate",
        ratio('status=~"5.."', "model, endpoint") + " > 0.05",
        "10m",
        "warning",
        "More than 5% of {{ $labels.model }} {{ $labels.endpoint }} requests answer 5xx",
        "{{ $value | humanizePercentage }} of the requests answered 5xx over 5 minutes "
        "(502: an engine failed; 503: overload, a slot unavailable or asleep; 504: the "
        "deadline passed). The error body's `code` says which.",
    ),
    Alert(
        "RmgateDeadlineExceeded",
        ratio('status="504"', "model, endpoint") + " > 0.01",
        "10m",
        "warning",
        "More than 1% of {{ $labels.model }} {{ $labels.endpoint }} requests miss their deadline",
        "{{ $value | humanizePercentage }} of the requests answered 504 deadline_exceeded "
        "over 5 minutes: they waited at a gate, in an engine or for a slot longer than "
        "x-rmgate-timeout (or gateway.request_timeout_s). See the queue waiting time and "
        "engine latency panels.",
    ),
    Alert(
        "RmgateQueueFull",
        "sum by (model, numerics_class) (rate(rmgate_queue_full_total[5m])) > 0",
        "5m",
        "warning",
        "Requests to {{ $labels.model }} are refused: its slots' queues are full",
        "Class {{ $labels.numerics_class }} refused {{ $value }} engine requests a second "
        "with 503 queue_full (Retry-After) for 5 minutes: the load exceeds what its slots "
        "answer. Add slots (rmgate scale) or raise max_queue_per_slot.",
    ),
    Alert(
        "RmgateLedgerRowsDropped",
        "increase(rmgate_ledger_rows_dropped_total[10m]) > 0",
        "0m",
        "critical",
        "The reward ledger of {{ $labels.instance }} dropped rows",
        "{{ $value }} rewards were answered but not recorded in 10 minutes: the writer's "
        "buffer was full while the store was down or slow. Their receipts point at no row.",
    ),
    Alert(
        "RmgateLedgerWriteErrors",
        "increase(rmgate_ledger_write_errors_total[10m]) > 0",
        "10m",
        "warning",
        "The reward ledger's store refuses writes from {{ $labels.instance }}",
        "Ledger batches keep failing (they are kept and retried); rows pile up in the "
        "buffer (rmgate_ledger_buffered) and are dropped once it is full.",
    ),
    Alert(
        "RmgateLedgerWriteLag",
        "histogram_quantile(0.99, sum by (le, instance) "
        "(rate(rmgate_ledger_write_lag_seconds_bucket[5m]))) > 30",
        "10m",
        "warning",
        "Ledger rows of {{ $labels.instance }} take over 30 s to be committed",
        "The 99th percentile from a row handed to the writer to its batch's commit is "
        "{{ $value | humanizeDuration }}: the store is slow, so the buffer grows.",
    ),
    Alert(
        "RmgateSlotOutOfClass",
        "max by (model, slot, numerics_class) "
        '(rmgate_slot_class{numerics_class=~"drift-.*|audit-.*"}) == 1',
        "0m",
        "warning",
        "Slot {{ $labels.model }}-{{ $labels.slot }} left its numerics class",
        "The slot is in class {{ $labels.numerics_class }}: drift-* when the canary saw "
        "its probe digest change (drained until its digest matches again), audit-* when "
        "the auditor found it answering differently (drained until its engine "
        "restarts). Its keys go to its class mates meanwhile.",
    ),
    Alert(
        "RmgateSlotKeptOut",
        "sum by (model, slot) (increase(rmgate_slot_kept_out_total[15m])) > 0",
        "0m",
        "warning",
        "Slot {{ $labels.model }}-{{ $labels.slot }} woke in another numerics class",
        "After a wake the slot answered its golden probes in another numerics class, so "
        "it is kept out: its requests get 503 slot_unavailable (the reason is in "
        "/v1/models). A second /wake_up starts its engine afresh.",
    ),
    Alert(
        "RmgateNoSlotServing",
        "sum without (slot) (rmgate_slot_up) == 0 and on (model, instance) rmgate_slots > 0",
        "2m",
        "critical",
        "No slot of {{ $labels.model }} answers {{ $labels.instance }}",
        "Every slot of the model was unreachable (dead, restarting, starting) or kept out "
        "the last time this ingress replica tried it: its requests wait, then answer 503 "
        "slot_unavailable. Check the slots' Serve applications (serve status) and "
        "/v1/models.",
    ),
)


def rule_file() -> dict[str, Any]:
    """Prometheus' rule file: one group with every rule."""
    return {"groups": [{"name": "rmgate", "rules": [a.rule() for a in ALERTS]}]}
