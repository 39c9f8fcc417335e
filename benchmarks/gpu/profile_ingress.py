"""Where one ingress process spends its CPU under DisRM load: py-spy on the real stack.

One ``rmgate serve`` of the 0.5B DisRM shape (4 batch-invariant slots, one ingress replica,
the defaults otherwise: ledger and cache on), loaded through the ingress's own port
(``--via direct``, as ``configs/gpu-small.yaml`` ships it) or Serve's at concurrency 256 with ``/classify``
requests of 1-900 characters by the multi-process load generator, while ``py-spy record``
samples the ingress replica's process (and its threads) for ``--seconds``. The stacks are
folded into shares of the samples by what they are in: Ray Serve's replica wrapper,
uvicorn, Starlette/FastAPI, rmgate (by module), aiohttp, JSON, Prometheus, the event loop,
the ledger, idle.

    python -m benchmarks.gpu.profile_ingress OUT [--seconds 15] [--via direct|serve]

Writes ``OUT/profile_ingress.json`` (the shares, the top self-time frames, the load's
req/s and gateway CPU per request) and ``OUT/profile_ingress.folded`` (py-spy's raw
stacks, for a flame graph).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu.bench_paths import gateway, log, rm_body
from benchmarks.gpu.loadgen import LoadGen
from benchmarks.gpu.models_gpu import build_in_child
from gateway.harness import cpu_accounting

#: (bucket, substrings of a frame "function (file:line)"), first match wins, innermost
#: rmgate/library frame decides the bucket of a sample.
BUCKETS = [
    ("ledger", ["gateway/ledger/", "sqlite3", "psycopg"]),
    ("rmgate core", ["gateway/core/"]),
    ("rmgate transport", ["gateway/transport/"]),
    ("rmgate http", ["gateway/http/"]),
    ("prometheus", ["prometheus_client"]),
    (
        "aiohttp client",
        [
            "aiohttp/client",
            "aiohttp/connector",
            "aiohttp/http_parser",
            "aiohttp/streams",
            "aiohttp/helpers",
        ],
    ),
    ("json", ["json/", "orjson"]),
    ("fastapi/starlette", ["fastapi/", "starlette/"]),
    ("uvicorn", ["uvicorn/", "httptools", "h11"]),
    ("ray serve", ["ray/serve/"]),
    ("ray core", ["ray/_private", "ray/_raylet", "ray/util"]),
    ("asyncio/uvloop", ["asyncio/", "uvloop"]),
]


def bucket_of(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost first
        for name, needles in BUCKETS:
            if any(n in frame for n in needles):
                return name
    return "other"


def fold(path: Path) -> dict[str, Any]:
    shares: collections.Counter[str] = collections.Counter()
    selfs: collections.Counter[str] = collections.Counter()
    idle = total = 0
    for line in path.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        stack = stack_text.split(";")
        total += n
        if any(
            s in stack[-1]
            for s in ("select", "epoll", "poll (", "wait (", "_wait_for_tstate", "acquire (")
        ):
            idle += n
            continue
        shares[bucket_of(stack)] += n
        selfs[stack[-1]] += n
    busy = max(total - idle, 1)
    return {
        "samples": total,
        "idle_share": round(idle / max(total, 1), 3),
        "busy_shares": {k: round(v / busy, 3) for k, v in shares.most_common()},
        "top_self_frames": [[f, round(v / busy, 3)] for f, v in selfs.most_common(25)],
    }


def ingress_pid() -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::ServeReplica:rmgate:gateway"):
                    return int(entry.name)
            except OSError:
                continue
    raise RuntimeError("no ingress replica process")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument(
        "--via",
        choices=("direct", "serve"),
        default="direct",
        help="load the ingress's own port (gateway.direct_port) or Serve's",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/profile-ingress")
    work.mkdir(exist_ok=True)
    build_in_child(work / "models", ["rm-0.5b"])
    engine = {
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 256,
        "attention_backend": "TRITON_ATTN",
        "kv_cache_memory_bytes": 2 << 30,
        "gpu_memory_utilization": 0.02,
    }
    cfg = {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {
                "name": "rmgate",
                "route_prefix": "/",
                "import_path": "gateway.serve.app:build_app",
                "args": {
                    "gateway": {"slot_wait_s": 300, "default_reward_model": "rm"},
                    "models": [
                        {
                            "name": "rm",
                            "kind": "discriminative",
                            "model_path": str(work / "models" / "rm-0.5b"),
                            "replicas": 4,
                            "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.2},
                            "engine_args": engine,
                        }
                    ],
                },
            }
        ],
    }
    path = work / "rm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    spy = shutil.which("py-spy") or "py-spy"
    result: dict[str, Any] = {}
    with gateway(path, work, 900, 8100, 8101) as (url, _, _), LoadGen(procs=4) as lg:
        if args.via == "direct":
            url = "http://127.0.0.1:8101"
        result["via"] = args.via
        calls = [("/classify", rm_body("rm", i)) for i in range(2048 + int(args.seconds + 5) * 700)]
        lg.run([url], calls[:2048], 256)  # warm: compile, caches
        pid = ingress_pid()
        folded = args.out / "profile_ingress.folded"
        record = [
            spy,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(args.seconds)),
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(folded),
            "--nonblocking",
            "--threads",
        ]
        out: dict[str, Any] = {}

        def load() -> None:
            before = cpu_accounting.snapshot()
            r = lg.run([url], calls[2048:], 256)
            cpu = cpu_accounting.cpu_ms_per_request(
                before, cpu_accounting.snapshot(), max(r["ok"], 1)
            )
            out.update(req_per_s=r["req_per_s"], ok=r["ok"], errors=r["errors"], cpu_ms_per_req=cpu)

        t = threading.Thread(target=load)
        t.start()
        time.sleep(2)
        spy_run = subprocess.run(record, capture_output=True, text=True, timeout=args.seconds + 60)
        t.join()
        result["load"] = out
        result["py_spy"] = {"rc": spy_run.returncode, "stderr": spy_run.stderr[-800:]}
        if folded.is_file():
            result["profile"] = fold(folded)
    (args.out / "profile_ingress.json").write_text(json.dumps(result, indent=1))
    log(json.dumps({k: v for k, v in result.items() if k != "profile"})[:1500])
    print(json.dumps(result.get("profile", {}), indent=1)[:6000])


if __name__ == "__main__":
    main()
