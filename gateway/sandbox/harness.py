"""The program that runs inside the sandbox: one submission's tests, each in a process of
its own under resource limits, and one JSON verdict per test on stdout.

It is run as ``python3 -I -c <this file's text>`` by the sandbox's interpreter (the
system's Python, not the gateway's), so it uses the standard library only and imports
nothing of rmgate. The gateway imports it too, for ``outputs_match`` and ``classify``:
a remote sandbox's answers are judged by the same code as the local one's.

Why one sandbox per submission and a process per test: starting a sandbox (namespaces,
mounts) costs more than starting Python, and a test must not see the previous test's
processes: after each test every other process in the sandbox's PID namespace is killed
(``kill(-1)``, which spares only this program and the namespace's init). This program
makes itself non-dumpable, so the code under test (same user) can neither ptrace it nor
open its ``/proc`` files to forge a verdict.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

#: What a test can end as.
OUTCOMES = (
    "passed",
    "failed",
    "timeout",
    "runtime_error",
    "memory_limit",
    "output_limit",
    "skipped",
)

#: The tests' environment: fixed, so a hash or a locale cannot vary between runs.
TEST_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}


def outputs_match(actual: str, expected: str, how: str) -> bool:
    """Whether a test's stdout is its expected output: ``lines`` (each line without
    trailing whitespace, trailing empty lines ignored), ``tokens`` (whitespace-separated
    words), ``exact``."""
    if how == "exact":
        return actual == expected
    if how == "tokens":
        return actual.split() == expected.split()
    a = [line.rstrip() for line in actual.splitlines()]
    b = [line.rstrip() for line in expected.splitlines()]
    while a and not a[-1]:
        a.pop()
    while b and not b[-1]:
        b.pop()
    return a == b


def classify(
    *,
    timed_out: bool,
    cpu_out: bool = False,
    returncode: int,
    stdout: str,
    stderr_tail: str,
    output_over: bool,
    expected: str | None,
    compare: str,
) -> str:
    """A finished test's outcome from what its process left (the same rules for every
    backend). ``timed_out``: killed at its wall limit; ``cpu_out``: it used its whole CPU
    limit (then the kernel's SIGKILL at the hard limit is a timeout, any other SIGKILL,
    such as the out-of-memory killer's, a runtime error)."""
    if timed_out or returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and cpu_out):
        return "timeout"
    if output_over or returncode == -signal.SIGXFSZ:
        return "output_limit"
    if returncode != 0:
        if "MemoryError" in stderr_tail:
            return "memory_limit"
        if expected is None and "AssertionError" in stderr_tail:
            return "failed"
        return "runtime_error"
    if expected is None:  # assert-style: finishing is passing
        return "passed"
    return "passed" if outputs_match(stdout, expected, compare) else "failed"


def _limit(limits: dict[str, Any]) -> None:
    """The test process's limits (run in it before its program starts)."""
    cpu = int(limits["cpu_s"])  # whole seconds, as RLIMIT_CPU counts them
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["output_bytes"], limits["output_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(10)  # the gateway and its engines first


def _end_the_rest() -> None:
    """Kill every process of the sandbox but this one and its init (a test's leftovers:
    a fork bomb, a daemon), until none is left."""
    me = os.getpid()
    for _ in range(200):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        while True:  # reap this program's own children
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        alive = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me):
                continue
            try:
                with open(f"/proc/{name}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                alive = True
        if not alive:
            return
        time.sleep(0.001)


def _tail(path: str, size: int = 4096) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - size))
        return f.read().decode("utf-8", "replace")


def run_test(index: int, spec: dict[str, Any], test: dict[str, Any]) -> dict[str, Any]:
    """One test in a fresh directory: the code (and, assert-style, the test code after
    it) as ``main.py``, the input on stdin, stdout and stderr to files capped by
    ``RLIMIT_FSIZE``."""
    limits = spec["limits"]
    here = f"/tmp/t{index}"
    os.mkdir(here)
    expected = test.get("output")
    source = spec["code"] if expected is not None else spec["code"] + "\n\n" + test["code"]
    with open(f"{here}/main.py", "w", encoding="utf-8") as f:
        f.write(source)
    with open(f"{here}/stdin", "w", encoding="utf-8") as f:
        f.write(test.get("input") or "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    timed_out = False
    with (
        open(f"{here}/stdin", "rb") as stdin,
        open(f"{here}/stdout", "wb") as stdout,
        open(f"{here}/stderr", "wb") as stderr,
    ):
        proc = subprocess.Popen(
            [sys.executable, "-s", "-B", "main.py"],
            cwd=here,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=TEST_ENV,
            preexec_fn=lambda: _limit(limits),
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=limits["wall_s"])
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    _end_the_rest()
    cap = limits["output_bytes"]
    over = any(os.path.getsize(f"{here}/{name}") >= cap for name in ("stdout", "stderr"))
    with open(f"{here}/stdout", "rb") as f:
        out = f.read(cap).decode("utf-8", "replace")
    err = _tail(f"{here}/stderr")
    outcome = classify(
        timed_out=timed_out,
        cpu_out=cpu >= limits["cpu_s"],
        returncode=returncode,
        stdout=out,
        stderr_tail=err,
        output_over=over,
        expected=expected,
        compare=spec["compare"],
    )
    share = limits["near_limit"]
    verdict: dict[str, Any] = {
        "outcome": outcome,
        "near_limit": outcome == "timeout"
        or cpu > share * limits["cpu_s"]
        or wall > share * limits["wall_s"],
    }
    if outcome in ("runtime_error", "memory_limit"):
        verdict["error"] = (err.strip().splitlines() or [f"exit status {returncode}"])[-1][:200]
    if spec.get("raw"):  # what ran, as Sandbox Fusion's /run_code reports it
        verdict.update(
            stdout=out, stderr=err, returncode=returncode, timed_out=timed_out, wall=wall
        )
    return verdict


def main() -> None:
    """Read ``{code, tests, limits, compare, stop_on_failure}`` from stdin, write
    ``{"tests": [verdict, ...]}`` to stdout."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, no /proc
    except (OSError, AttributeError):
        pass
    spec = json.loads(sys.stdin.read())
    verdicts: list[dict[str, Any]] = []
    stopped = False
    for index, test in enumerate(spec["tests"]):
        if stopped:
            verdicts.append({"outcome": "skipped", "near_limit": False})
            continue
        verdicts.append(run_test(index, spec, test))
        stopped = spec["stop_on_failure"] and verdicts[-1]["outcome"] != "passed"
    sys.stdout.write(json.dumps({"tests": verdicts}))


if __name__ == "__main__":
    main()
