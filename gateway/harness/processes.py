"""Find the processes a local rmgate started and end them, by id.

The gateway runs in its own process group with a marker in its environment, so that
everything it starts (Ray, Serve replicas, engine launchers, vLLM) can be found and ended by
id: SIGINT first (the CLI shuts Serve and Ray down), then SIGKILL to the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from gateway.harness import cpu_accounting


def stop_process_group(proc: subprocess.Popen, grace_s: float = 120) -> None:
    """SIGINT (clean shutdown), wait, then SIGKILL whatever is left of the group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def processes_with_env(marker: str) -> list[int]:
    """Pids whose environment holds ``marker``: everything a gateway started inherits it."""
    needle = marker.encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _stat(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state first, then the
    parent's pid); None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running (gone and zombies left out)."""
    return [pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] not in "ZX"]


def descendants(roots: Iterable[int]) -> list[int]:
    """Every running process under ``roots`` (children, theirs, ...): what a process
    started, sandboxes included, whatever their environment."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(entry.name)) is not None:
            if stat[0] not in "ZX":
                children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pids: Iterable[int], command: bytes) -> list[int]:
    """Those of ``pids`` whose command line holds ``command``."""
    out = []
    for pid in pids:
        try:
            if command in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def vllm_servers(log_dir: Path | str) -> list[int]:
    """The vLLM server processes a gateway runs now (``RMGATE_LOG_DIR=log_dir`` is in the
    environment of everything it started): none once every slot sleeps."""
    return running(processes_with_env(f"RMGATE_LOG_DIR={log_dir}"), b"vllm_server")


def engine_port(engines: Path, slot_app: str) -> int:
    """The port of the newest engine of ``slot_app`` (``rm-1``), from its log's name
    (``<slot app>-<port>.log`` under the gateway's engine log folder): the live one, since a
    slot stops an engine before it starts the next."""
    newest = max(engines.glob(f"{slot_app}-*.log"), key=lambda p: p.stat().st_mtime)
    return int(newest.stem.rsplit("-", 1)[1])


def engine_launcher_pid(port: int | str) -> int:
    """The engine launcher (process-group leader) of the engine listening on ``port``; not
    its watchdog, a forked child with the same command line."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
                if (
                    b"deployments.engine.launcher" in cmd
                    and b"--port" in cmd
                    and cmd[cmd.index(b"--port") + 1] == str(port).encode()
                    and os.getpgid(int(entry.name)) == int(entry.name)
                ):
                    return int(entry.name)
            except OSError:
                continue
    raise LookupError(port)


def engine_secret_headers(port: int | str) -> dict[str, str]:
    """The ``Authorization`` header of the engine listening on ``port``, read from its
    launcher's environment (``RMGATE_ENGINE_SECRET``; only the user who started the
    gateway can read it): for benchmarks and tests that reach an engine directly, around
    the gateway, as its anchor. Every engine rmgate starts refuses a caller without it."""
    from deployments.engine.guard import SECRET_ENV
    from gateway.core.routing.engine_access import engine_auth

    environ = (Path("/proc") / str(engine_launcher_pid(port)) / "environ").read_bytes()
    prefix = SECRET_ENV.encode() + b"="
    secret = next(
        (e[len(prefix) :].decode() for e in environ.split(b"\0") if e.startswith(prefix)), None
    )
    if secret is None:
        raise LookupError(f"the engine on port {port} has no {SECRET_ENV}")
    return engine_auth(secret)


def engine_headers_for(urls: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{url: headers}`` for load sent to each of ``urls``: a local rmgate engine (found by
    its port) gets its secret; any other URL (a gateway, a plain vLLM server)
    ``x-rmgate-cache: off``, so that a benchmark's repeated requests measure the engines'
    path, not the ledger's answers (a plain vLLM server ignores the header)."""
    out = {}
    for url in urls:
        port = urlsplit(url).port
        try:
            out[url] = engine_secret_headers(port) if port is not None else dict(NO_CACHE)
        except (LookupError, OSError):
            out[url] = dict(NO_CACHE)
    return out


#: What benchmarks and checks send to a gateway to reach its engines on every request.
NO_CACHE = {"x-rmgate-cache": "off"}


def wait_until_gone(marker: str, timeout_s: float = 60.0) -> list[int]:
    """Processes still carrying ``marker`` after up to ``timeout_s``: engine launchers end
    their groups within ~10 s of their replica's death, so a shutdown is not instant."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_with_env(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def describe_processes(pids: Iterable[int]) -> list[str]:
    """``pid ppid command line`` of each, for a failure message."""
    out = []
    for pid in pids:
        try:
            cmd = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode("utf-8", "replace")[:200]
            )
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        out.append(f"{pid} (parent {ppid}): {cmd}")
    return out


def end_leftovers(marker: str, timeout_s: float = 60.0) -> list[int]:
    """``wait_until_gone``, then SIGKILL by pid whatever still carries ``marker`` (only
    processes this gateway started carry it): after a start-up that failed, engines
    re-parented to init are outside the CLI's process group. Returns what was left, so the
    caller can still fail on it."""
    left = wait_until_gone(marker, timeout_s)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def group_pids(pgids: list[int]) -> list[int]:
    """Every process of the given process groups (an engine: launcher, API server,
    EngineCore, workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pgid = int(cpu_accounting.stat_fields(entry)[cpu_accounting.PGRP])
            except (OSError, IndexError, ValueError):
                continue
            if pgid in pgids:
                out.append(int(entry.name))
    return out


def engine_requests_done(url: str, models: Iterable[str] | None = None) -> float:
    """Requests the engines of a local gateway at ``url`` finished (of ``models``, else
    all), by the engines' own count (vLLM's ``vllm:request_success_total``, read with each
    engine's secret): what a test or benchmark counts engine calls by, not the gateway."""
    return engine_metric_totals(url, ("vllm:request_success_total",), models)[
        "vllm:request_success_total"
    ]


def requests_done_besides_audits(url: str, models: Iterable[str], timeout_s: float = 60.0) -> float:
    """``engine_requests_done`` less the requests the gateway's continuous audit sent
    (``GET /v1/audit``: ``engine_calls``), read when no audit request is in flight and
    none finished while the engines were read (one ingress replica): the engine calls
    that callers' requests made."""
    import httpx

    wanted = list(models)
    deadline = time.monotonic() + timeout_s
    while True:
        before = httpx.get(url + "/v1/audit", timeout=30).json()
        done = engine_requests_done(url, wanted)
        after = httpx.get(url + "/v1/audit", timeout=30).json()
        calls = before.get("engine_calls", {})
        if before.get("in_flight", 0) == after.get("in_flight", 0) == 0 and calls == after.get(
            "engine_calls", {}
        ):
            return done - sum(calls.get(m, 0) for m in wanted)
        if time.monotonic() > deadline:
            raise TimeoutError("the audit did not hold still long enough to count")
        time.sleep(0.05)


def engine_metric_totals(
    url: str, names: Iterable[str], models: Iterable[str] | None = None
) -> dict[str, float]:
    """Each of the counters ``names`` (e.g. ``vllm:prompt_tokens_total``,
    ``vllm:prefix_cache_hits_total``), summed over the engines of a local gateway at
    ``url`` (of ``models``, else all), read from each engine with its secret."""
    import httpx

    wanted = None if models is None else set(models)
    totals = dict.fromkeys(names, 0.0)
    for card in httpx.get(url + "/v1/models", timeout=30).json()["data"]:
        if wanted is not None and card["id"] not in wanted:
            continue
        for where in card["nodes"]:
            argv = (Path("/proc") / str(where["engine_pid"]) / "cmdline").read_bytes()
            args = argv.decode().split("\0")
            port = args[args.index("--port") + 1]
            text = httpx.get(
                f"http://127.0.0.1:{port}/metrics", timeout=30, headers=engine_secret_headers(port)
            ).text
            for line in text.splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in totals:
                    totals[name] += float(line.rsplit(" ", 1)[1])
    return totals
