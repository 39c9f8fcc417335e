"""Where a request's time goes: engine alone vs rmgate with each transport (one run).

Starts ``rmgate serve benchmarks/configs/hops.yaml`` (one DisRM slot reached directly over
loopback HTTP, one through the slot replica's Serve handle), then sends the same
one-item /classify requests, interleaved in rounds, to: (a) the vLLM server of the direct
slot itself, (b) rmgate, direct transport, (c) rmgate, handle transport. Prints p50/p99
per path and the added latency and ratios against (a), and writes JSON.

    .venv/bin/python -m benchmarks.hops [--requests 200] [--out benchmarks/results/hops.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from deployments.engine.process import free_port
from gateway.harness.processes import engine_headers_for, stop_process_group
from gateway.harness.running import wait_until_serving

REPO = Path(__file__).resolve().parents[1]


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="requests per path")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "hops.json")
    ap.add_argument("--quick", action="store_true", help="40 requests per path")
    args = ap.parse_args()
    n = 40 if args.quick else args.requests

    from deployments.demo.models import build_demo_models, demo_models_present

    if not demo_models_present(REPO / "models" / "demo"):
        build_demo_models(REPO / "models" / "demo")

    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="rmgate-hops-"))
    env = {**os.environ, "RMGATE_LOG_DIR": str(logs / "engines"), "HF_HUB_OFFLINE": "1"}
    with open(logs / "serve.log", "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                str(REPO / "benchmarks/configs/hops.yaml"),
                "--port",
                str(port),
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, logs / "serve.log", 900)
        wait_until_serving(url + "/handle", proc, logs / "serve.log", 900)
        engine_log = sorted((logs / "engines").glob("rm-0-*.log"))[0]
        # Two rm-0 engines exist (one per application); either is a vLLM server that
        # answers its secret's bearer only.
        engine_port = engine_log.stem.rsplit("-", 1)[1]
        engine_url = f"http://127.0.0.1:{engine_port}"
        paths = {"engine": engine_url, "rmgate-direct": url, "rmgate-handle": url + "/handle"}
        auth = engine_headers_for(paths.values())  # the engine its secret, the gateway no cache
        times: dict[str, list[float]] = {k: [] for k in paths}
        with httpx.Client(timeout=60) as client:
            for i in range(n + 10):
                body = {"model": "rm", "input": f"2+{i % 10}={i % 13} is the answer"}
                for name, base in paths.items():
                    t = time.perf_counter()
                    r = client.post(base + "/classify", json=body, headers=auth.get(base))
                    dt = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200, r.text
                    if i >= 10:  # warm-up
                        times[name].append(dt)
    finally:
        stop_process_group(proc)
    base_p50 = statistics.median(times["engine"])
    result = {"requests_per_path": n, "paths": {}}
    print(f"{'path':<16}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'p50 ratio':>11}")
    for name, xs in times.items():
        p50, p99 = statistics.median(xs), _percentile(xs, 0.99)
        result["paths"][name] = {
            "p50_ms": round(p50, 2),
            "p99_ms": round(p99, 2),
            "added_p50_ms": round(p50 - base_p50, 2),
            "p50_ratio_vs_engine": round(p50 / base_p50, 2),
        }
        print(f"{name:<16}{p50:>9.1f}{p99:>9.1f}{p50 - base_p50:>9.1f}{p50 / base_p50:>11.2f}")
    ratio = statistics.median(times["rmgate-handle"]) / statistics.median(times["rmgate-direct"])
    result["handle_over_direct_p50"] = round(ratio, 2)
    print(f"handle / direct p50 ratio: {ratio:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
