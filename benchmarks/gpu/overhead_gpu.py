"""The gateway's own cost on a GPU host with cores to spare, side by side in one run.

Superseded by ``bench_paths.py`` (issue 13), whose load generator runs in several aiohttp
processes: this one's single httpx client limited the direct path (a) itself.

On 2 CPU cores the engines and the gateways fight for the same cores; here (the lent H200
host: 16 cores) the engines run on the GPU, so what is left is each path's own ceiling.
One ``rmgate serve`` with a GRM and a DisRM (``determinism: off``, so nothing but the path
differs), both reached four ways, interleaved in rounds: (a) the vLLM servers directly,
(b) the least-loaded FastAPI + httpx proxy, (c) rmgate as ``rmgate serve`` runs it (HAProxy
+ direct ingress), (d) rmgate through Serve's Python proxy (its fallback proxy). Reports
throughput, p50/p99, ratios and CPU ms per request by component, as
``benchmarks/side_by_side.py`` does.

    python -m benchmarks.gpu.overhead_gpu --out DIR [--device cpu] [--quick]
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu.bench_gpu import build_models, grm_body, parse_args, rm_body, serve_config
from benchmarks.side_by_side import engine_urls, ratios, sweep
from deployments.engine.process import free_port
from gateway.harness.least_loaded import start_proxy
from gateway.harness.processes import stop_process_group
from gateway.harness.running import running_gateway


async def measure(
    url: str,
    serve_proxy_url: str,
    engines: Path,
    levels: list[int],
    rounds: int,
    n_cls: int,
    n_gen: int,
    logdir: Path,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rm, grm = engine_urls(engines, "rm-off", 1), engine_urls(engines, "grm-off", 1)
    proxies = [start_proxy(rm, logdir), start_proxy(grm, logdir)]
    try:
        for kind, direct, proxy, calls in (
            (
                "disrm",
                rm,
                proxies[0][1],
                [("/classify", rm_body("rm-off", i)) for i in range(n_cls)],
            ),
            (
                "grm",
                grm,
                proxies[1][1],
                [("/v1/chat/completions", grm_body("grm-off", i, 16)) for i in range(n_gen)],
            ),
        ):
            paths = {
                "a_engines": direct,
                "b_least_loaded": [proxy],
                "c_rmgate": [url],
                "d_rmgate_serve_proxy": [serve_proxy_url],
            }
            rows = {}
            for c in levels:
                res = await sweep(paths, calls, c, rounds)
                res["ratios"] = ratios(res)
                rows[str(c)] = res
                print(
                    f"{kind} c={c}: "
                    + json.dumps(
                        {p: (res[p]["req_per_s"], res[p]["gateway_cpu_ms_per_req"]) for p in paths}
                    ),
                    flush=True,
                )
                print(f"    {json.dumps(res['ratios'])}", flush=True)
            out[kind] = rows
    finally:
        for proc, _ in proxies:
            stop_process_group(proc, grace_s=10)
    return out


def main() -> None:
    args = parse_args(__doc__, "gpu-overhead")
    args.out.mkdir(parents=True, exist_ok=True)
    paths = build_models(args.device, args.models)
    cfg = serve_config(args.device, paths)
    app = cfg["applications"][0]["args"]
    app["models"] = [m for m in app["models"] if m["name"] in ("rm-off", "grm-off")]
    (args.out / "serve.yaml").write_text(yaml.safe_dump(cfg))
    quick = args.quick or args.device == "cpu"
    levels, rounds = ([32], 1) if quick else ([64, 256], 2)
    n_cls, n_gen = (64, 16) if quick else (1024, 256)
    fallback = free_port()
    t0 = time.perf_counter()
    with running_gateway(
        args.out / "serve.yaml",
        Path("/tmp/rmgate-bench-ovh") / "run",
        timeout_s=1200,
        env={"RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback)},
    ) as (url, engines):
        started = time.perf_counter() - t0
        report = asyncio.run(
            measure(
                url, f"http://127.0.0.1:{fallback}", engines, levels, rounds, n_cls, n_gen, args.out
            )
        )
    report = {
        "overhead": report,
        "device": args.device,
        "startup_s": round(started, 1),
        "levels": levels,
        "rounds": rounds,
        "date": time.strftime("%Y-%m-%d"),
    }
    (args.out / "overhead_gpu.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'overhead_gpu.json'}")


if __name__ == "__main__":
    main()
