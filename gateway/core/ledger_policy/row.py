"""What the ledger records of one answered engine request: the reward and its provenance
(a typed value of the core; the stores that keep it are ``gateway.ledger``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class LedgerRow:
    """One answer, as recorded. ``identity`` (``gateway.core.ledger_policy.identity``) is
    its receipt."""

    identity: str
    model: str
    numerics_class: str
    endpoint: str
    #: sha256 of the canonical engine body; the body itself only when the ledger keeps bodies.
    body_digest: str
    body: bytes | None
    #: The engine's answer, byte for byte (what a cache hit returns).
    answer: bytes
    status: int
    #: What a consumer reads: a DisRM's score, a judge's text (None where not applicable).
    score: float | None
    text: str | None
    slot: int
    fingerprint: str | None
    seed: int | None
    latency_s: float
    recorded_at: float

    def readable(self) -> LedgerRow:
        """This row with ``score`` and ``text`` read from its answer (the writer does it,
        off the request path)."""
        if self.score is not None or self.text is not None:
            return self
        score, text = readable_values(self.endpoint, self.answer)
        return replace(self, score=score, text=text)

    def as_dict(self, with_answer: bool = True) -> dict[str, object]:
        """The row as JSON-ready values (bytes as UTF-8 text; ``GET /v1/ledger/{receipt}``)."""
        out: dict[str, object] = {
            "receipt": self.identity,
            "model": self.model,
            "numerics_class": self.numerics_class,
            "endpoint": self.endpoint,
            "body_digest": self.body_digest,
            "status": self.status,
            "score": self.score,
            "text": self.text,
            "slot": self.slot,
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "latency_s": self.latency_s,
            "recorded_at": self.recorded_at,
        }
        if self.body is not None:
            out["body"] = self.body.decode("utf-8", "replace")
        if with_answer:
            out["answer"] = self.answer.decode("utf-8", "replace")
        return out


@dataclass(frozen=True)
class GroupRow:
    """One group scorer's run over one group, as recorded: which members it scored, with
    what, and the receipts of the engine answers each member's score was read from (each
    a ``LedgerRow``), so the group's rewards can be audited and replayed."""

    #: sha256 over (program, component, group identity): ``group_row_identity``.
    identity: str
    #: sha256 over the canonical group (``gateway.core.scoring.groups``).
    group_identity: str
    program: str
    component: str
    #: The scorer's type (``pairwise``, ``listwise``).
    scorer: str
    #: JSON: ``[{"item": <item identity>, "score": <float or null>, "receipts": [...]}]``,
    #: in the group's canonical order.
    members: str
    recorded_at: float

    def receipts(self) -> list[str]:
        """Every member's receipts, each once, in canonical order."""
        seen: dict[str, None] = {}
        for member in json.loads(self.members):
            seen.update(dict.fromkeys(member.get("receipts") or []))
        return list(seen)

    def as_dict(self) -> dict[str, object]:
        return {
            "group_receipt": self.identity,
            "group_identity": self.group_identity,
            "program": self.program,
            "component": self.component,
            "scorer": self.scorer,
            "members": json.loads(self.members),
            "recorded_at": self.recorded_at,
        }


def readable_values(endpoint: str, answer: bytes) -> tuple[float | None, str | None]:
    """What a consumer reads from an engine answer: a classifier's score (the last probs
    value of the last item, as ``/v1/rewards`` reads it) or a generation's text."""
    try:
        payload = json.loads(answer)
        if endpoint in ("/classify", "/pooling"):
            probs = payload["data"][-1].get("probs")
            return (float(probs[-1]) if isinstance(probs, list) and probs else None), None
        choice = payload["choices"][0]
        if endpoint == "/v1/chat/completions":
            return None, choice["message"].get("content")
        return None, choice.get("text")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None, None
