"""The two ways the slow-slot benchmark makes an engine slow (``gateway.harness.slowdowns``),
on a busy child process: a CPU cgroup capped at a share of one core, and a SIGSTOP duty cycle
run from a process of its own. Each is checked by the CPU the child gets, against the same
child unthrottled (the negative control), and by being undone at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gateway.harness.slowdowns import CPU_CGROUP, can_throttle, cpu_throttled, duty_cycled

pytestmark = pytest.mark.timing  # asserts durations / CPU shares: run when the machine is quiet

BUSY = "while True: pass"


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share_over(pid: int, seconds: float) -> float:
    before, t = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_seconds(pid) - before) / (time.monotonic() - t)


def _best_share(pid: int, windows: int = 3) -> float:
    """The most CPU the child got in any of ``windows`` half-second windows: a shared host
    can take a core away for a second; a cap that was not undone holds in every window."""
    return max(_share_over(pid, 0.5) for _ in range(windows))


def _busy_child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.skipif(not can_throttle(), reason="no writable cgroup v1 cpu controller here")
def test_a_cpu_cgroup_caps_the_engine_and_is_undone():
    proc = _busy_child()
    try:
        free = _best_share(proc.pid)
        with cpu_throttled([proc.pid], 0.1):
            capped = _share_over(proc.pid, 1.5)
        after = _best_share(proc.pid)
    finally:
        _stop(proc)
    assert capped < 0.2 and free > 0.4 and after > 0.4, (free, capped, after)
    assert not [p for p in CPU_CGROUP.iterdir() if p.name.startswith(f"rmgate-slow-{os.getpid()}")]


def test_a_duty_cycle_stops_the_engine_most_of_the_time_and_continues_it_at_the_end():
    proc = _busy_child()
    try:
        free = _best_share(proc.pid)
        with duty_cycled([proc.pid], 0.09, 0.01):
            stopped = _share_over(proc.pid, 1.5)
        after = _best_share(proc.pid)
    finally:
        _stop(proc)
    assert stopped < 0.3 and free > 0.4 and after > 0.4, (free, stopped, after)
