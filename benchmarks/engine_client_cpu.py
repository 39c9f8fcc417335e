"""The engine client's own CPU per request: aiohttp against rmgate's HTTP/1.1 client, side by
side in one run.

One variable: the client. Both post the same bodies to the same canned engine (a separate
uvicorn process answering vLLM's bytes at once, or after ``--engine-delay-ms``; its CPU is
not counted) at the same concurrency, on a uvloop loop as in an ingress replica; this
process's CPU time (``time.process_time``) per request is the client's cost plus the load
loop's, which is the same for both. Rounds interleave; the least of the rounds is reported.

    .venv/bin/python -m benchmarks.engine_client_cpu [--requests 4000] [--rounds 3]
        [--concurrency 32] [--answer small|gpu] [--engine-delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import urllib.request
from pathlib import Path

import aiohttp
import uvloop

from benchmarks.ingress_stack import REPO, bodies_of, canned_engine, report
from gateway.core.routing.engine_access import EngineClient, SlotInfo
from gateway.transport.http1_client import Http1EngineClient


class AiohttpEngineClient:
    """The anchor: the same calls through aiohttp as the ingress made them before
    (keep-alive pool without a limit, no cookie jar, no decompression)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(
        self, target: SlotInfo, path: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        async with self._session.post(
            target.url + path,
            data=body,
            headers=target.headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            return resp.status, await resp.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


CLIENTS = {"aiohttp": AiohttpEngineClient, "rmgate_http1": Http1EngineClient}


async def run(
    client: EngineClient, url: str, path: str, bodies: list[bytes], n: int, concurrency: int
) -> tuple[float, float]:
    """(CPU ms per request, requests per second)."""
    target = SlotInfo(
        model="m",
        slot=0,
        url=url,
        fingerprint=None,
        mode="batch_invariant",
        max_inflight=concurrency,
        secret="canned",
    )
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < n:
            body = bodies[sent % len(bodies)]
            sent += 1
            status, _ = await client.post(target, path, body, 30.0)
            if status != 200:
                raise RuntimeError(f"{path}: {status}")

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (1000 * (time.process_time() - cpu) / n, n / (time.perf_counter() - wall))


def wait_until_up(url: str, timeout_s: float = 30.0) -> None:
    """Until the canned engine answers (its process starts in about a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def measure(url: str, requests: int, rounds: int, concurrency: int) -> dict:
    out: dict = {}
    for name, path in (("classify", "/classify"), ("chat", "/v1/chat/completions")):
        bodies = bodies_of(name, {}, "bench")
        clients = {k: make() for k, make in CLIENTS.items()}
        for client in clients.values():
            await run(client, url, path, bodies, 500, concurrency)  # warm: connections made
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in clients}
        for _ in range(rounds):
            for key, client in clients.items():
                runs[key].append(await run(client, url, path, bodies, requests, concurrency))
        for client in clients.values():
            await client.aclose()
        best = {k: min(v) for k, v in runs.items()}
        out[name] = {
            k: {
                "cpu_ms": round(ms, 4),
                "req_per_s": round(rps, 1),
                "over_aiohttp": round(ms / best["aiohttp"][0], 2),
            }
            for k, (ms, rps) in best.items()
        }
        out[name]["rounds"] = runs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--answer", choices=("small", "gpu"), default="gpu")
    ap.add_argument("--engine-delay-ms", type=float, default=0.0)
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "engine_client_cpu.json"
    )
    args = ap.parse_args()
    from deployments.engine.process import free_port

    port = free_port()
    with canned_engine(port, args.answer, args.engine_delay_ms):
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url)
        result = uvloop.run(measure(url, args.requests, args.rounds, args.concurrency))
    result = {
        "requests": args.requests,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "answer": args.answer,
        "engine_delay_ms": args.engine_delay_ms,
        "clients": result,
    }
    report(
        args.out,
        result,
        result["clients"],
        list(CLIENTS),
        [
            ("CPU ms/req", "cpu_ms", ".4f"),
            ("x aiohttp", "over_aiohttp", ".2f"),
            ("req/s", "req_per_s", ".1f"),
        ],
    )


if __name__ == "__main__":
    main()
