"""The Scorer seam: one protocol from a reward item to a score.

A scorer turns an item into zero or more calls (an engine request through the gateway, or
a rule check in the rule pool) and reads their answers into a ``Score``. It does no I/O
itself: ``gateway.core.scoring.rewards`` sends the calls (so every engine request has the key,
seed, slot, ledger row and receipt of the same request sent on its own) and hands the
answers back, in call order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import JsonValue


@dataclass(frozen=True)
class RewardInput:
    """One item as every scorer sees it."""

    index: int
    #: The question as text (a judge's ``{prompt}``).
    prompt: str
    #: The answer as text (a judge's ``{response}``, what rules check).
    response: str
    #: The label as text (``{label}``, the rules' reference); None: none sent.
    label: str | None = None
    #: A DisRM's conversation, the response last (``/v1/rewards``).
    messages: list[dict[str, Any]] | None = None
    #: A DisRM's whole token sequence as text (``/get_reward``'s query).
    text: str | None = None
    #: The label as the trainer sent it.
    raw_label: JsonValue = None
    #: The group the item belongs to (``/v1/rewards`` ``group``); None: scored alone.
    group: str | None = None


@dataclass(frozen=True)
class EngineCall:
    """A request to the gateway's own engine path: ``path`` and ``body`` for ``model``."""

    path: str
    body: dict[str, Any]


@dataclass(frozen=True)
class RuleCall:
    """A rule check run in the rule pool: ``check`` (a rule type) with its options."""

    check: str
    options: dict[str, Any]
    response: str
    label: str | None
    timeout_s: float


@dataclass(frozen=True)
class CodeCall:
    """A submission run in a code sandbox (``gateway.sandbox``) by the rule ``rule``
    (``program/component``): ``submission`` is what the sandbox runs
    (``gateway.core.scoring.code_tests.submission``)."""

    rule: str
    submission: dict[str, Any]
    timeout_s: float
    #: Whether the result may be recorded and answered from the ledger (the rule's
    #: ``deterministic``).
    recorded: bool = True


Call = EngineCall | RuleCall | CodeCall


@dataclass(frozen=True)
class Score:
    """What a scorer read. ``value`` is None when there is no score; ``failure`` names
    why the answer did not give one (``unparsed``: a judge's text held no score and
    ``value`` is the configured default; ``unreadable``: an answer lacked what the scorer
    reads)."""

    value: float | None
    detail: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    message: str | None = None


class Scorer(Protocol):
    """Turns an item into calls and their answers into a score."""

    #: The registry name (the config's ``type``).
    type: str

    def calls(self, item: RewardInput) -> list[Call]:
        """The calls whose answers ``read`` needs, in order."""
        ...

    def read(self, item: RewardInput, answers: list[Any]) -> Score:
        """The score from the calls' answers (parsed JSON bodies / rule values)."""
        ...


class CodeRunner(Protocol):
    """Runs code submissions in sandboxes (``gateway.sandbox.runner.CodeSandboxes``)."""

    def identity(self, rule: str) -> str:
        """What decides the rule's verdicts besides the submission (its sandbox's
        versions): the class its results are recorded under."""
        ...

    async def run(self, call: CodeCall, timeout_s: float) -> list[dict[str, Any]]:
        """One verdict per test; ``RuleCheckFailed`` (``timeout``, ``sandbox``) when the
        sandbox gave none."""
        ...


class RuleRunner(Protocol):
    """Runs rule checks out of the event loop's way (``gateway.rules.RulePool``)."""

    async def run(self, call: RuleCall) -> float:
        """The check's value; ``RuleCheckFailed`` (reason ``timeout``, ``crashed`` or
        ``error``) when it gave none."""
        ...
