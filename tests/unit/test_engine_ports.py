"""Engine ports (deployments/engine/ports.py): a reserved port is never handed to another
``bind(0)`` while vLLM's own ``SO_REUSEADDR`` bind still succeeds beside it, the listener
check tells our engine's socket from another program's, and proxy ports are picked below
the ephemeral range. The negative control: without the reservation the same port does
come back from ``bind(0)``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployments.engine.ports import PortReservation, ephemeral_range, fixed_port, listener_is_ours

linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs /proc/net")


def _bind_zero_ports(n: int) -> set[int]:
    seen = set()
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            seen.add(s.getsockname()[1])
    return seen


def test_a_reserved_port_is_not_handed_out_and_vllms_bind_still_succeeds():
    with PortReservation() as r:
        assert r.port not in _bind_zero_ports(3000)
        # what vLLM's create_server_socket does (SO_REUSEADDR, then listen once ready)
        engine = socket.socket()
        engine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        engine.bind(("127.0.0.1", r.port))
        engine.listen()
        other = socket.socket()
        with pytest.raises(OSError):  # nobody else gets the port, reuse flag or not
            other.bind(("127.0.0.1", r.port))
        other.close()
    engine.close()


def test_without_a_reservation_bind_zero_gives_a_closed_port_again():
    """The negative control: a port found with bind(0) and closed comes back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lo, hi = ephemeral_range()
    for _ in range(20 * (hi - lo + 1)):  # bind(0) picks at random: missed with p < e^-20
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] == port:
                return
    pytest.fail(f"port {port} never came back from bind(0)")


@linux_only
def test_the_listener_check_tells_our_engine_from_another_program():
    r = PortReservation()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys,time\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {r.port})); s.listen(); print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"up"
        r.release()
        assert listener_is_ours(r.port, server.pid) is True
        assert listener_is_ours(r.port, os.getpgrp()) is False  # another group's socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            assert listener_is_ours(s.getsockname()[1], server.pid) is None  # no listener
    finally:
        server.kill()
        server.wait()


def test_fixed_ports_are_below_the_ephemeral_range_and_free():
    lo, _ = ephemeral_range()
    for _ in range(20):
        port = fixed_port()
        assert port < lo
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))


def test_the_engine_start_fails_when_its_port_answers_from_another_program(tmp_path, monkeypatch):
    """EngineProcess: /health answers 200 on its port, but from a server outside its
    process group: the start fails with the reason instead of serving that server."""
    from deployments.engine.args import EnginePlan
    from deployments.engine.process import EngineProcess, EngineStartError

    r = PortReservation()
    foreign = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import http.server,socketserver\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self): self.send_response(200); self.end_headers()\n"
            "    def log_message(self, *a): pass\n"
            "socketserver.TCPServer.allow_reuse_address = True\n"
            f"http.server.HTTPServer(('127.0.0.1', {r.port}), H).serve_forever()",
        ],
        start_new_session=True,
    )
    monkeypatch.setenv("RMGATE_LOG_DIR", str(tmp_path))
    plan = EnginePlan(args=[], env={}, mode="serialize", max_inflight=1)
    engine = EngineProcess(plan, "127.0.0.1", r.port, "foreign-test")
    # our "engine": a process that never listens (it sleeps), in its own group
    engine.proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and listener_is_ours(r.port, foreign.pid) is not True:
            time.sleep(0.1)
        r.release()
        if listener_is_ours(r.port, foreign.pid) is None:
            pytest.skip("this host does not show listeners in /proc/net")
        with pytest.raises(EngineStartError, match="not from this engine"):
            engine.wait_ready(20)
        assert not engine.alive()  # stopped, not left running
    finally:
        engine.stop(grace_s=1)
        foreign.kill()
        foreign.wait()
