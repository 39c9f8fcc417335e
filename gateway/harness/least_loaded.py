"""The baseline rmgate is measured against: a least-loaded FastAPI + httpx proxy.

What trainers run today (e.g. verl's reward-model router): every request goes to the
backend with the fewest requests in flight, so concurrent requests are batched by
whichever engine is least busy. Fast and simple, but a request's batch (and on platforms
with batch variance, its bits) depends on what else is in flight. No keying, no seeds.

    python -m gateway.harness.least_loaded --backends http://127.0.0.1:8001,... --port 9000

``start_proxy`` starts it that way, in a process group of its own, and waits until it answers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from deployments.engine.process import free_port
from gateway.harness.processes import engine_headers_for
from gateway.harness.running import REPO


def create_app(backends: list[str]) -> FastAPI:
    app = FastAPI()
    inflight = {b: 0 for b in backends}
    # an rmgate engine answers only its secret's bearer (read from its launcher, as the
    # user who started it); a plain vLLM server needs nothing
    secrets = engine_headers_for(backends)
    headers = {b: {"content-type": "application/json", **secrets.get(b, {})} for b in backends}
    # Idle connections expire before the engines' own keep-alive (uvicorn, 5 s) closes
    # them: at httpx's default of 5 s a request could go out on a connection the engine was
    # closing at that instant, a RemoteProtocolError the proxy would answer with a bare 500.
    client = httpx.AsyncClient(
        timeout=600,
        limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0
        ),
    )

    @app.post("/{path:path}")
    async def forward(path: str, request: Request) -> Response:
        backend = min(backends, key=lambda b: inflight[b])  # least loaded, first on ties
        inflight[backend] += 1
        try:
            resp = await client.post(
                f"{backend}/{path}", content=await request.body(), headers=headers[backend]
            )
        except httpx.HTTPError as exc:  # say what failed instead of a bare 500
            return JSONResponse({"error": f"{backend}: {type(exc).__name__}: {exc}"}, 502)
        finally:
            inflight[backend] -= 1
        return Response(resp.content, resp.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def start_proxy(
    backends: list[str], logdir: Path, niceness: int = 0
) -> tuple[subprocess.Popen, str]:
    """The least-loaded baseline proxy over ``backends``, at ``niceness`` (Ray starts every
    worker, so rmgate's HAProxy, ingress and engines, at ``RAY_worker_niceness``, 15 by
    default: on a saturated host a proxy left at 0 gets ~28x their CPU weight, see
    :func:`gateway.harness.slowdowns.ray_worker_niceness`)."""
    port = free_port()
    with open(logdir / f"proxy-{port}.log", "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.harness.least_loaded",
                "--backends",
                ",".join(backends),
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
        )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("baseline proxy did not start")


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", required=True, help="comma-separated engine base URLs")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    args = ap.parse_args()
    uvicorn.run(
        create_app(args.backends.split(",")),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
