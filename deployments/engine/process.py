"""One vLLM OpenAI-compatible server in a child process group, owned by a slot replica.

Why a child server rather than an in-process ``AsyncLLM``: the server gives the exact
OpenAI/vLLM schema (chat templates, logprobs, pooling responses) that trainers already
parse, an engine crash cannot take the Ray worker down with it, and the ingress can reach
it over loopback HTTP without a second Serve handle hop (docs/architecture.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from deployments.engine.args import EnginePlan
from deployments.engine.ports import listener_is_ours


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_dir() -> Path:
    d = Path(os.environ.get("RMGATE_LOG_DIR", Path(tempfile.gettempdir()) / "rmgate-logs"))
    d.mkdir(parents=True, exist_ok=True)
    return d


class EngineStartError(RuntimeError):
    """The engine exited or did not become healthy in time; carries its log tail."""


class EngineProcess:
    """Start, probe and stop one vLLM server (and every process it forks)."""

    def __init__(self, plan: EnginePlan, host: str, port: int, name: str) -> None:
        self.plan = plan
        self.host = host
        self.url = f"http://{host}:{port}"
        self.name = name
        self.log_path = log_dir() / f"{name}-{port}.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        """The launcher, and under it vLLM's server (through ``vllm_server``)."""
        return [
            sys.executable,
            "-m",
            "deployments.engine.launcher",
            "--",
            sys.executable,
            "-m",
            "deployments.engine.vllm_server",
            *self.plan.args,
        ]

    def start(self) -> None:
        env = {**os.environ, **self.plan.env}
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float) -> None:
        """Block until GET /health answers 200, the process dies, or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise EngineStartError(
                        f"engine {self.name} exited with "
                        f"{self.proc.returncode if self.proc else '?'}"
                        f"; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        self._check_listener()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        self.stop()
        raise EngineStartError(
            f"engine {self.name} not healthy after {timeout_s:.0f}s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def _check_listener(self) -> None:
        """The answer on our port must come from our engine (``deployments.engine.ports``):
        a port handed to two engines would give this slot another model's answers."""
        port = int(self.url.rsplit(":", 1)[1])
        if self.proc is not None and listener_is_ours(port, self.proc.pid) is False:
            self.stop()
            raise EngineStartError(
                f"engine {self.name}: port {port} answers, but not from this engine's "
                f"processes (another program listens on it); log {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    async def healthy(self, client: httpx.AsyncClient) -> bool:
        if not self.alive():
            return False
        try:
            return (await client.get(self.url + "/health", timeout=10.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 15.0) -> None:
        """End the launcher's whole process group: server, EngineCore, workers."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the launcher leads its own session and group
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.poll()
