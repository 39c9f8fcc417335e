"""Start and stop a real ``rmgate serve`` for benchmarks and tests (no pytest needed, so the
GPU benchmark runs on the lent machine as is).

The gateway runs in its own process group with a marker in its environment, so that
everything it starts (Ray, Serve replicas, engine launchers, vLLM) can be found and ended by
id: SIGINT first (the CLI shuts Serve and Ray down), then SIGKILL to the group.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deployments.engine.process import free_port  # noqa: E402,F401  (one helper, re-exported)
from benchmarks import cpu_accounting  # noqa: E402


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
    """Pids whose environment holds ``marker``: everything a gateway started inherits it."""
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


def engine_launcher_pid(port: int | str) -> int:
    """The engine launcher (process-group leader) of the engine listening on ``port``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (b"deployments.engine.launcher" in cmd and b"--port" in cmd
                    and cmd[cmd.index(b"--port") + 1] == str(port).encode()):
                return int(entry.name)
    raise LookupError(port)


def ray_worker_niceness(default: int = 15) -> int:
    """The niceness Ray gave its workers on this host (``RAY_worker_niceness``; rmgate's
    HAProxy, ingress and slot replicas and so the engines they start all run at it), read
    from a running Serve replica. A baseline started by hand runs at 0, and on a saturated
    host the kernel gives a nice-0 process ~28x the CPU weight of a nice-15 one: a
    comparison of placement policies must run the baseline at the same niceness."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"ServeReplica:" not in (entry / "cmdline").read_bytes():
                    continue
                return int(cpu_accounting.stat_fields(entry)[cpu_accounting.NICE])
            except (OSError, IndexError, ValueError):
                continue
    return default


def wait_until_gone(marker: str, timeout_s: float = 60.0) -> list[int]:
    """Processes still carrying ``marker`` after up to ``timeout_s``: engine launchers end
    their groups within ~10 s of their replica's death, so a shutdown is not instant."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_with_env(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def end_leftovers(marker: str, timeout_s: float = 60.0) -> list[int]:
    """``wait_until_gone``, then SIGKILL by pid whatever still carries ``marker`` (only
    processes this gateway started carry it): after a start-up that failed, engines
    re-parented to init are outside the CLI's process group. Returns what was left, so the
    caller can still fail on it."""
    left = wait_until_gone(marker, timeout_s)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def dashboard_address(serve_log: Path, timeout_s: float = 120.0) -> str:
    """The Ray dashboard that ``rmgate serve`` printed: it prints it once every application
    is RUNNING, which can be a moment after the HTTP path already answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        match = re.search(r"serve status --address (\S+)", serve_log.read_text())
        if match:
            return match.group(1)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no dashboard address in {serve_log}:\n"
                               f"{serve_log.read_text()[-2000:]}")
        time.sleep(0.5)


#: The duty cycler: a process of its own, so that the benchmark's busy event loop (it holds
#: the GIL for milliseconds at a time under load) cannot stretch the running windows.
_CYCLER = """
import os, signal, sys, time
stopped, running = float(sys.argv[1]), float(sys.argv[2])
pgids = [int(p) for p in sys.argv[3:]]
def send(sig):
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
def stop(*_):
    send(signal.SIGCONT)
    raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    send(signal.SIGSTOP)
    time.sleep(stopped)
    send(signal.SIGCONT)
    time.sleep(running)
"""


@contextmanager
def duty_cycled(pgids: list[int], stopped_s: float = 0.09,
                running_s: float = 0.01) -> Iterator[None]:
    """Make engines really slow, whatever the scheduler does: their whole process groups
    are stopped ``stopped_s`` out of every ``stopped_s + running_s`` (SIGSTOP/SIGCONT, from
    a process of its own), and always continued at the end. (Busy loops next to an engine
    do not slow it: CFS autogroup gives the engine's session its fair share whatever the
    number of loops.)"""
    cycler = subprocess.Popen([sys.executable, "-c", _CYCLER, str(stopped_s), str(running_s),
                               *map(str, pgids)])
    try:
        yield
    finally:
        cycler.terminate()
        try:
            cycler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cycler.kill()
            cycler.wait()
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:  # that engine is gone (restarted, shut down)
                pass


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (root: writable)


def group_pids(pgids: list[int]) -> list[int]:
    """Every process of the given process groups (an engine: launcher, API server,
    EngineCore, workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pgid = int(cpu_accounting.stat_fields(entry)[cpu_accounting.PGRP])
            except (OSError, IndexError, ValueError):
                continue
            if pgid in pgids:
                out.append(int(entry.name))
    return out


def can_throttle() -> bool:
    """Whether this host lets us make a CPU cgroup with a quota (root, cgroup v1 cpu)."""
    probe = CPU_CGROUP / f"rmgate-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "cpu.cfs_quota_us").write_text("50000")
        return True
    except OSError:
        return False
    finally:
        probe.rmdir()


@contextmanager
def cpu_throttled(pgids: list[int], share: float) -> Iterator[None]:
    """Make engines slow the way a throttled container is: every process of their process
    groups is moved into a CPU cgroup whose quota is ``share`` of one core (CFS bandwidth
    control, ``cpu.cfs_quota_us``), and moved back at the end. Unlike SIGSTOP duty cycles
    this caps work done, not wall time: measured here, an engine stopped 97 % of the time
    still answered 0.8x its twin's rate at concurrency 32 (it drains its queue in each
    running window), the tiny demo models needing ~0.5 ms per request."""
    group = CPU_CGROUP / f"rmgate-slow-{os.getpid()}"
    group.mkdir()
    try:
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(period * share))))
        for pid in group_pids(pgids):
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except OSError:  # gone meanwhile
                pass
        yield
    finally:
        for line in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(line)
            except OSError:
                pass
        group.rmdir()


def metric_total(url: str, name: str) -> float:
    """The sum over every label set of one Prometheus counter or gauge on ``url/metrics``."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def wait_until_serving(url: str, proc: subprocess.Popen, log: Path, timeout_s: float,
                       headers: dict[str, str] | None = None) -> None:
    """Until every slot of every model reports a fingerprint (its engine is up)."""
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


@contextmanager
def running_gateway(config: Path, workdir: Path, timeout_s: float = 900,
                    env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """``rmgate serve CONFIG`` on a free port: yields (url, engine log dir); always stops
    it and checks that nothing it started is left."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log, engines = workdir / "serve.log", workdir / "engines"
    shutil.rmtree(engines, ignore_errors=True)  # a reused workdir must not show old engines
    full_env = {**os.environ, "RMGATE_LOG_DIR": str(engines), "HF_HUB_OFFLINE": "1",
                "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", str(config),
                                 "--port", str(port)], cwd=REPO, env=full_env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, log, timeout_s)
        yield url, engines
    finally:
        stop_process_group(proc)
        left = wait_until_gone(str(engines))
        if left:
            raise RuntimeError(f"processes left after shutdown: {left}")
