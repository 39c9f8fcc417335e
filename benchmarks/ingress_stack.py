"""The gateway's CPU per request through the whole serving stack, against a bare Serve
pass-through in the same run, on CPU.

What a request costs the gateway on a GPU host is everything between the trainer's socket
and the engine's: HAProxy, Serve's direct-ingress server (uvicorn) and replica wrapper, the
ingress app, the aiohttp call to the engine. This benchmark starts Ray Serve as
``rmgate serve`` does (HAProxy + direct ingress, the throughput preset) with two
applications in front of one canned engine (a separate process answering vLLM's bytes at
once; its CPU is not counted):

* ``/``: rmgate's ingress deployment itself (``gateway.serve.app.IngressReplica``), one replica,
  4 DisRM + 4 judge slots that all point at the canned engine (``CannedSlots`` stands in
  for the slot applications' handles), ledger and cache off;
* the same ingress replica on its own port (``gateway.direct_port``: Serve's proxy left out);
* ``/bare``: the anchor: a Serve deployment whose one FastAPI route reads the body, posts it
  to the same engine with aiohttp and returns the answer (what any gateway on Serve does).

Rounds interleave the two; each round sends ``--requests`` requests at concurrency 32 and
reads the CPU seconds of each process from /proc before and after: ms of CPU per request in
the replica, in HAProxy and in the rest of Ray. The least of the rounds is reported (CPU
time only grows with interference).

    .venv/bin/python -m benchmarks.ingress_stack [--requests 2000] [--rounds 3]
        [--replicas N] [--mix one|bench] [--only classify|chat] [--concurrency 32]
        [--answer small|gpu] [--engine-delay-ms 0]
        [--replica-profile SECONDS --profile-via serve|direct]   # py-spy on the replica

``--answer gpu`` makes the canned judge answer the GPU benchmark's (64 tokens with their
logprobs, 12 kB); ``--engine-delay-ms`` holds every answer, so that ``--concurrency``
requests are in flight at once, as on a GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import Response

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 32  # --concurrency

#: (name, path under the application, body)
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
            "seed": 1,
        },
    ),
]


# --- the canned engine (its own process) ------------------------------------------------


def run_engine(port: int, answer: str = "small", delay_ms: float = 0.0) -> None:
    """A vLLM stand-in: canned answers after ``delay_ms`` (at once by default), over
    uvicorn. ``answer``: ``small`` (a 4-token judge answer) or ``gpu`` (the GPU
    benchmark's: 64 tokens with their logprobs)."""
    import uvicorn

    from gateway.harness.canned_engine import CHAT, CLASSIFY, chat_with_logprobs

    chat = chat_with_logprobs() if answer == "gpu" else CHAT

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        body = (
            chat
            if scope["path"].endswith("completions")
            else (CLASSIFY if scope["path"] == "/classify" else b"{}")
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )  # uvloop and httptools where installed


@contextlib.contextmanager
def canned_engine(port: int, answer: str, delay_ms: float) -> Iterator[subprocess.Popen]:
    """The canned engine in its own process (its CPU is not the measured one's), ended on
    the way out."""
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.ingress_stack",
            "--engine",
            str(port),
            "--answer",
            answer,
            "--engine-delay-ms",
            str(delay_ms),
        ],
        cwd=REPO,
        start_new_session=True,
    )
    try:
        yield engine
    finally:
        engine.terminate()
        engine.wait(30)


def report(
    out: Path,
    result: dict[str, Any],
    rows: dict[str, dict[str, Any]],
    order: list[str],
    columns: list[tuple[str, str, str]],
) -> None:
    """Print ``rows[request][path]`` as a table, ``columns`` as (header, field, format),
    and write ``result`` to ``out``."""
    print(f"{'request':<10}{'path':<14}" + "".join(f"{h:>12}" for h, _, _ in columns))
    for name, by_path in rows.items():
        for key in order:
            print(
                f"{name:<10}{key:<14}"
                + "".join(f"{by_path[key][field]:>12{fmt}}" for _, field, fmt in columns)
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


# --- stand-ins for the slot applications' handles (pickled into the ingress) -----------


class _Method:
    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def remote(self) -> Any:
        async def answer() -> dict[str, Any]:
            return self.value

        return answer()


class _Slot:
    def __init__(self, url: str, slot: int) -> None:
        self.endpoint = _Method(
            {
                "url": url,
                "fingerprint": "canned",
                "mode": "batch_invariant",
                "max_inflight": 256,
                "slot": slot,
                "numerics": {"class_id": "canned"},
                "secret": "canned",
            }
        )


class CannedSlots(Mapping[str, Any]):
    """``handles[model][slot]`` whose ``endpoint`` names the canned engine."""

    def __init__(self, url: str, models: list[str]) -> None:
        self.url, self.models = url, models

    def __getitem__(self, model: str) -> Any:
        if model not in self.models:
            raise KeyError(model)
        url = self.url

        class _Model:
            def __getitem__(self, slot: int) -> _Slot:
                return _Slot(url, slot)

        return _Model()

    def __iter__(self) -> Iterator[str]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)


def gateway_config(direct_port: int) -> dict[str, Any]:
    return {
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
        "gateway": {
            "ledger": {"backend": "off"},
            "cache": "off",
            "canary_interval_s": 0,
            "default_reward_model": "rm",
            "direct_port": direct_port,
        },
    }


def bare_app(engine_url: str) -> Any:
    """The anchor deployment: read the body, post it to the engine, return the answer."""
    from ray import serve

    api = FastAPI()

    @serve.deployment(name="bare", max_ongoing_requests=8192, ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class Bare:
        def __init__(self) -> None:
            self.session: aiohttp.ClientSession | None = None

        @api.post("/{path:path}")
        async def forward(self, path: str, request: Request) -> Response:
            if self.session is None:
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
                )
            async with self.session.post(
                f"{engine_url}/{path}",
                data=await request.body(),
                headers={"content-type": "application/json"},
            ) as r:
                return Response(await r.read(), status_code=r.status, media_type="application/json")

    return Bare.bind()


# --- measuring -------------------------------------------------------------------------


def process_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds) for the gateway replica, the bare one, HAProxy, Ray."""
    from gateway.harness.cpu_accounting import cpu_seconds, stat_fields

    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            seconds = cpu_seconds(stat_fields(entry))
        except (OSError, IndexError):
            continue
        role = (
            "gateway_replica"
            if "ServeReplica:rmgate:gateway" in cmd
            else "bare_replica"
            if "ServeReplica:bare:" in cmd
            else "haproxy"
            if "haproxy" in cmd
            else "ray"
            if "ray" in cmd and "canned_engine" not in cmd
            else None
        )
        if role:
            out[int(entry.name)] = (role, seconds)
    return out


def per_request(before: dict, after: dict, n: int) -> dict[str, float]:
    total: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        total[role] = total.get(role, 0.0) + seconds - before.get(pid, (role, 0.0))[1]
    return {k: round(1000 * v / n, 3) for k, v in total.items()}


async def load(url: str, bodies: list[bytes], n: int, concurrency: int = CONCURRENCY) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sent = 0

        async def worker() -> None:
            nonlocal sent
            while sent < n:
                body = bodies[sent % len(bodies)]
                sent += 1
                async with session.post(
                    url, data=body, headers={"content-type": "application/json"}
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {await r.text()}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


#: target -> (the process role whose CPU is its cost, the URL prefix it is reached at)
def targets(base: str, direct: str) -> dict[str, tuple[str, str]]:
    return {
        "gateway": ("gateway_replica", base),
        "direct": ("gateway_replica", direct),
        "bare": ("bare_replica", base + "/bare"),
    }


def bodies_of(name: str, obj: dict[str, Any], mix: str) -> list[bytes]:
    """The one request of ``REQUESTS`` (``--mix one``), or 1,000 different ones of the GPU
    benchmark's length mix (``--mix bench``: DisRM inputs of 1-900 characters, judge
    prompts with logprobs), as trainers send them."""
    if mix == "one":
        return [json.dumps(obj).encode()]
    from benchmarks.gpu.bench_paths import grm_body, rm_body

    make = (
        (lambda i: rm_body("rm", i)) if name == "classify" else (lambda i: grm_body("judge", i, 64))
    )
    return [json.dumps(make(i)).encode() for i in range(1000)]


def measure(
    base: str,
    direct: str,
    requests: int,
    rounds: int,
    mix: str = "one",
    concurrency: int = CONCURRENCY,
    only: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path, obj in REQUESTS:
        if only and name != only:
            continue
        body = bodies_of(name, obj, mix)
        paths = targets(base, direct)
        for _, prefix in paths.values():
            asyncio.run(load(prefix + path, body, 300, concurrency))  # warm
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in paths}
        for _ in range(rounds):
            for key, (_, prefix) in paths.items():
                before = process_cpu()
                start = time.perf_counter()
                asyncio.run(load(prefix + path, body, requests, concurrency))
                wall = time.perf_counter() - start
                row = per_request(before, process_cpu(), requests)
                row["req_per_s"] = round(requests / wall, 1)
                runs[key].append(row)
        row_out: dict[str, Any] = {}
        for key, (role, _) in paths.items():
            best = min(runs[key], key=lambda r, role=role: r.get(role, 0.0))
            row_out[key] = {
                "replica_ms": best.get(role, 0.0),
                "haproxy_ms": best.get("haproxy", 0.0),
                "total_ms": round(best.get(role, 0.0) + best.get("haproxy", 0.0), 3),
                "req_per_s": best["req_per_s"],
            }
        bare = row_out["bare"]["total_ms"]
        for key in row_out:
            row_out[key]["total_over_bare"] = round(row_out[key]["total_ms"] / bare, 2)
        out[name] = {**row_out, "rounds": runs}
    return out


def profile_replica(
    base: str,
    seconds: float,
    out: Path,
    mix: str = "one",
    concurrency: int = CONCURRENCY,
    only: str | None = None,
) -> None:
    """py-spy on the gateway replica while the classify load (or ``only``'s) runs at
    ``base`` (``--replica-profile``, ``--profile-via``)."""
    pid = next(p for p, (role, _) in process_cpu().items() if role == "gateway_replica")
    name, path, obj = next(r for r in REQUESTS if r[0] == (only or "classify"))
    bodies = bodies_of(name, obj, mix)
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = subprocess.Popen(
        [
            spy_bin,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ]
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        asyncio.run(load(base + path, bodies, 1000, concurrency))
    spy.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replica-profile", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--profile-via", choices=("serve", "direct"), default="direct")
    ap.add_argument("--replicas", type=int, default=1, help="ingress replicas")
    ap.add_argument(
        "--mix",
        choices=("one", "bench"),
        default="one",
        help="one request repeated, or the GPU benchmark's 1,000 (bodies_of)",
    )
    ap.add_argument("--concurrency", type=int, default=CONCURRENCY)
    ap.add_argument(
        "--answer",
        choices=("small", "gpu"),
        default="small",
        help="the canned judge answer: 4 tokens, or the GPU benchmark's 64 tokens with logprobs",
    )
    ap.add_argument(
        "--engine-delay-ms",
        type=float,
        default=0.0,
        help="the canned engine holds each answer this long (requests in flight)",
    )
    ap.add_argument("--only", choices=[name for name, _, _ in REQUESTS])
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "ingress_stack.json"
    )
    ap.add_argument("--engine", type=int, help=argparse.SUPPRESS)  # the canned engine's child
    args = ap.parse_args()
    if args.engine:
        run_engine(args.engine, args.answer, args.engine_delay_ms)
        return

    from deployments.engine.process import free_port
    from gateway.serve.proxy_mode import proxy_env

    # HAProxy's admin socket path must stay under 97 characters: short, as gateway/cli.py's
    workdir = Path(tempfile.gettempdir()) / f"rmgate-proxy-{os.getpid()}"
    os.environ.update(proxy_env("haproxy", workdir))  # before Ray starts Serve
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    engine_port, http_port, direct_port = free_port(), free_port(), free_port()
    import ray
    from ray import serve

    from gateway.serve.app import IngressReplica

    engine_url = f"http://127.0.0.1:{engine_port}"
    with canned_engine(engine_port, args.answer, args.engine_delay_ms):
        try:
            ray.init(
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                num_cpus=2,
                log_to_driver=False,
            )
            serve.start(http_options={"host": "127.0.0.1", "port": http_port})
            slots = CannedSlots(engine_url, ["rm", "judge"])
            serve.run(
                IngressReplica.options(num_replicas=args.replicas).bind(
                    gateway_config(direct_port), slots
                ),
                name="rmgate",
                route_prefix="/",
            )
            serve.run(bare_app(engine_url), name="bare", route_prefix="/bare")
            base = f"http://127.0.0.1:{http_port}"
            if args.replica_profile:
                via = base if args.profile_via == "serve" else f"http://127.0.0.1:{direct_port}"
                profile_replica(
                    via,
                    args.replica_profile,
                    workdir / "replica.txt",
                    args.mix,
                    args.concurrency,
                    args.only,
                )
                print(f"py-spy (raw stacks): {workdir / 'replica.txt'}")
                from benchmarks.gpu.profile_ingress import fold  # the GPU profile's buckets

                profile = fold(workdir / "replica.txt")
                print(json.dumps(profile["busy_shares"]))
            result = {
                "profile": profile if args.replica_profile else None,
                "requests": args.requests,
                "rounds": args.rounds,
                "concurrency": args.concurrency,
                "replicas": args.replicas,
                "mix": args.mix,
                "answer": args.answer,
                "engine_delay_ms": args.engine_delay_ms,
                "paths": measure(
                    base,
                    f"http://127.0.0.1:{direct_port}",
                    args.requests,
                    args.rounds,
                    args.mix,
                    args.concurrency,
                    args.only,
                ),
            }
        finally:
            serve.shutdown()
            ray.shutdown()
    report(
        args.out,
        result,
        result["paths"],
        ["gateway", "direct", "bare"],
        [
            ("replica ms", "replica_ms", ".3f"),
            ("haproxy ms", "haproxy_ms", ".3f"),
            ("total ms", "total_ms", ".3f"),
            ("x bare", "total_over_bare", ".2f"),
            ("req/s", "req_per_s", ".1f"),
        ],
    )


if __name__ == "__main__":
    main()
