"""A load generator that is not the bottleneck: several processes, each an aiohttp event loop.

``LoadGen(procs=4)`` starts the worker processes once (spawn); ``run()`` splits a request
list over them (request ``order[k::p]`` to worker ``k``, the concurrency split as evenly as
it goes), starts them at one wall-clock instant, and merges what they measured:

* throughput: requests / (last answer - first send), over all workers;
* p50 / p99 latency;
* a digest of each answer (``gateway.core.api.answers.answer_of``, canonical JSON): two runs
  are bitwise the same where their digests are;
* the load generator's own CPU per request (``time.process_time`` of every worker), so a
  reader can see that it is not what limits the rate;
* generated tokens (``usage.completion_tokens``) for chat requests.

``legacy_httpx()`` is the client of the old ``bench_gpu.py`` (one process, one
``httpx.AsyncClient``, answers compared in the same loop), kept to measure what it cost.

Bodies are serialised once, before the clock starts. Request ``i`` goes to
``urls[i % len(urls)]`` (client-side round robin when a path is several engines).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from gateway.harness.processes import engine_headers_for

Call = tuple[str, dict[str, Any]]


def digest(path: str, payload: dict[str, Any]) -> str:
    from gateway.core.api.answers import answer_of

    return hashlib.sha1(answer_of(path, payload).canonical.encode()).hexdigest()[:16]


async def _shard(
    urls: list[str],
    items: list[tuple[int, str, bytes]],
    concurrency: int,
    start_at: float,
    timeout_s: float,
) -> dict[str, Any]:
    import aiohttp

    answers: dict[int, str] = {}
    lat: list[float] = []
    errors: list[str] = []
    slots: dict[str, int] = {}  # rmgate's x-rmgate-slot per answered request
    tokens = 0
    first = last = None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    conn = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, force_close=False)
    # an rmgate engine reached directly (the anchor) wants its secret
    secrets = engine_headers_for(urls)
    headers = {u: {"content-type": "application/json", **secrets.get(u, {})} for u in urls}
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        queue = list(reversed(items))

        async def worker() -> None:
            nonlocal tokens, first, last
            while queue:
                i, path, body = queue.pop()
                base = urls[i % len(urls)]
                url = base + path
                t = time.time()
                first = t if first is None else min(first, t)
                try:
                    async with session.post(url, data=body, headers=headers[base]) as r:
                        raw = await r.read()
                        status = r.status
                        slot = r.headers.get("x-rmgate-slot", "-")
                except Exception as exc:  # noqa: BLE001 - counted, reported
                    errors.append(f"{url}: {type(exc).__name__}: {exc}"[:300])
                    continue
                done = time.time()
                last = done if last is None else max(last, done)
                if status != 200:
                    errors.append(f"{url}: {status} {raw[:200]!r}")
                    continue
                lat.append(done - t)
                slots[slot] = slots.get(slot, 0) + 1
                payload = json.loads(raw)
                try:
                    answers[i] = digest(path, payload)
                except ValueError as exc:
                    errors.append(f"{url}: bad answer {exc}"[:300])
                tokens += int((payload.get("usage") or {}).get("completion_tokens") or 0)

        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        cpu0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        cpu = time.process_time() - cpu0
    return {
        "answers": answers,
        "lat": lat,
        "errors": errors,
        "tokens": tokens,
        "first": first,
        "last": last,
        "cpu_s": cpu,
        "slots": slots,
    }


def _worker_main(conn) -> None:  # runs in each load-generator process
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    while True:
        msg = conn.recv()
        if msg is None:
            return
        try:
            conn.send(asyncio.run(_shard(*msg)))
        except Exception as exc:  # noqa: BLE001 - report to the parent
            conn.send({"fatal": f"{type(exc).__name__}: {exc}"})


class LoadGen:
    def __init__(self, procs: int = 4) -> None:
        ctx = mp.get_context("spawn")
        self.procs = []
        for _ in range(procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            p.start()
            self.procs.append((p, parent))

    def close(self) -> None:
        for p, conn in self.procs:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, _ in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> LoadGen:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(
        self,
        urls: list[str],
        calls: list[Call],
        concurrency: int,
        order: list[int] | None = None,
        timeout_s: float = 900.0,
        procs: int | None = None,
    ) -> dict[str, Any]:
        order = list(range(len(calls))) if order is None else order
        n = max(1, min(procs or len(self.procs), len(self.procs), concurrency, len(order)))
        shares = [concurrency // n + (1 if k < concurrency % n else 0) for k in range(n)]
        bodies = {i: json.dumps(calls[i][1]).encode() for i in order}
        start_at = time.time() + 0.3 + 0.002 * len(order) / n  # after every shard is unpickled
        for k in range(n):
            items = [(i, calls[i][0], bodies[i]) for i in order[k::n]]
            self.procs[k][1].send(
                ([u.rstrip("/") for u in urls], items, shares[k], start_at, timeout_s)
            )
        parts = [self.procs[k][1].recv() for k in range(n)]
        fatal = [p["fatal"] for p in parts if "fatal" in p]
        if fatal:
            raise RuntimeError(f"load generator failed: {fatal[0]}")
        return merge(parts, len(order), concurrency, n)


def merge(
    parts: list[dict[str, Any]], requested: int, concurrency: int, procs: int
) -> dict[str, Any]:
    answers: dict[int, str] = {}
    lat: list[float] = []
    errors: list[str] = []
    slots: dict[str, int] = {}
    for p in parts:
        answers.update(p["answers"])
        for slot, n in p.get("slots", {}).items():
            slots[slot] = slots.get(slot, 0) + n
        lat += p["lat"]
        errors += p["errors"]
    firsts = [p["first"] for p in parts if p["first"] is not None]
    lasts = [p["last"] for p in parts if p["last"] is not None]
    wall = (max(lasts) - min(firsts)) if firsts and lasts else float("nan")
    lat.sort()
    ok = len(answers)
    cpu = sum(p["cpu_s"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    return {
        "requests": requested,
        "ok": ok,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "concurrency": concurrency,
        "procs": procs,
        "seconds": round(wall, 3),
        "req_per_s": round(ok / wall, 2) if wall == wall and wall > 0 else 0.0,
        "gen_tok_per_s": round(tokens / wall, 1) if tokens and wall > 0 else None,
        "p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
        "loadgen_cpu_ms_per_req": round(1000 * cpu / max(ok, 1), 3),
        "slots": dict(sorted(slots.items())),
        "answers": answers,
    }


async def _legacy(
    url: str, calls: list[Call], concurrency: int, order: list[int]
) -> dict[str, Any]:
    """The old bench_gpu.py client: one httpx.AsyncClient, answers compared in-process."""
    import httpx

    from gateway.core.api.answers import answer_of

    sem = asyncio.Semaphore(concurrency)
    out: dict[int, str] = {}
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:

        async def one(i: int) -> None:
            path, body = calls[i]
            async with sem:
                r = await client.post(url + path, json=body)
            if r.status_code == 200:
                out[i] = answer_of(path, r.json()).canonical

        t = time.perf_counter()
        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in order))
        return {
            "seconds": time.perf_counter() - t,
            "cpu_s": time.process_time() - cpu0,
            "ok": len(out),
        }


def legacy_httpx(
    url: str, calls: list[Call], concurrency: int, order: list[int] | None = None
) -> dict[str, Any]:
    order = list(range(len(calls))) if order is None else order
    r = asyncio.run(_legacy(url, calls, concurrency, order))
    return {
        "requests": len(order),
        "ok": r["ok"],
        "concurrency": concurrency,
        "procs": 1,
        "seconds": round(r["seconds"], 3),
        "req_per_s": round(r["ok"] / r["seconds"], 2),
        "loadgen_cpu_ms_per_req": round(1000 * r["cpu_s"] / max(r["ok"], 1), 3),
    }


if __name__ == "__main__":  # self-check against a stub server: python -m benchmarks.gpu.loadgen
    import threading

    from aiohttp import web

    async def classify(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"data": [{"index": 0, "probs": [len(body["input"]) / 7.0]}]})

    def serve(port: int) -> None:
        app = web.Application()
        app.router.add_post("/classify", classify)
        web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)

    port = int(os.environ.get("PORT", "18777"))
    threading.Thread(target=serve, args=(port,), daemon=True).start()
    time.sleep(1.0)
    calls = [("/classify", {"model": "m", "input": "x" * (i % 50 + 1)}) for i in range(400)]
    with LoadGen(2) as lg:
        r = lg.run([f"http://127.0.0.1:{port}"], calls, 16)
        r2 = lg.run([f"http://127.0.0.1:{port}"], calls, 4, order=list(reversed(range(400))))
    same = sum(r["answers"][i] == r2["answers"][i] for i in range(400))
    print({k: v for k, v in r.items() if k != "answers"}, "same:", same)
    print(legacy_httpx(f"http://127.0.0.1:{port}", calls, 16))
