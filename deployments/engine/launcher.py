"""Run the engine command as a process-group leader that takes its group down with it.

The slot replica starts the vLLM server through this launcher, in a new session. vLLM's
server forks an EngineCore and workers; if Ray kills the replica's worker process hard
(no ``__del__`` runs), those would be orphaned holding memory and a port. The launcher
watches its parent and, when the parent is gone, or when it is asked to stop (SIGTERM,
SIGINT), ends the whole process group: the server and every child it forked. And if the
launcher itself is SIGKILLed, the kernel SIGTERMs the server (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

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


def _end_group(child: subprocess.Popen) -> None:
    """SIGTERM the group, wait a little, then SIGKILL everything left (ourselves last)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m deployments.engine.launcher -- COMMAND [ARGS...]")
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = os.getppid()
    child = subprocess.Popen(argv, preexec_fn=_die_with_launcher)
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
            _end_group(child)
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
