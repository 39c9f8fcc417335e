"""Make engines slow, the two ways the slow-slot benchmark and its tests do (SIGSTOP duty
cycles, a CPU cgroup quota), and the niceness Ray gives its workers (a baseline must run at
the same)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.harness import cpu_accounting
from gateway.harness.processes import group_pids


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
def duty_cycled(
    pgids: list[int], stopped_s: float = 0.09, running_s: float = 0.01
) -> Iterator[None]:
    """Make engines really slow, whatever the scheduler does: their whole process groups
    are stopped ``stopped_s`` out of every ``stopped_s + running_s`` (SIGSTOP/SIGCONT, from
    a process of its own), and always continued at the end. (Busy loops next to an engine
    do not slow it: CFS autogroup gives the engine's session its fair share whatever the
    number of loops.)"""
    cycler = subprocess.Popen(
        [sys.executable, "-c", _CYCLER, str(stopped_s), str(running_s), *map(str, pgids)]
    )
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
