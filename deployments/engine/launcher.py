"""Run the engine command as a process-group leader that takes its group down with it.

The slot replica starts the vLLM server through this launcher, in a new session. vLLM's
server forks an EngineCore and workers; if Ray kills the replica's worker process hard
(no ``__del__`` runs), those would be orphaned holding memory and a port. The launcher
watches its parent and, when the parent is gone, or when it is asked to stop (SIGTERM,
SIGINT), ends the whole process group: the server and every child it forked. And if the
launcher itself is SIGKILLed, the kernel SIGTERMs the server (``PR_SET_PDEATHSIG``), and a
forked watchdog in the group ends the group the same way (SIGTERM, then SIGKILL after the
grace period): a vLLM server still starting up was seen to outlive the SIGTERM.

    python -m deployments.engine.launcher [--grace-s 10] -- COMMAND [ARGS...]
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

POLL_S = 0.5
GRACE_S = 10.0


PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> None:
    """``preexec_fn`` of the server: the kernel sends it SIGTERM when the launcher dies.

    The launcher is a direct child of the Ray worker, and Ray may SIGKILL a dead worker's
    children at shutdown; without this the server (and its EngineCore) would outlive a
    SIGKILLed launcher. SIGTERM lets vLLM take its EngineCore down with it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _end_group(server_alive: Callable[[], bool], grace_s: float) -> None:
    """SIGTERM the group, wait a little, then SIGKILL everything left (ourselves last)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while server_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _fork_watchdog(server: int, grace_s: float) -> None:
    """A child of the launcher, in its group, that ends the group when the launcher is gone
    however it went (SIGKILL included: nothing of the launcher runs then)."""
    launcher = os.getpid()
    if os.fork() != 0:
        return
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's to act on
        while os.getppid() == launcher:
            time.sleep(POLL_S)
        _end_group(lambda: pid_alive(server), grace_s)
    finally:
        os._exit(0)


def main() -> None:
    argv = sys.argv[1:]
    grace_s = GRACE_S
    if len(argv) >= 2 and argv[0] == "--grace-s":
        grace_s, argv = float(argv[1]), argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m deployments.engine.launcher [--grace-s S] -- COMMAND [ARGS...]")
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = os.getppid()
    child = subprocess.Popen(argv, preexec_fn=_die_with_launcher)
    _fork_watchdog(child.pid, grace_s)
    stop = False

    def _on_signal(signum, frame):  # noqa: ARG001
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    while True:
        if child.poll() is not None:
            # The server exited by itself: take any stragglers (EngineCore) with it.
            rc = child.returncode
            try:
                os.killpg(0, signal.SIGKILL)
            finally:
                sys.exit(rc)
        if stop or os.getppid() != parent:
            _end_group(lambda: child.poll() is None, grace_s)
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
