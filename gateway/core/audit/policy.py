"""What the auditor decides, free of I/O: which recorded rows it samples, which slot a
mismatch names, and the state ``GET /v1/audit`` shows.

A mismatch between two answers says only that the two differ, not which one is wrong. The
evidence that names a slot is a slot contradicting itself (its answer to the same request
now differs from its own earlier answer: it is not deterministic), or a third class mate
agreeing with one side. Two slots that each reproduce themselves and disagree, with no
third to ask, leave the class suspect and name nobody: draining the wrong one would move
every key of the class onto the slot that is off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["same", "different", "failed"]

#: Receipts are sha256 hex: their first 16 digits are uniform, so a threshold on them
#: samples a share of rows, the same rows on every run and in every replica.
_SAMPLE_DIGITS = 16


def sampled(receipt: str, share: float) -> bool:
    """Whether the row of ``receipt`` is in the audit's sample of ``share``."""
    if share <= 0:
        return False
    if share >= 1:
        return True
    try:
        return bool(int(receipt[:_SAMPLE_DIGITS], 16) < share * 16**_SAMPLE_DIGITS)
    except ValueError:
        return False


@dataclass(frozen=True)
class Evidence:
    """Canonical answers (``gateway.core.api.answers``) to one recorded request. ``None``
    where a call failed or was not made."""

    recorded_slot: int
    recorded: str
    peer_slot: int
    peer: str
    #: The recorded slot's answer now.
    original: str | None = None
    #: The peer's second answer.
    peer_again: str | None = None
    third_slot: int | None = None
    third: str | None = None


@dataclass(frozen=True)
class Blame:
    """The slot the evidence names (None: nobody), and why, in words for the log."""

    slot: int | None
    reason: str


def blame(e: Evidence) -> Blame:
    """Which slot a mismatch (``e.peer != e.recorded``) names, if any."""
    if e.original is not None and e.original != e.recorded:
        return Blame(
            e.recorded_slot,
            f"slot {e.recorded_slot} answers the request otherwise than it did when recorded",
        )
    if e.peer_again is not None and e.peer_again != e.peer:
        return Blame(e.peer_slot, f"slot {e.peer_slot} answers the same request two ways")
    if e.third is not None and e.third_slot is not None:
        if e.third == e.recorded:
            return Blame(
                e.peer_slot,
                f"slot {e.peer_slot} answers otherwise than slots {e.recorded_slot} and "
                f"{e.third_slot}",
            )
        if e.third == e.peer:
            return Blame(
                e.recorded_slot,
                f"slot {e.recorded_slot} answered otherwise than slots {e.peer_slot} and "
                f"{e.third_slot}",
            )
    return Blame(
        None,
        f"slots {e.recorded_slot} and {e.peer_slot} disagree, each reproduces itself and no "
        "third class mate decides: the class is suspect",
    )


@dataclass(frozen=True)
class AuditRecord:
    """One re-answer as the ledger keeps it (the ``audits`` table)."""

    receipt: str
    model: str
    numerics_class: str
    recorded_slot: int
    audit_slot: int | None
    outcome: Outcome
    #: The slot the evidence named (drained under ``on_mismatch: drain``).
    blamed_slot: int | None
    detail: str
    audited_at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "receipt": self.receipt,
            "model": self.model,
            "numerics_class": self.numerics_class,
            "recorded_slot": self.recorded_slot,
            "audit_slot": self.audit_slot,
            "outcome": self.outcome,
            "blamed_slot": self.blamed_slot,
            "detail": self.detail,
            "at": self.audited_at,
        }


@dataclass
class ClassTally:
    same: int = 0
    different: int = 0
    failed: int = 0
    suspect: bool = False
    #: ``same`` outcomes in a row since the last mismatch (clears a suspect class).
    streak: int = 0


@dataclass
class AuditBook:
    """What one ingress replica's auditor has found: counts per class, suspect classes,
    drained slots, the last mismatch."""

    clear_after: int = 100
    tallies: dict[tuple[str, str], ClassTally] = field(default_factory=dict)
    drained: list[dict[str, Any]] = field(default_factory=list)
    last_mismatch: dict[str, Any] | None = None

    def add(self, record: AuditRecord) -> ClassTally:
        """Count one outcome; a mismatch makes its class suspect, a run of ``clear_after``
        identical answers clears it."""
        tally = self.tallies.setdefault((record.model, record.numerics_class), ClassTally())
        if record.outcome == "same":
            tally.same += 1
            tally.streak += 1
            if tally.suspect and tally.streak >= self.clear_after:
                tally.suspect = False
        elif record.outcome == "different":
            tally.different += 1
            tally.streak = 0
            tally.suspect = True
            self.last_mismatch = {**record.as_dict(), "verdict": record.detail}
        else:
            tally.failed += 1
        return tally

    def drain(self, model: str, slot: int, numerics_class: str, receipt: str) -> None:
        self.drained.append(
            {
                "model": model,
                "slot": slot,
                "numerics_class": numerics_class,
                "receipt": receipt,
                "at": time.time(),
            }
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "classes": [
                {
                    "model": model,
                    "numerics_class": cls,
                    "same": t.same,
                    "different": t.different,
                    "failed": t.failed,
                    "suspect": t.suspect,
                }
                for (model, cls), t in sorted(self.tallies.items())
            ],
            "drained": list(self.drained),
            "last_mismatch": self.last_mismatch,
        }
