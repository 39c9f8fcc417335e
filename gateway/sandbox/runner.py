"""The code sandboxes of a gateway: one backend per ``code_tests`` rule, each bounded by
its rule's ``concurrency``, probed before the gateway serves.

Mechanism: the policy (which code, which tests, the score, what is recorded) is
``gateway.core.scoring.code_tests``; this runs what it built and records metrics. A rule
waits for a free run within its timeout, so a flood of looping submissions costs that
rule its own runs and nothing of another rule's or a model's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.core.api.errors import RuleCheckFailed
from gateway.core.config.code_rules import CodeTestsRule, LocalSandbox
from gateway.core.config.settings import AppConfig
from gateway.core.scoring.base import CodeCall
from gateway.observability import metrics
from gateway.sandbox.errors import SandboxFailed, SandboxUnavailable

#: A submission every sandbox must pass before its gateway serves (a real run).
PROBE = {
    "language": "python",
    "code": "print(sum(map(int, input().split())))",
    "tests": [{"input": "2 3\n", "output": "5"}],
    "limits": {
        "cpu_s": 5,
        "wall_s": 20,
        "memory_mb": 512,
        "output_bytes": 1 << 16,
        "processes": 16,
        "tmp_mb": 16,
        "near_limit": 1.0,
    },
    "compare": "lines",
    "stop_on_failure": False,
}


class Backend(Protocol):
    #: What to do when it cannot run (named in the start-up error).
    fix: str

    async def run(self, submission: dict[str, Any], timeout_s: float) -> dict[str, Any]: ...

    async def describe(self) -> str: ...

    async def close(self) -> None: ...


def backend_for(spec: CodeTestsRule) -> Backend:
    if isinstance(spec.sandbox, LocalSandbox):
        from gateway.sandbox.local import LocalBackend

        return LocalBackend(spec.sandbox)
    from gateway.sandbox.remote import RemoteBackend

    return RemoteBackend(spec.sandbox)


def code_rules(config: AppConfig) -> dict[str, CodeTestsRule]:
    """``program/component`` -> its ``code_tests`` rule, for every one the config has."""
    return {
        f"{program.name}/{comp.name}": comp.rule
        for program in config.programs
        for comp in program.components
        if isinstance(comp.rule, CodeTestsRule)
    }


@dataclass
class _Rule:
    backend: Backend
    runs: asyncio.Semaphore
    identity: str = "unprobed"


class CodeSandboxes:
    """Every ``code_tests`` rule's sandbox (``gateway.core.scoring.base.CodeRunner``)."""

    def __init__(self, rules: dict[str, CodeTestsRule]) -> None:
        self.rules = {
            name: _Rule(backend_for(spec), asyncio.Semaphore(spec.concurrency))
            for name, spec in rules.items()
        }

    async def probe(self) -> None:
        """A real run of ``PROBE`` in every rule's sandbox; ``SandboxUnavailable`` naming
        the fix when one does not pass (the gateway must not start)."""
        for name, rule in self.rules.items():
            try:
                verdicts = await rule.backend.run(PROBE, 120)
            except SandboxFailed as exc:
                raise SandboxUnavailable(
                    f"rule {name}: the sandbox's probe failed: {exc}; {rule.backend.fix}"
                ) from None
            outcome = verdicts["tests"][0]["outcome"]
            if outcome != "passed":
                raise SandboxUnavailable(
                    f"rule {name}: the sandbox's probe (2 + 3 printed) came out {outcome!r}; "
                    f"{rule.backend.fix}"
                )
            rule.identity = await rule.backend.describe()
            await rule.backend.close()  # its connections belonged to the probe's loop

    def identity(self, rule: str) -> str:
        return self.rules[rule].identity

    async def run(self, call: CodeCall, timeout_s: float) -> list[dict[str, Any]]:
        rule = self.rules[call.rule]
        waited = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                async with rule.runs:
                    started = time.monotonic()
                    metrics.CODE_WAIT_SECONDS.labels(call.rule).observe(started - waited)
                    verdicts = await rule.backend.run(call.submission, timeout_s)
                    metrics.CODE_RUN_SECONDS.labels(call.rule).observe(time.monotonic() - started)
        except TimeoutError:
            metrics.CODE_FAILURES.labels(call.rule, "timeout").inc()
            raise RuleCheckFailed(
                f"code_tests {call.rule} did not finish within {timeout_s:g} s (its sandbox "
                f"was killed)",
                reason="timeout",
            ) from None
        except (SandboxFailed, SandboxUnavailable) as exc:
            metrics.CODE_FAILURES.labels(call.rule, "sandbox").inc()
            raise RuleCheckFailed(f"code_tests {call.rule}: {exc}", reason="sandbox") from None
        tests: list[dict[str, Any]] = verdicts["tests"]
        for verdict in tests:
            metrics.CODE_TESTS.labels(call.rule, verdict["outcome"]).inc()
        return tests

    async def close(self) -> None:
        for rule in self.rules.values():
            await rule.backend.close()
