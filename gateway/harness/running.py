"""Start and stop a real ``rmgate serve`` for benchmarks and tests (no pytest needed, so the
GPU benchmark runs on a GPU host as is), and read what it reports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from deployments.engine.ports import fixed_port
from gateway.harness.processes import stop_process_group, wait_until_gone

#: The checkout (or, installed, the folder holding the packages): ``rmgate serve`` runs there.
REPO = Path(__file__).resolve().parents[2]


def serve_config(args: dict[str, Any]) -> dict[str, Any]:
    """A Serve config file's content with one rmgate application of ``args`` (its
    ``gateway``, ``models``, ``programs``), on loopback: what ``running_gateway`` serves."""
    return {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {
                "name": "rmgate",
                "route_prefix": "/",
                "import_path": "gateway.serve.app:build_app",
                "args": args,
            }
        ],
    }


def printed_line(log: Path, needle: str, timeout_s: float = 120.0) -> str:
    """The first line of ``log`` holding ``needle``, waited for: ``rmgate serve`` prints its
    sample requests and its dashboard once every application is RUNNING, which can be a
    moment after the HTTP path already answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")
        line = next((x for x in text.splitlines() if needle in x), None)
        if line is not None:
            return line
        if time.monotonic() > deadline:
            raise RuntimeError(f"no line with {needle!r} in {log}:\n{text[-2000:]}")
        time.sleep(0.5)


def dashboard_address(serve_log: Path, timeout_s: float = 120.0) -> str:
    """The Ray dashboard that ``rmgate serve`` printed."""
    line = printed_line(serve_log, "serve status --address ", timeout_s)
    return line.split("serve status --address ", 1)[1].split()[0]


def metric_total(url: str, name: str) -> float:
    """The sum over every label set of one Prometheus counter or gauge on ``url/metrics``."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


def slots_ready(card: dict[str, Any]) -> bool:
    """Whether every slot of a ``/v1/models`` entry is up: its engine reports a
    fingerprint, or it sleeps on purpose (a request wakes it)."""
    states = card.get("slot_states") or [{}] * len(card["fingerprints"])
    return all(
        fp is not None or st.get("state") == "asleep"
        for fp, st in zip(card["fingerprints"], states)
    )


def wait_until_serving(
    url: str,
    proc: subprocess.Popen,
    log: Path,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> None:
    """Until every slot of every model is up (``slots_ready``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rmgate exited with {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            models = httpx.get(url + "/v1/models", timeout=5, headers=headers).json()
            if all(slots_ready(m) for m in models["data"]):
                return
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        time.sleep(2)
    raise RuntimeError(f"rmgate not serving after {timeout_s}s:\n{log.read_text()[-5000:]}")


@contextmanager
def running_gateway(
    config: Path,
    workdir: Path,
    timeout_s: float = 900,
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Iterator[tuple[str, Path]]:
    """``rmgate serve CONFIG`` on a free port: yields (url, engine log dir); always stops
    it and checks that nothing it started is left."""
    port = fixed_port("127.0.0.1")  # bound minutes later: outside the ephemeral range
    workdir.mkdir(parents=True, exist_ok=True)
    log, engines = workdir / "serve.log", workdir / "engines"
    shutil.rmtree(engines, ignore_errors=True)  # a reused workdir must not show old engines
    full_env = {
        **os.environ,
        "RMGATE_LOG_DIR": str(engines),
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", str(port)],
            cwd=REPO,
            env=full_env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, log, timeout_s, headers)
        yield url, engines
    finally:
        stop_process_group(proc)
        left = wait_until_gone(str(engines))
        if left:
            raise RuntimeError(f"processes left after shutdown: {left}")
