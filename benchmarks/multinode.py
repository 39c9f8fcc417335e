"""Two Ray nodes on this machine: what spreading a model's slots over nodes costs, and how
long a lost node's keys take to be answered again.

One cluster (``gateway.harness.cluster``: a head ``nodeA`` and a worker ``nodeB``, both on
127.0.0.1), one ``rmgate serve --address`` with two gateways (one config, two
applications, the demo DisRM, ``engine_host: node``, ``placement: class``, ingresses on the
head), the one variable being where the second slot runs:

* ``one``: both slots on nodeA;  * ``two``: slot 0 on nodeA, slot 1 on nodeB.

1. Throughput and latency, interleaved rounds, medians: (a) the two engines of ``two``
   reached directly (round robin, with their secret, read from their own environment:
   the physical anchor), (b) gateway ``one``, (c) gateway ``two``; concurrency 1 and 32.
   The nodes share this machine, so the ingress -> engine request is loopback HTTP in (b)
   and (c) alike: (c) − (b) checks that spreading slots over nodes costs nothing beyond
   the network (which this setup cannot show), and (b) − (a) is the gateway's own hop.
2. A node lost: under a closed-loop load (concurrency 32, kept up 25 s after the kill) on
   ``two``, nodeB is lost (its raylet and every process it started SIGKILLed); every request is answered (0 lost) with the bits
   it had before; reported: whether slot 1 still answered after the loss (it must not:
   its engine is killed with the node), the time from the loss to the first answer of a
   slot-1 key by slot 0, and the worst latency of a request in flight across the loss.

    .venv/bin/python -m benchmarks.multinode [--quick] [--out benchmarks/results/multinode]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.side_by_side import answer, load
from gateway.harness.cluster import Node, local_cluster, rmgate_on_cluster
from gateway.harness.processes import NO_CACHE, engine_secret_headers

REPO = Path(__file__).resolve().parents[1]


def gateway_app(name: str, route: str, models: Path, where: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "route_prefix": route,
        "import_path": "gateway.serve.app:build_app",
        "deployments": [
            {"name": "gateway", "ray_actor_options": {"num_cpus": 0, "resources": {"nodeA": 0.01}}}
        ],
        "args": {
            "gateway": {"placement": "class", "slot_wait_s": 180, "canary_interval_s": 0},
            "models": [
                {
                    "name": "rm",
                    "kind": "discriminative",
                    "model_path": str(models / "disrm"),
                    "replicas": 2,
                    "engine_host": "node",
                    "slot_ray_actor_options": [{"resources": {n: 0.01}} for n in where],
                    "engine_args": {
                        "dtype": "float32",
                        "max_model_len": 512,
                        "enforce_eager": True,
                    },
                }
            ],
        },
    }


def config(models: Path) -> dict[str, Any]:
    return {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            gateway_app("one", "/one", models, ["nodeA", "nodeA"]),
            gateway_app("two", "/two", models, ["nodeA", "nodeB"]),
        ],
    }


def calls(n: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(0)
    return [
        (
            "/classify",
            {
                "model": "rm",
                "input": "".join(
                    rng.choice("0123456789+=abc ") for _ in range(rng.choice([1, 5, 12, 40, 120]))
                ),
            },
        )
        for _ in range(n)
    ]


def engines_of(url: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The gateway's engine URLs and, per URL, the header with its secret, read from the
    engine launcher's own environment (this machine started it; a benchmark only)."""
    card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
    urls, headers = [], {}
    for where in card["nodes"]:
        argv = Path(f"/proc/{where['engine_pid']}/cmdline").read_bytes().decode().split("\0")
        port = argv[argv.index("--port") + 1]
        u = f"http://{where['engine_host']}:{port}"
        urls.append(u)
        headers[u] = engine_secret_headers(port)
    return urls, headers


async def sweep(
    paths: dict[str, tuple[list[str], dict]], work: list, concurrency: int, rounds: int
) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    for _ in range(rounds):
        for name, (urls, headers) in paths.items():
            r = await load(urls, work, concurrency, headers=headers)
            r.pop("answers")
            samples[name].append(r)
    out = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "req_per_s")}
        for name, rs in samples.items()
    }
    for name, rs in samples.items():
        out[name]["req_per_s_rounds"] = [r["req_per_s"] for r in rs]
    return out


async def node_loss(
    url: str,
    node: Node,
    work: list,
    before: dict[int, str],
    concurrency: int = 32,
    after_s: float = 25.0,
) -> dict[str, Any]:
    """A closed loop over ``work`` (cycled) on ``url``; ``node`` lost (its raylet and every
    process it started SIGKILLed) after 3 s,
    the load kept up ``after_s`` more. Every answer is checked against ``before``."""

    done: list[tuple[int, float, float, str, str, str]] = []
    killed_at: list[float] = []
    stop_at = [float("inf")]
    next_call = iter(range(10**9))

    async with httpx.AsyncClient(timeout=600) as c:

        async def client() -> None:
            while time.monotonic() < stop_at[0]:
                i = next(next_call) % len(work)
                path, body = work[i]
                t = time.monotonic()
                r = await c.post(url + path, json=body)
                assert r.status_code == 200, r.text  # nothing accepted is lost
                done.append(
                    (
                        i,
                        t,
                        time.monotonic(),
                        answer(path, r.json()),
                        r.headers.get("x-rmgate-slot", ""),
                        r.headers.get("x-rmgate-placement", ""),
                    )
                )

        async def kill() -> None:
            await asyncio.sleep(3)
            killed_at.append(time.monotonic())
            stop_at[0] = killed_at[0] + after_s
            node.lose()

        await asyncio.gather(kill(), *(client() for _ in range(concurrency)))
    t0 = killed_at[0]
    after = [d for d in done if d[2] > t0]
    moved = [e for _, _, e, _, _, p in after if "1->0" in p]
    slot1 = [e for _, _, e, _, slot, _ in after if slot == "1"]
    return {
        "answered": len(done),
        "changed": sum(a != before[i] for i, _, _, a, _, _ in done),
        "answered_after_kill": len(after),
        "slot1_answers_after_kill": len(slot1),
        "last_slot1_answer_after_kill_s": round(max(slot1) - t0, 2) if slot1 else None,
        "slot1_keys_answered_by_slot0": len(moved),
        "first_moved_answer_after_kill_s": round(min(moved) - t0, 2) if moved else None,
        "worst_latency_across_kill_s": round(
            max((e - s for _, s, e, *_ in done if s <= t0 <= e), default=0.0), 2
        ),
        "p50_latency_before_kill_ms": round(
            1000 * statistics.median([e - s for _, s, e, *_ in done if e < t0] or [float("nan")]), 1
        ),
        "p50_latency_from_kill_plus_5s_ms": round(
            1000
            * statistics.median([e - s for _, s, e, *_ in done if s > t0 + 5] or [float("nan")]),
            1,
        ),
    }


async def measure(url: str, nodes: dict, quick: bool) -> dict[str, Any]:
    rounds, n = (1, 64) if quick else (3, 200)
    work = calls(n)
    # the gateways' paths reach their engines on every request (no answers from the ledger)
    paths = {
        "a_engines": engines_of(url + "/two"),
        "b_one_node": ([url + "/one"], {url + "/one": dict(NO_CACHE)}),
        "c_two_nodes": ([url + "/two"], {url + "/two": dict(NO_CACHE)}),
    }
    report: dict[str, Any] = {"rounds": rounds, "requests_per_point": n}
    for c in (1, 32):
        res = await sweep(paths, work, c, rounds)
        res["c/b"] = round(res["c_two_nodes"]["req_per_s"] / res["b_one_node"]["req_per_s"], 3)
        res["added_ms_per_node_hop_p50"] = round(
            res["c_two_nodes"]["p50_ms"] - res["b_one_node"]["p50_ms"], 2
        )
        res["gateway_hop_ms_p50"] = round(
            res["b_one_node"]["p50_ms"] - res["a_engines"]["p50_ms"], 2
        )
        report[f"c{c}"] = res
        print(f"c={c}: " + json.dumps(res), flush=True)
    loss_work = calls(200)
    baseline = await load([url + "/two"], loss_work, 32)
    report["node_loss"] = await node_loss(
        url + "/two", nodes["nodeB"], loss_work, baseline["answers"]
    )
    print("node loss: " + json.dumps(report["node_loss"]), flush=True)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "multinode")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from deployments.demo.models import build_demo_models, demo_models_present

    models = REPO / "models" / "demo"
    if not demo_models_present(models):
        build_demo_models(models)
    path = args.out / "serve.yaml"
    path.write_text(yaml.safe_dump(config(models)))
    with local_cluster(["nodeA", "nodeB"], args.out) as (address, nodes):
        with rmgate_on_cluster(path, address, args.out, routes=("/one", "/two")) as url:
            report = asyncio.run(measure(url, nodes, args.quick))
    report.update(quick=args.quick, date=time.strftime("%Y-%m-%d"))
    (args.out / "multinode.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out / 'multinode.json'}")


if __name__ == "__main__":
    main()
