"""The remote sandbox: a Sandbox Fusion service (``POST {url}/run_code``), one run per
test, for users who run one (or ``rmgate sandbox serve`` on a host of its own).

Each test is one ``/run_code`` request: the code (assert-style: the code and the test
code after it) with the test's input as ``stdin``, the per-test wall limit as
``run_timeout`` and the memory limit as ``memory_limit_MB``. Its ``run_result`` is judged
by the same rules as a local run (``gateway.sandbox.harness.classify``). CPU, output and
process limits are the service's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gateway.core.config.code_rules import RemoteSandbox
from gateway.sandbox.errors import SandboxFailed, SandboxUnavailable
from gateway.sandbox.harness import classify


class RemoteBackend:
    """Runs submissions on a Sandbox Fusion service."""

    def __init__(self, spec: RemoteSandbox) -> None:
        self.spec = spec
        self.url = spec.url.rstrip("/") + "/run_code"
        self.fix = f"check that the Sandbox Fusion service at {spec.url} runs and answers /run_code"
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.spec.max_connections)
            self._client = httpx.AsyncClient(limits=limits, timeout=None)
        return self._client

    async def _one(self, submission: dict[str, Any], test: dict[str, Any]) -> dict[str, Any]:
        limits = submission["limits"]
        expected = test.get("output")
        code = (
            submission["code"]
            if expected is not None
            else f"{submission['code']}\n\n{test['code']}"
        )
        body = {
            "code": code,
            "language": self.spec.language,
            "stdin": test.get("input") or "",
            "run_timeout": limits["wall_s"],
            "compile_timeout": limits["wall_s"],
            "memory_limit_MB": limits["memory_mb"],
        }
        try:
            reply = await self._http().post(self.url, json=body)
        except httpx.HTTPError as exc:
            raise SandboxUnavailable(
                f"the sandbox service {self.url} did not answer: {exc}"
            ) from None
        if reply.status_code != 200:
            raise SandboxFailed(
                f"the sandbox service answered {reply.status_code}: {reply.text[:300]}"
            )
        answer = reply.json()
        if answer.get("status") == "SandboxError":
            raise SandboxFailed(f"the sandbox service failed: {answer.get('message')}")
        run = answer.get("run_result") or {}
        stdout = run.get("stdout") or ""
        stderr = run.get("stderr") or ""
        timed_out = run.get("status") == "TimeLimitExceeded"
        returncode = run.get("return_code")
        outcome = classify(
            timed_out=timed_out,
            returncode=0 if returncode is None and not timed_out else int(returncode or 0),
            stdout=stdout,
            stderr_tail=stderr[-4096:],
            output_over=len(stdout.encode()) >= limits["output_bytes"]
            or len(stderr.encode()) >= limits["output_bytes"],
            expected=expected,
            compare=submission["compare"],
        )
        used = float(run.get("execution_time") or 0.0)
        verdict: dict[str, Any] = {
            "outcome": outcome,
            "near_limit": timed_out or used > limits["near_limit"] * limits["wall_s"],
        }
        if outcome in ("runtime_error", "memory_limit"):
            verdict["error"] = (stderr.strip().splitlines() or ["error"])[-1][:200]
        return verdict

    async def run(self, submission: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        verdicts: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout_s):
            for test in submission["tests"]:
                if (
                    submission["stop_on_failure"]
                    and verdicts
                    and verdicts[-1]["outcome"] != "passed"
                ):
                    verdicts.append({"outcome": "skipped", "near_limit": False})
                    continue
                verdicts.append(await self._one(submission, test))
        return {"tests": verdicts}

    async def describe(self) -> str:
        """The service and language: what the ledger records its results under."""
        return f"sandbox_fusion:{self.spec.url}/{self.spec.language}"

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
