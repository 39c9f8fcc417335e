"""``rmgate sandbox serve``: the local sandbox behind Sandbox Fusion's ``POST /run_code``.

For a sandbox on a host of its own (a ``code_tests`` rule with ``sandbox: {type:
sandbox_fusion, url: ...}`` on the gateway), and for any tool that speaks Sandbox
Fusion's API. Each request is one run of its code with its ``stdin`` in a fresh bwrap
sandbox under the limits it asks for (``run_timeout``: wall and CPU seconds,
``memory_limit_MB``) and the server's own output and process limits. Python only.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.core.config.code_rules import LocalSandbox
from gateway.sandbox.errors import SandboxFailed, SandboxUnavailable
from gateway.sandbox.local import LocalBackend


class RunCodeRequest(BaseModel):
    """Sandbox Fusion's ``/run_code`` body (the fields this server reads; others are
    accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")
    code: str
    language: str = "python"
    stdin: str | None = ""
    run_timeout: float = Field(default=10.0, gt=0, le=600)
    compile_timeout: float = 10.0
    memory_limit_MB: int = -1


class RunResult(BaseModel):
    status: Literal["Finished", "TimeLimitExceeded", "Error"]
    execution_time: float | None
    return_code: int | None
    stdout: str
    stderr: str


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: RunResult | None = None
    run_result: RunResult | None = None
    files: dict[str, str] = Field(default_factory=dict)


def fusion_app(
    concurrency: int = 4,
    output_bytes: int = 8 << 20,
    processes: int = 64,
    default_memory_mb: int = 1024,
) -> FastAPI:
    """The ``/run_code`` service over ``LocalBackend``; at most ``concurrency`` runs at
    once (the rest wait)."""
    backend = LocalBackend(LocalSandbox())
    runs = asyncio.Semaphore(concurrency)
    app = FastAPI(title="rmgate sandbox (Sandbox Fusion /run_code)")

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> Any:
        if request.language not in ("python", "python3"):
            return JSONResponse(
                RunCodeResponse(
                    status="SandboxError",
                    message=f"language {request.language!r} is not supported here (python)",
                ).model_dump(),
                status_code=400,
            )
        memory = request.memory_limit_MB if request.memory_limit_MB > 0 else default_memory_mb
        submission = {
            "code": request.code,
            "tests": [{"input": request.stdin or "", "output": ""}],
            "limits": {
                "cpu_s": max(1, math.ceil(request.run_timeout)),
                "wall_s": request.run_timeout,
                "memory_mb": memory,
                "output_bytes": output_bytes,
                "processes": processes,
                "tmp_mb": 256,
                "near_limit": 1.0,
            },
            "compare": "exact",
            "stop_on_failure": False,
            "raw": True,
        }
        try:
            async with runs:
                verdict = (await backend.run(submission, request.run_timeout + 30))["tests"][0]
        except (SandboxFailed, SandboxUnavailable) as exc:
            return RunCodeResponse(status="SandboxError", message=str(exc))
        timed_out = verdict["outcome"] == "timeout"
        result = RunResult(
            status="TimeLimitExceeded" if timed_out else "Finished",
            execution_time=round(verdict["wall"], 6),
            return_code=None if timed_out else verdict["returncode"],
            stdout=verdict["stdout"],
            stderr=verdict["stderr"],
        )
        ok = not timed_out and verdict["returncode"] == 0
        return RunCodeResponse(status="Success" if ok else "Failed", run_result=result)

    return app
