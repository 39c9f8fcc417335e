"""Where the CPU goes: CPU seconds by component, read from /proc, around a load run.

On a host whose cores the engines saturate, every CPU-millisecond a gateway spends per
request is taken from the engines, so CPU time per request is the gateway's real cost,
and it is far less noisy than throughput on a shared machine (it does not depend on what
else ran during the window, only on the work done for these requests).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
COMPONENTS = ("engines", "ingress", "http_proxy", "least_loaded_proxy", "slot_replicas", "ray")
#: Indices into :func:`stat_fields` (``man 5 proc``, fields 5, 14, 15, 19, 24 there).
PGRP, UTIME, STIME, NICE, RSS = 2, 11, 12, 16, 21


def stat_fields(pid_dir: Path) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces
    and parentheses), so ``[PGRP]`` is the process group; OSError if it is gone."""
    return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds from :func:`stat_fields`."""
    return (int(fields[UTIME]) + int(fields[STIME])) / TICKS


def component(cmdline: str) -> str | None:
    """Which part of the serving path a process is (by its command line / Ray's title)."""
    if "engine_launcher" in cmdline or "vllm" in cmdline.lower() or "EngineCore" in cmdline:
        return "engines"
    if "gateway.harness.least_loaded" in cmdline:
        return "least_loaded_proxy"
    if "ServeReplica:rmgate:" in cmdline:
        return "ingress"
    if "haproxy" in cmdline or "ProxyActor" in cmdline or "HAProxyManager" in cmdline:
        return "http_proxy"
    if "ServeReplica:" in cmdline:
        return "slot_replicas"
    if "ray" in cmdline:  # raylet, GCS, dashboard, Serve controller, idle workers
        return "ray"
    return None


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (component, CPU seconds so far) for every process that belongs to a part."""
    out: dict[int, tuple[str, float]] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = stat_fields(entry)
        except (OSError, IndexError):
            continue
        part = component(cmd)
        if part is not None:
            out[int(entry.name)] = (part, cpu_seconds(fields))
    return out


def cpu_ms_per_request(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], requests: int
) -> dict[str, float]:
    """CPU milliseconds per request by component between two snapshots."""
    total = dict.fromkeys(COMPONENTS, 0.0)
    for pid, (part, seconds) in after.items():
        total[part] += seconds - before.get(pid, (part, 0.0))[1]
    return {k: round(1000 * v / max(requests, 1), 2) for k, v in total.items()}


def host_jiffies() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole host so far, from ``/proc/stat``: whether the
    host itself is saturated during a window (busy cores = Δbusy / Δtotal × cores), which
    no per-process account shows (other tenants' work, kernel threads, softirqs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def host_cores_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Cores busy on average between two :func:`host_jiffies` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round((os.cpu_count() or 1) * busy / max(total, 1), 2)


def process_kind(comm: str, cmdline: str) -> str:
    """Which process of an engine's group this is: vLLM's API server (HTTP, tokenizing),
    its EngineCore (scheduler), its Worker (the model), or the launcher around them."""
    if comm.startswith("VLLM::Worker"):
        return "worker"
    if comm.startswith("VLLM::EngineCor"):
        return "engine_core"
    if "api_server" in cmdline or "vllm_server" in cmdline:
        return "api_server"
    return "launcher"


def group_cpu_by_kind(pgids: dict[str, int]) -> dict[str, dict[str, float]]:
    """CPU seconds so far of each named process group (an engine launcher leads its
    engine's group), split by :func:`process_kind`: which engine spent the CPU, and in
    which of its processes (an engine that answers less per CPU-second behind one path
    than another does its extra work somewhere)."""
    out: dict[str, dict[str, float]] = {name: {} for name in pgids}
    by_pgid = {v: k for k, v in pgids.items()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(entry)
            name = by_pgid.get(int(fields[PGRP]))
            if name is None:
                continue
            comm = (entry / "comm").read_text().strip()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        kind = process_kind(comm, cmd)
        out[name][kind] = out[name].get(kind, 0.0) + cpu_seconds(fields)
    return out


def group_cpu_s(pgids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process group, all its processes together."""
    return {name: sum(kinds.values()) for name, kinds in group_cpu_by_kind(pgids).items()}
