"""A real rmgate (Ray Serve + vLLM CPU engines) for the integration tests.

Started once per session with the CLI a user runs (``rmgate serve``) in its own process
group, and always shut down: SIGINT first (the CLI shuts Serve and Ray down), then SIGKILL
to the whole group if it overstays.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-cpu.yaml"
START_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(proc: subprocess.Popen, grace_s: float = 120) -> None:
    """SIGINT (clean shutdown), wait, then SIGKILL whatever is left of the group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def processes_with_env(marker: str) -> list[int]:
    """Pids whose environment holds ``marker``: everything this test's gateway started
    (Ray, Serve replicas, engine launchers, vLLM servers and workers) inherits it."""
    needle = marker.encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def wait_until_serving(url: str, proc: subprocess.Popen, log: Path, timeout_s: float,
                       headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rmgate exited with {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            models = httpx.get(url + "/v1/models", timeout=5, headers=headers).json()
            if all(None not in m["fingerprints"] for m in models["data"]):
                return
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        time.sleep(2)
    raise RuntimeError(f"rmgate not serving after {timeout_s}s:\n{log.read_text()[-5000:]}")


@pytest.fixture(scope="session")
def gateway(demo_models, tmp_path_factory):
    """(url, process) of a running ``rmgate serve configs/test-cpu.yaml``."""
    port = free_port()
    log = tmp_path_factory.mktemp("rmgate") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "RMGATE_LOG_DIR": str(log.parent / "engines")}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(TEST_CONFIG), "--port", str(port)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    os.environ["RMGATE_TEST_ENGINE_LOGS"] = env["RMGATE_LOG_DIR"]
    os.environ["RMGATE_TEST_SERVE_LOG"] = str(log)
    try:
        wait_until_serving(url, proc, log, START_TIMEOUT_S)
        yield url, proc
    finally:
        stop_process_group(proc)
        time.sleep(2)
        leftovers = processes_with_env(env["RMGATE_LOG_DIR"])
        assert not leftovers, f"processes left after shutdown: {leftovers}"
