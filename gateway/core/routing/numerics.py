"""Numerics classes: which slots of a model give bitwise-identical answers.

A slot's answer is a function of the request and of everything that decides the arithmetic
(engine and version, model digest, dtype, the mode actually running, attention backend,
parallel sizes, device, kernel-changing environment): its *identity*, plus the digest of
its answers to a fixed golden probe set (``deployments.engine.numerics``). Slots with equal
identity and equal probe digest form a class, named by a short hash. The invariant rmgate
keeps: **a key is answered only by slots of one class**; within the class placement is
free (bounded load, a dead slot's keys to a class mate) without changing a bit.

Pure: grouping and the strict/mixed policy only, from class ids the slots report.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

ClassPolicy = Literal["strict", "mixed"]

CLASS_ID_CHARS = 12
#: The class the canary gives a slot whose probe digest changed (``drift-<digest>``): such a
#: slot is drained under either policy until its digest matches again.
DRIFT_PREFIX = "drift-"
#: The class the auditor gives a slot that answered a recorded request differently from its
#: class (``audit-<class>``): drained under either policy until its engine restarts.
AUDIT_PREFIX = "audit-"
#: Classes that set a slot aside: never a majority, always drained.
SET_ASIDE = (DRIFT_PREFIX, AUDIT_PREFIX)


def set_aside(numerics_class: str | None) -> bool:
    """Whether a slot of this class was taken out of its class by the canary or the audit."""
    return numerics_class is not None and numerics_class.startswith(SET_ASIDE)


def probe_digest_of(answers: Iterable[str]) -> str:
    """sha256 over the canonical answers to the golden probes, in probe order: what the
    replica computes at start-up and the canary recomputes (one definition)."""
    h = hashlib.sha256()
    for canonical in answers:
        h.update(canonical.encode() + b"\n")
    return h.hexdigest()


def class_id(identity: Mapping[str, Any], probe_digest: str) -> str:
    """The class of a slot: a short hash of its identity and its probe digest."""
    blob = json.dumps(
        {"identity": identity, "probe_digest": probe_digest}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:CLASS_ID_CHARS]


@dataclass(frozen=True)
class ModelClasses:
    """The classes of one model's slots, and which slots are drained.

    ``classes[s]`` is slot ``s``'s class id, ``None`` while unknown (starting, never
    described): an unknown slot is a class of its own, so its keys stay on it.
    ``majority`` is the class most slots report (ties: the class of the lowest slot).
    Under ``strict`` a slot outside the majority class is drained: it answers no key.
    """

    classes: tuple[str | None, ...]
    policy: ClassPolicy = "strict"
    # ``majority`` and ``groups`` are computed once per view (cached_property): placement
    # asks ``drained`` of every slot for every engine request.

    @cached_property
    def majority(self) -> str | None:
        known = [c for c in self.classes if c is not None and not set_aside(c)]
        if not known:
            return None
        counts = Counter(known)
        top = max(counts.values())
        return next(c for c in known if counts[c] == top)

    @cached_property
    def groups(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for slot, cls in enumerate(self.classes):
            if cls is not None:
                out.setdefault(cls, []).append(slot)
        return out

    def drained(self, slot: int) -> bool:
        cls = self.classes[slot]
        if set_aside(cls):
            return True
        return (
            self.policy == "strict"
            and cls is not None
            and len(self.groups) > 1
            and cls != self.majority
        )

    def drain_reason(self, slot: int) -> str | None:
        if not self.drained(slot):
            return None
        if str(self.classes[slot]).startswith(DRIFT_PREFIX):
            return (
                "its probe digest changed under the running gateway (canary): drained "
                "until it matches again"
            )
        if str(self.classes[slot]).startswith(AUDIT_PREFIX):
            return (
                "it answered a recorded request differently from its class (audit): drained "
                "until its engine restarts"
            )
        return (
            f"class {self.classes[slot]} differs from the model's majority class "
            f"{self.majority} (class_policy: strict)"
        )

    def mates(self, slot: int) -> list[int]:
        """Slots that may answer slot ``slot``'s keys: its class (the majority class when
        ``slot`` is drained), drained slots excluded; just ``[slot]`` while unknown."""
        cls = self.classes[slot]
        if cls is None:
            return [slot]
        if self.drained(slot):
            cls = self.majority
            if cls is None:
                return []
        return [s for s, c in enumerate(self.classes) if c == cls and not self.drained(s)]
