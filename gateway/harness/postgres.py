"""A throwaway PostgreSQL server from the machine's own server binaries, for tests and
benchmarks of the ledger's PostgreSQL backend (never a mock).

``initdb`` into a fresh directory, ``pg_ctl start`` on a loopback port (trust auth, the
socket in that directory), ``stop``/``start`` to take it away under load and bring it back,
``destroy`` at the end. PostgreSQL refuses to run as root: as root the server runs as the
``postgres`` system user (``runuser``), which owns the directory. pytest-postgresql's
process fixture does the same but cannot switch users, so it cannot run where the suite
runs as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_pg_bin() -> Path | None:
    """The directory of ``pg_ctl`` and ``initdb``: ``$RMGATE_PG_BIN``, else PATH, else the
    newest ``/usr/lib/postgresql/*/bin`` (Debian's layout)."""
    explicit = os.environ.get("RMGATE_PG_BIN")
    if explicit:
        return Path(explicit)
    found = shutil.which("pg_ctl")
    if found and (Path(os.path.realpath(found)).parent / "initdb").exists():
        return Path(os.path.realpath(found)).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayPostgres:
    """One PostgreSQL server in a temporary directory, on 127.0.0.1."""

    def __init__(self, bin_dir: Path | None = None, base: Path | None = None) -> None:
        # ``base`` must be reachable by the postgres user when running as root
        found = bin_dir or find_pg_bin()
        if found is None:
            raise FileNotFoundError(
                "no PostgreSQL server binaries (pg_ctl, initdb) found; set "
                "RMGATE_PG_BIN to their directory"
            )
        self.bin = found
        self.dir = Path(tempfile.mkdtemp(prefix="rmgate-pg-", dir=base))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.as_user = "postgres" if os.geteuid() == 0 else None
        if self.as_user:
            entry = pwd.getpwnam(self.as_user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "rmgate", "--no-sync", "-E", "UTF8"
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://rmgate@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        # none of the caller's RMGATE_* variables: the server is not one of the processes
        # a gateway started (tests find those by a marker in their environment)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RMGATE_")}
        done = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.dir, env=env
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}): "
                f"{done.stdout.decode(errors='replace')[-2000:]}"
            )

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c full_page_writes=off"
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-o",
            options,
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        """Stop (immediately) and remove everything."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
