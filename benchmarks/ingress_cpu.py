"""CPU per request of the ingress's own work, against a bare pass-through, in one process.

The gateway's ASGI app (``gateway.http.app.create_app`` around ``RewardService``) is driven
directly (no client, no socket: a prebuilt ASGI scope) over a transport that answers at no
cost (``gateway.harness.canned_engine``), so what is measured is the ingress's own work per
request: parsing and validating the body, canonical JSON and the key, placement, seeds, the
answer's checks and headers, metrics. The anchor, in the same run and through the same
driver: a bare Starlette route that reads the body and returns the same canned answer.
Rounds are interleaved; the least CPU time (``time.process_time``) per request of the
rounds.

    .venv/bin/python -m benchmarks.ingress_cpu [--requests 2000] [--rounds 5] [--profile classify]

``--tracing`` also measures the same app with OpenTelemetry tracing on, in the same
interleaved rounds (``traced_ms``, ``tracing_overhead``: traced over untraced, minus 1):
every request then carries a trainer's ``traceparent`` (in every app's rounds), and its
spans are exported over OTLP/HTTP to a receiver in another process
(``gateway.harness.otlp_receiver``), the export flushed inside each traced round, so the
round's CPU includes making, batching, serializing and posting the spans. Without the flag
nothing is configured: the gateway runs as an ingress does by default (tracing off).

``tests/unit/test_ingress_cpu.py`` runs a short version in the suite and holds the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.harness.canned_engine import CHAT, CLASSIFY, CannedTransport
from gateway.http.app import create_app
from gateway.http.hot_path import HotPath
from gateway.observability import tracing

ASGIApp = Callable[..., Awaitable[None]]

CONFIG = {
    "models": [
        {"name": "rm", "kind": "discriminative", "model_path": "/m/rm", "replicas": 4},
        {
            "name": "judge",
            "kind": "generative",
            "model_path": "/m/judge",
            "replicas": 4,
            "sampling_defaults": {"temperature": 1.0, "max_tokens": 16},
        },
    ],
    "gateway": {"ledger": {"backend": "off"}, "cache": "off", "default_reward_model": "rm"},
}

#: (name, path, body): one request of each kind a trainer sends most.
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "classify",
        "/classify",
        {
            "model": "rm",
            "input": "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n7<|im_end|>",
            "use_activation": False,
        },
    ),
    (
        "chat",
        "/v1/chat/completions",
        {
            "model": "judge",
            "messages": [{"role": "user", "content": "Is 3+4=7 right?"}],
            "max_tokens": 8,
        },
    ),
    ("rewards", "/v1/rewards", {"model": "rm", "items": [{"prompt": "3+4=", "response": "7"}]}),
]
#: What a tracing trainer sends with each request (``--tracing``).
TRACEPARENT = (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def gateway_app(hot_path: bool = True) -> ASGIApp:
    """The app as the ingress replica serves it (``gateway.serve.app``: the hot path in
    front of FastAPI); ``hot_path=False``: FastAPI alone, the anchor that shows what the hot
    path saves."""
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), CannedTransport()))
    return HotPath(app) if hot_path else app


def bare_app() -> ASGIApp:
    """The anchor: read the body, answer the canned bytes (what any proxy must do)."""

    async def answer(request: Request) -> Response:
        await request.body()
        return Response(
            CHAT if request.url.path.endswith("completions") else CLASSIFY,
            media_type="application/json",
        )

    return Starlette(routes=[Route(p, answer, methods=["POST"]) for _, p, _ in REQUESTS])


async def post(
    app: ASGIApp, path: str, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> int:
    """One request straight into the ASGI app (``headers`` added to its own); its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    delivered = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def cpu_ms_per_request(
    app: ASGIApp,
    path: str,
    body: bytes,
    n: int,
    concurrency: int,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    traced: bool = False,
) -> float:
    """CPU milliseconds per request over ``n`` requests, ``concurrency`` at a time;
    ``traced``: with tracing on, its spans exported before the clock stops."""
    tracing.set_enabled(traced)
    start = time.process_time()
    try:
        for i in range(0, n, concurrency):
            statuses = await asyncio.gather(
                *(post(app, path, body, headers) for _ in range(min(concurrency, n - i)))
            )
            assert set(statuses) == {200}, statuses
        if traced:
            assert tracing.flush(60.0), "the spans were not exported within 60 s"
        return (time.process_time() - start) * 1000 / n
    finally:
        tracing.set_enabled(False)


async def measure(
    requests: int = 2000,
    rounds: int = 5,
    concurrency: int = 32,
    names: tuple[str, ...] = ("classify", "chat", "rewards"),
    hot_path: bool = True,
    with_fastapi: bool = False,
    with_tracing: bool = False,
) -> dict[str, Any]:
    """Per request: the gateway's CPU ms, the bare route's, their ratio; ``with_fastapi``
    also measures the app without the hot path in the same rounds (``fastapi_ratio``);
    ``with_tracing`` the gateway with tracing on (``traced_ms``, ``tracing_overhead``;
    tracing configured by the caller: ``main`` does)."""
    apps = {"gateway": gateway_app(hot_path), "bare": bare_app()}
    if with_fastapi:
        apps["fastapi"] = gateway_app(hot_path=False)
    if with_tracing:
        apps["traced"] = apps["gateway"]  # the same app; only tracing differs
    headers = (TRACEPARENT,) if with_tracing else ()
    out: dict[str, Any] = {}
    for name, path, obj in REQUESTS:
        if name not in names:
            continue
        body = json.dumps(obj).encode()
        for key, app in apps.items():  # warm: imports, caches, first-call paths
            await cpu_ms_per_request(app, path, body, 200, concurrency, headers, key == "traced")
        runs: dict[str, list[float]] = {k: [] for k in apps}
        for _ in range(rounds):
            for key, app in apps.items():
                runs[key].append(
                    await cpu_ms_per_request(
                        app, path, body, requests, concurrency, headers, key == "traced"
                    )
                )
        # the least of the rounds: CPU time only grows with interference (GC, other
        # processes), so the minimum is the steadiest estimate of the work itself
        med = {k: min(v) for k, v in runs.items()}
        out[name] = {
            "gateway_ms": round(med["gateway"], 4),
            "bare_ms": round(med["bare"], 4),
            "ratio": round(med["gateway"] / med["bare"], 2),
            **({"fastapi_ratio": round(med["fastapi"] / med["bare"], 2)} if with_fastapi else {}),
            **(
                {
                    "traced_ms": round(med["traced"], 4),
                    "tracing_overhead": round(med["traced"] / med["gateway"] - 1, 3),
                }
                if with_tracing
                else {}
            ),
            "rounds": {k: [round(x, 4) for x in v] for k, v in runs.items()},
        }
    return out


def profile(name: str, requests: int) -> None:
    path, obj = next((p, o) for n, p, o in REQUESTS if n == name)
    app, body = gateway_app(), json.dumps(obj).encode()
    asyncio.run(cpu_ms_per_request(app, path, body, 200, 32))
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(cpu_ms_per_request(app, path, body, requests, 32))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


@contextlib.contextmanager
def traced_to_a_receiver() -> Iterator[None]:
    """Tracing configured (off until a traced round turns it on), exporting to an OTLP
    receiver in its own process (its CPU is not the measured one's); a queue large enough
    that no span of a round is dropped (a dropped span costs less than an exported one)."""
    receiver = subprocess.Popen(
        [sys.executable, "-m", "gateway.harness.otlp_receiver", "--every-s", "3600"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert receiver.stdout is not None
        endpoint = receiver.stdout.readline().strip()
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "rmgate-bench",
        }
        os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", "262144")
        assert tracing.configure(env), endpoint
        tracing.set_enabled(False)
        yield
    finally:
        tracing.shutdown()
        receiver.terminate()
        receiver.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--profile", choices=[n for n, _, _ in REQUESTS])
    ap.add_argument("--out", type=Path, help="also write the result (every round) here as JSON")
    ap.add_argument(
        "--fastapi-only", action="store_true", help="the app without the hot path in front"
    )
    ap.add_argument(
        "--tracing",
        action="store_true",
        help="also the app with OpenTelemetry tracing on (OTLP/HTTP to a receiver process)",
    )
    args = ap.parse_args()
    if args.profile:
        profile(args.profile, args.requests)
        return
    hot_path = not args.fastapi_only
    with traced_to_a_receiver() if args.tracing else contextlib.nullcontext():
        result = asyncio.run(
            measure(
                args.requests,
                args.rounds,
                args.concurrency,
                hot_path=hot_path,
                with_tracing=args.tracing,
            )
        )
    print(f"{'request':10} {'gateway ms':>11} {'bare ms':>8} {'ratio':>6}", end="")
    print(f" {'traced ms':>10} {'overhead':>9}" if args.tracing else "")
    for name, r in result.items():
        print(f"{name:10} {r['gateway_ms']:11.3f} {r['bare_ms']:8.3f} {r['ratio']:6.2f}", end="")
        print(f" {r['traced_ms']:10.3f} {r['tracing_overhead']:9.1%}" if args.tracing else "")
    print(json.dumps(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "requests": args.requests,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "hot_path": hot_path,
            "tracing": args.tracing,
        }
        args.out.write_text(json.dumps({**meta, "requests_measured": result}, indent=2))


if __name__ == "__main__":
    main()
