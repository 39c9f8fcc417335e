"""Ports for engines and proxies that no other process can be handed in the meantime.

Why: a port found with ``bind(0)`` and closed again is free at once, and the next
``bind(0)`` anywhere on the host may get it. Measured on the H200 (14 engines of one
gateway starting together): the judge's slot 1 and the classifier's slot 1 were both
given port 44547. vLLM binds its HTTP socket with ``SO_REUSEADDR`` when it starts and
listens only once its engine is up, so both binds succeeded; the judge's engine listened
first and answered the classifier slot's ``/health`` with 200 and its self-test with 404.
A slot must never take another engine's answers for its own.

So an engine's port is *reserved*: a socket bound with ``SO_REUSEADDR`` and never
listening holds it from the moment it is chosen until the engine answers on it. No
``bind(0)`` on the host is handed a bound port, and vLLM's own ``SO_REUSEADDR`` bind still
succeeds beside the reservation (Linux allows it while neither socket listens). Once the
engine answers, ``listener_is_ours`` checks that the socket listening on the port belongs
to the engine's own process group.

Ports that another program binds later (Serve's HAProxy stats and metrics ports, set
before Serve starts) cannot be held across that program's start; they are taken below the
kernel's ephemeral range (and above Ray's worker ports), where ``bind(0)`` and outgoing
connections never go.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

#: Ray's default worker ports are 10002-19999; the kernel's ephemeral range starts above.
FIXED_PORTS_FROM = 20000


class PortReservation:
    """A port held by a bound, non-listening ``SO_REUSEADDR`` socket until ``release``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.host = host
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ``bind(0)`` and outgoing connections (Linux's default else)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def fixed_port(host: str = "0.0.0.0", rng: random.Random | None = None) -> int:
    """A free port outside the ephemeral range, for a program that binds it later itself.
    Falls back to an ephemeral one where the host leaves no room below its range."""
    lo, _ = ephemeral_range()
    rng = rng or random.Random()
    if lo - FIXED_PORTS_FROM >= 100:
        for _ in range(200):
            port = rng.randrange(FIXED_PORTS_FROM, lo)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_table() -> dict[str, tuple[str, int]]:
    """Every TCP socket in LISTEN state on this host: inode -> (local address as /proc/net
    writes it, in hex; port), from /proc/net/tcp and tcp6 (empty where there is none)."""
    table: dict[str, tuple[str, int]] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A":  # LISTEN
                addr, port = f[1].rsplit(":", 1)
                table[f[9]] = (addr, int(port, 16))
    return table


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds (empty if it cannot be read)."""
    out: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def listener_is_ours(port: int, pgid: int) -> bool | None:
    """Whether the socket listening on ``port`` belongs to process group ``pgid``; None
    where this host cannot tell (no /proc, or no listener visible from here)."""
    if not Path("/proc/net/tcp").exists():
        return None
    listening = {inode for inode, (_, p) in listening_table().items() if p == port}
    if not listening:
        return None
    return any(socket_inodes(pid) & listening for pid in _group_members(pgid))
