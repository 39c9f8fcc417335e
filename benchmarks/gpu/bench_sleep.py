"""Sleep and wake on one GPU: what a colocated trainer gets back, and what it costs.

One gateway with three engines on one GPU, each started with vLLM's sleep mode
(``sleep_mode: true``) and ``configs/gpu-small.yaml``'s settings for its kind: the DisRM at
the 0.5B and 1.5B shapes of ``models_gpu.py`` (``rm-0.5b``, ``rm-1.5b``) and the 0.5B judge
(``judge-0.5b``), one slot each. In one run, for level 1 and then level 2:

* a replay of fixed requests per model (DisRM: ``--requests`` single-text ``/classify``;
  judge: a quarter as many ``/v1/chat/completions``), at ``--concurrency``, before the sleep:
  throughput and every answer's bytes;
* ``POST /sleep?level=L`` (every model at once): the time each slot took; the GPU's used
  memory (NVML) before and while asleep;
* while asleep, a child process allocates all the GPU's free memory but 1 GiB with torch
  (the trainer's use of the memory): it must succeed; the same size once the engines are
  awake again must not fit (the negative control: it is the sleep that made room);
* ``POST /wake_up``: the time each slot took, its numerics re-probe included, and the GPU's
  memory after; then the same replay: throughput, and the answers whose bytes differ from
  the first replay's (must be 0).

    python -m benchmarks.gpu.bench_sleep --out $OUT

writes ``OUT/sleep.json`` (after each phase) and ``OUT/sleep-log.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.gpu.bench_groups import device_info

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "gpu-small.yaml"
WORK = Path(os.environ.get("RMGATE_BENCH_WORK", "/tmp/rmgate-bench")) / "sleep"
#: served name -> (built model, kind)
MODELS = {
    "rm-0.5b": ("rm-0.5b", "discriminative"),
    "rm-1.5b": ("rm-1.5b", "discriminative"),
    "judge-0.5b": ("grm-0.5b", "generative"),
}
GIB = 1024**3
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def served_config(built: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cfg = yaml.safe_load(CONFIG.read_text())
    app = cfg["applications"][0]
    shipped = {m["kind"]: m for m in app["args"]["models"]}
    models = []
    for name, (model, kind) in MODELS.items():
        m = copy.deepcopy(shipped[kind])
        m.update(name=name, model_path=built[model]["path"], replicas=1, sleep_mode=True)
        m.pop("prefix_cache", None)
        m["ray_actor_options"] = {**(m.get("ray_actor_options") or {}), "num_gpus": 0.3}
        models.append(m)
    gateway = dict(app["args"].get("gateway") or {})
    gateway.update(
        default_reward_model="rm-0.5b",
        cache="off",
        canary_interval_s=0,
        request_timeout_s=600,
        slot_wait_s=600,
    )
    app["args"] = {"gateway": gateway, "models": models}
    return cfg


def gpu_used_gib() -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()[0]
        return round(float(out) / 1024, 2)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def allocate_in_child(gib: float | None) -> dict[str, Any]:
    """torch allocates ``gib`` GiB on the GPU in a child process (its own CUDA context) and
    touches it (None: all the free memory but 1 GiB); the child's verdict."""
    size = f"int({gib} * 1024**3)" if gib is not None else "free - 1024**3"
    code = (
        "import json, torch\n"
        "free, total = torch.cuda.mem_get_info()\n"
        f"n = {size}\n"
        "x = torch.empty(n, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()\n"
        "print(json.dumps({'allocated_gib': round(n / 1024**3, 2), 'free_gib_before': "
        "round(free / 1024**3, 2), 'ok': True}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode:
        return {"ok": False, "asked_gib": gib, "error": res.stderr[-1500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def bodies(model: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    """Fixed requests of one model: (path, body)."""
    _, kind = MODELS[model]
    if kind == "discriminative":
        return [
            ("/classify", {"model": model, "input": f"Q{i}: {'x' * (i % 37)} {i * 7919 % 1000}"})
            for i in range(n)
        ]
    return [
        (
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": f"Rate answer {i}: {i * 31 % 97}"}],
                "max_tokens": 16,
            },
        )
        for i in range(max(8, n // 4))
    ]


async def replay(url: str, model: str, n: int, concurrency: int) -> dict[str, Any]:
    """Every request once; throughput and each answer's bytes (the part that holds the
    reward: a classifier's probs, a judge's choices)."""
    reqs = bodies(model, n)
    sem = asyncio.Semaphore(concurrency)
    answers: list[str | None] = [None] * len(reqs)
    failed = 0
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as c:

        async def one(i: int, path: str, body: dict[str, Any]) -> None:
            nonlocal failed
            async with sem:
                r = await c.post(url + path, json=body)
            if r.status_code != 200:
                failed += 1
                return
            data = r.json()
            part = data["data"] if path == "/classify" else data["choices"]
            answers[i] = json.dumps(part, sort_keys=True)

        t = time.perf_counter()
        await asyncio.gather(*(one(i, p, b) for i, (p, b) in enumerate(reqs)))
        dt = time.perf_counter() - t
    return {
        "requests": len(reqs),
        "failed": failed,
        "req_per_s": round(len(reqs) / dt, 1),
        "answers": answers,
    }


def slots_of(report: dict[str, Any]) -> dict[str, Any]:
    """model -> its slot's state and ``last`` transition, from a /sleep or /wake_up answer."""
    return {
        m: [{k: s.get(k) for k in ("state", "how", "level", "last")} for s in v["slots"]]
        for m, v in report["models"].items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a flat folder (the device's $OUT)")
    ap.add_argument("--requests", type=int, default=512, help="DisRM requests per replay.")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--levels", default="1,2")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python -m benchmarks.gpu.bench_sleep " + " ".join(sys.argv[1:]),
        "device": device_info(),
        "errors": [],
        "levels": {},
    }
    dest = args.out / "sleep.json"

    def save() -> None:
        result["wall_s"] = round(time.monotonic() - T0, 1)
        dest.write_text(json.dumps(result, indent=1))

    from benchmarks.gpu.bench_paths import write_log_tail
    from benchmarks.gpu.models_gpu import build_in_child
    from gateway.harness.running import running_gateway

    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "run").mkdir(parents=True)
    built = build_in_child(WORK.parent / "models", sorted({m for m, _ in MODELS.values()}))
    cfg = served_config(built)
    path = WORK / "sleep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result["config"] = cfg["applications"][0]["args"]
    save()
    try:
        with running_gateway(path, WORK / "run", timeout_s=420) as (serve_url, _):
            direct = cfg["applications"][0]["args"]["gateway"].get("direct_port")
            url = f"http://127.0.0.1:{direct}" if direct else serve_url
            log(f"serving at {url}")
            cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
            result["models"] = {c["id"]: c.get("determinism") for c in cards}
            for model in MODELS:  # warm-up: compiles the batch-invariant kernels
                asyncio.run(replay(url, model, 64, args.concurrency))
            for level in [int(x) for x in args.levels.split(",")]:
                entry: dict[str, Any] = result["levels"].setdefault(str(level), {})
                before = {
                    m: asyncio.run(replay(url, m, args.requests, args.concurrency)) for m in MODELS
                }
                entry["gpu_used_gib_awake"] = gpu_used_gib()
                t = time.monotonic()
                slept = httpx.post(f"{url}/sleep?level={level}", timeout=600)
                if slept.status_code != 200:
                    raise RuntimeError(f"/sleep: {slept.status_code} {slept.text[:2000]}")
                entry["sleep_s"] = round(time.monotonic() - t, 2)
                entry["sleep"] = slots_of(slept.json())
                time.sleep(2)
                entry["gpu_used_gib_asleep"] = gpu_used_gib()
                entry["is_sleeping"] = httpx.get(url + "/is_sleeping", timeout=60).json()[
                    "is_sleeping"
                ]
                freed = (entry["gpu_used_gib_awake"] or 0) - (entry["gpu_used_gib_asleep"] or 0)
                entry["freed_gib"] = round(freed, 2)
                asleep = entry["allocation_while_asleep"] = allocate_in_child(None)
                log(f"level {level}: asleep {json.dumps(entry)[:1500]}")
                save()
                t = time.monotonic()
                woke = httpx.post(url + "/wake_up", timeout=600)
                if woke.status_code != 200:
                    raise RuntimeError(f"/wake_up: {woke.status_code} {woke.text[:2000]}")
                entry["wake_s"] = round(time.monotonic() - t, 2)
                entry["wake"] = slots_of(woke.json())
                entry["wake_status"] = woke.json()["status"]
                entry["gpu_used_gib_after_wake"] = gpu_used_gib()
                if asleep.get("ok"):  # the same size while awake: must not fit
                    entry["same_allocation_while_awake"] = allocate_in_child(
                        asleep["allocated_gib"]
                    )
                after = {
                    m: asyncio.run(replay(url, m, args.requests, args.concurrency)) for m in MODELS
                }
                # once more: what the first replay after a wake cost, if anything
                again = {
                    m: asyncio.run(replay(url, m, args.requests, args.concurrency)) for m in MODELS
                }
                entry["replay"] = {
                    m: {
                        "requests": before[m]["requests"],
                        "failed": before[m]["failed"] + after[m]["failed"] + again[m]["failed"],
                        "req_per_s_before": before[m]["req_per_s"],
                        "req_per_s_after_wake": after[m]["req_per_s"],
                        "ratio": round(after[m]["req_per_s"] / before[m]["req_per_s"], 3),
                        "req_per_s_second_after_wake": again[m]["req_per_s"],
                        "answers_differing": sum(
                            a != b or a != c
                            for a, b, c in zip(
                                before[m]["answers"], after[m]["answers"], again[m]["answers"]
                            )
                        ),
                    }
                    for m in MODELS
                }
                log(f"level {level}: woke {json.dumps(entry['replay'])}")
                save()
            write_log_tail(WORK / "run", args.out / "sleep-log.txt")
    except Exception as exc:
        result["errors"].append(f"run: {type(exc).__name__}: {exc}"[:4000])
        log(f"FAILED: {type(exc).__name__}: {str(exc)[:4000]}")
    finally:
        save()
        write_log_tail(WORK / "run", args.out / "sleep-log.txt")
    print(f"-> {dest}")
    if result["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
