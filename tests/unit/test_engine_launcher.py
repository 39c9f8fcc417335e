"""The engine launcher never leaves its server behind: not when its parent dies, not when
it is asked to stop, and not when it is SIGKILLed itself (Ray may do that at shutdown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from deployments.engine.launcher import pid_alive as _alive


def _launch(tmp_path, ignore_sigterm: bool = False):
    pidfile = tmp_path / "server.pid"
    server = (
        "import os, signal, time; "
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_sigterm else "")
        + f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deployments.engine.launcher",
            "--grace-s",
            "1",
            "--",
            sys.executable,
            "-c",
            server,
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()):
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    return proc, int(pidfile.read_text())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # clean up what the test started, then fail
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_server_ends_with_the_launcher(tmp_path, how):
    proc, server = _launch(tmp_path)
    os.kill(proc.pid, how)
    proc.wait(timeout=30)
    assert _gone_within(server, 15), f"server outlived a launcher ended by {how.name}"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_server_that_ignores_sigterm_still_ends_with_the_launcher(tmp_path, how):
    """A vLLM server still starting up was seen to outlive its SIGKILLed launcher (the
    kernel's SIGTERM came to nothing): the launcher's watchdog ends the group, SIGKILL
    after the grace period."""
    proc, server = _launch(tmp_path, ignore_sigterm=True)
    os.kill(proc.pid, how)
    proc.wait(timeout=30)
    assert _gone_within(server, 15), f"server outlived a launcher ended by {how.name}"
