"""End-to-end throughput with 1, 2, 4 replicas of one model, and the same bits at each.

One ``rmgate serve`` with one deterministic DisRM (``serialize``) at 1 slot; the same
workload is sent at each slot count, going 1 → 2 → 4 with ``rmgate scale`` (the gateway and
the existing slots keep running). It reports throughput and p50 at each count, the ratio to
1 slot, the balance of requests over slots (max/mean, from ``x-rmgate-slot``), and checks
that every answer is bitwise the same at every count (the product's promise: the reward
does not depend on how many replicas serve it). Two variants, one gateway each, in one
run: the slots' engines on cores of their own (``cpu_cores_per_slot: 1``) and vLLM's auto
binding (every engine of the host bound to the same cores).

    .venv/bin/python -m benchmarks.replica_throughput [--quick] [--out DIR]

``--quick``: the tiny DisRM, own cores only, 1 → 2 slots, 96 requests (about 2 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.side_by_side import ENGINE, load, rm_call
from gateway.harness.running import dashboard_address, running_gateway, serve_config

REPO = Path(__file__).resolve().parents[1]


#: (name, cpu_cores_per_slot): the slots' engines pinned to cores of their own (rmgate's
#: option), and vLLM's auto binding (every engine of the host on the same cores).
VARIANTS: list[tuple[str, int | None]] = [("own-cores", 1), ("vllm-auto-binding", None)]


def config(model_path: Path, cores_per_slot: int | None) -> dict[str, Any]:
    return serve_config(
        {
            "gateway": {"max_queue_per_slot": 100000, "request_timeout_s": 600},
            "models": [
                {
                    "name": "rm",
                    "kind": "discriminative",
                    "replicas": 1,
                    "model_path": str(model_path),
                    "determinism": "serialize",
                    "engine_args": ENGINE,
                    "max_queue_per_slot": 100000,
                    "cpu_cores_per_slot": cores_per_slot,
                }
            ],
        }
    )


async def run_load(url: str, calls: list[tuple[str, dict]], concurrency: int) -> dict[str, Any]:
    """``side_by_side.load`` through the gateway, plus the spread of requests over slots."""
    r = await load([url], calls, concurrency)
    counts = list(r["slots"].values())
    return {
        "req_per_s": r["req_per_s"],
        "p50_ms": r["p50_ms"],
        "requests_per_slot": r["slots"],
        "balance_max_over_mean": round(max(counts) / statistics.mean(counts), 3),
        "answers": r["answers"],
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4))
    for (variant, data), color in zip(report["variants"].items(), ("tab:green", "tab:gray")):
        rows = data["by_replicas"]
        ns = [int(n) for n in rows]
        ax.plot(
            ns,
            [rows[str(n)]["req_per_s"] for n in ns],
            "o-",
            color=color,
            label=f"{variant} (cpu_cores_per_slot={data['cpu_cores_per_slot']})",
        )
        ax.set_xticks(ns)
    ax.set_xlabel("replicas (slots) of the model, rescaled live with rmgate scale")
    ax.set_ylabel(f"requests / s (concurrency {report['concurrency']})")
    ax.set_title(
        f"End-to-end throughput by replica count, determinism: serialize\n"
        f"{report['model']}, {report['machine']}, answers identical at every count: "
        f"{report['identical_at_every_count']}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "replica_throughput"
    )
    args = ap.parse_args()
    from deployments.demo.models import build_demo_models, demo_models_present
    from gateway.serve.admin import ServeAdmin

    models = REPO / "models" / "demo"
    if not demo_models_present(models):
        build_demo_models(models)
    model = "disrm" if args.quick else "disrm-large"
    counts = [1, 2] if args.quick else [1, 2, 4]
    n, concurrency = (96, 16) if args.quick else (600, 32)
    args.out.mkdir(parents=True, exist_ok=True)
    calls = [rm_call("rm", 40_000 + i) for i in range(n)]
    report: dict[str, Any] = {
        "model": model,
        "requests": n,
        "concurrency": concurrency,
        "variants": {},
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores",
    }
    first: dict[int, str] | None = None
    for variant, cores in VARIANTS[: 1 if args.quick else None]:
        rows: dict[str, Any] = {}
        differing: dict[str, int] = {}
        cfg = args.out / f"serve-{variant}.yaml"
        cfg.write_text(yaml.safe_dump(config(models / model, cores)))
        with running_gateway(cfg, args.out / f"run-{variant}", timeout_s=1200) as (url, _):
            admin = ServeAdmin(dashboard_address(args.out / f"run-{variant}" / "serve.log"))
            for count in counts:
                if count > 1:
                    t = time.perf_counter()
                    admin.scale("rm", count, timeout_s=1200, log=lambda m: print(m, flush=True))
                    print(f"scaled to {count} in {time.perf_counter() - t:.0f}s", flush=True)
                asyncio.run(run_load(url, calls[:16], concurrency))  # warm-up, new slots too
                row = asyncio.run(run_load(url, calls, concurrency))
                answers = row.pop("answers")
                first = first if first is not None else answers
                differing[str(count)] = sum(answers[i] != first[i] for i in range(n))
                rows[str(count)] = row
                print(f"{variant} replicas={count}: {json.dumps(row)}", flush=True)
        for row in rows.values():
            row["throughput_vs_1"] = round(row["req_per_s"] / rows["1"]["req_per_s"], 3)
        report["variants"][variant] = {
            "cpu_cores_per_slot": cores,
            "by_replicas": rows,
            "differing_vs_first_answers": differing,
        }
    report["identical_at_every_count"] = not any(
        any(v["differing_vs_first_answers"].values()) for v in report["variants"].values()
    )
    (args.out / "replica_throughput.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "replica_throughput.png")
    print(json.dumps(report["variants"], indent=1))
    print(f"wrote {args.out / 'replica_throughput.json'}")


if __name__ == "__main__":
    main()
