"""GRPO-shaped groups on one GPU: ``benchmarks/groups.py`` with ``configs/gpu-small.yaml``'s
engines, on the device.

The CPU benchmark's arms, measured the same way (its ``run_kind``, ``judging_cost`` and
``send``, imported): item placement without a prefix cache (``items``), group placement
alone (``groups``) and group placement with the proven prefix cache (``groups_cache``),
interleaved round by round over the very same items; per arm samples/s, request p50/p99,
the prompt tokens the engines were asked to prefill and those their prefix cache served
(vLLM's counters), and the rewards whose bits differ from ``items`` (must be 0).

What differs from the CPU run:

* the models are the Qwen2.5-0.5B shapes of ``models_gpu.py`` (seeded random bf16 weights,
  byte-level tokenizer: one token per character), built on the device in a child process;
* every model entry takes ``configs/gpu-small.yaml``'s settings for its kind (``auto``
  determinism, i.e. batch invariant here; TRITON_ATTN; explicit 2 GiB KV cache per engine;
  ``max_model_len`` 4096; ``max_num_seqs`` 256), with ``--slots`` slots per entry (4
  entries: ``rm-items``, ``rm-cache``, ``judge-items``, ``judge-cache``; 2 slots: 8 engines)
  and the gateway's direct port (what trainers reach on that config);
* the judge's ``judge_prob`` and ``pairwise`` read with ``read: prompt_logprobs`` (vLLM 0.24's
  chat API has no ``logprob_token_ids``: results/judge_labels-2026-12-04.json);
* GRPO's shape from the issue: 16 samples per group, prompts of ``--prompt-chars`` 1,000 and
  responses of ``--response-chars`` 100 tokens, ``--groups`` per round and ``--concurrency``
  groups in flight;
* each kind is warmed up first (other seeds: no prefix shared with the measured groups) on
  both of its models, which also compiles the batch-invariant Triton kernels; the warm-up's
  items rate sizes the rounds so that the whole run ends before ``--deadline-s``
  (``groups_used`` in the result says what was run);
* GPU utilisation (NVML, every 100 ms) per arm.

    python -m benchmarks.gpu.bench_groups --out $OUT

writes ``OUT/groups-0.5b.json`` (after each phase) and ``OUT/groups-0.5b-log.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import groups as cpu
from benchmarks.groups import ARMS, JUDGE_PROB, PAIRWISE, grpo_groups, judging_cost, run_kind

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "gpu-small.yaml"
WORK = Path(os.environ.get("RMGATE_BENCH_WORK", "/tmp/rmgate-bench")) / "groups"
SIZES = {"0.5b": ("grm-0.5b", "rm-0.5b"), "1.5b": ("grm-1.5b", "rm-1.5b")}
KINDS = {"rm": "discriminative", "judge": "generative"}
T0 = time.monotonic()
#: (label, perf_counter start, end, samples) of every batch ``send`` sent
WINDOWS: list[tuple[str, float, float, int]] = []


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def served_config(
    built: dict[str, dict[str, Any]], size: str, slots: int, state_dir: Path, read: str
) -> dict[str, Any]:
    """gpu-small.yaml with each of its two models served twice (``<kind>-items`` without the
    prefix cache, ``<kind>-cache`` with ``prefix_cache: auto``), ``slots`` slots each, and the
    CPU benchmark's judge scorer and ``pairwise`` program."""
    cfg = yaml.safe_load(CONFIG.read_text())
    app = cfg["applications"][0]
    shipped = {m["kind"]: m for m in app["args"]["models"]}
    grm, rm = SIZES[size]
    frac = math.floor(1000 / (len(KINDS) * 2 * slots)) / 1000
    models = []
    for name, kind in KINDS.items():
        for suffix, cache in (("items", "off"), ("cache", "auto")):
            m = copy.deepcopy(shipped[kind])
            m.update(
                name=f"{name}-{suffix}",
                model_path=built[grm if kind == "generative" else rm]["path"],
                replicas=slots,
                prefix_cache=cache,
                max_queue_per_slot=100000,
            )
            actor = dict(m.get("ray_actor_options") or {})
            actor["num_gpus"] = min(float(actor.get("num_gpus", 1.0)), frac)
            m["ray_actor_options"] = actor
            if kind == "generative":
                m["scorer"] = {**JUDGE_PROB, "read": read}
            models.append(m)
    gateway = dict(app["args"].get("gateway") or {})
    gateway.update(
        default_reward_model="rm-items",
        max_queue_per_slot=100000,
        request_timeout_s=900,
        slot_wait_s=900,
        placement="pinned",
        cache="off",
        canary_interval_s=0,  # no probes in the engines' counters between arms
        ledger={"state_dir": str(state_dir)},
    )
    app["args"] = {
        "gateway": gateway,
        "models": models,
        "programs": [
            {
                "name": "pairwise",
                "components": [
                    {"name": "pref", "model": "judge-cache", "scorer": {**PAIRWISE, "read": read}}
                ],
            }
        ],
    }
    return cfg


_send = cpu.send


async def timed_send(
    url: str, model: str, bodies: list[list[dict[str, Any]]], concurrency: int
) -> tuple[list[list[float | None]], list[float], float]:
    """``benchmarks.groups.send``, its time window recorded (for the GPU utilisation)."""
    grouped = any("group" in it for b in bodies for it in b)
    label = model + ("+group" if grouped else "")
    start = time.time()
    out = await _send(url, model, bodies, concurrency)
    WINDOWS.append((label, start, time.time(), sum(len(b) for b in bodies)))
    return out


cpu.send = timed_send  # run_kind and judging_cost call it by its module name


def arm_label(kind: str, arm: str) -> str:
    return {
        "items": f"{kind}-items",
        "groups": f"{kind}-items+group",
        "groups_cache": f"{kind}-cache+group",
    }[arm]


def gpu_util(sampler: Any, label: str, since: float) -> dict[str, Any] | None:
    if sampler is None or not sampler.ok:
        return None
    wins = [(a, b) for lab, a, b, _ in WINDOWS if lab == label and a >= since]
    s = [x for x in sampler.samples if any(a <= x[0] <= b for a, b in wins)]
    if not s:
        return None
    return {
        "gpu_util_pct": round(sum(x[1] for x in s) / len(s), 1),
        "gpu_mem_gib_max": round(max(x[2] for x in s), 1),
        "samples": len(s),
    }


async def warm_up(url: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both models of ``kind``, twice, on groups no measured round shares a prefix with;
    the second pass's rates size the rounds."""
    out: dict[str, Any] = {}
    for p in range(2):
        g = grpo_groups(
            424242 + 10 * p + (0 if kind == "rm" else 1),
            args.warm_groups,
            args.size,
            args.prompt_chars,
            args.response_chars,
        )
        plain = [[{k: v for k, v in it.items() if k != "group"} for it in grp] for grp in g]
        for model, bodies in ((f"{kind}-items", plain), (f"{kind}-cache", g)):
            t = time.perf_counter()
            await cpu.send(url, model, bodies, args.concurrency)
            dt = time.perf_counter() - t
            out[f"pass{p}_{model}_samples_per_s"] = round(sum(map(len, bodies)) / dt, 1)
    return out


def size_rounds(
    warm: dict[str, dict[str, Any]], wanted: dict[str, int], args: argparse.Namespace, left: float
) -> dict[str, int]:
    """Groups per round per kind that fit ``left`` seconds: every arm timed at the warm
    ``-items`` rate (pessimistic for the cached arm), plus 15 %; scaled down together."""
    need = {
        k: 1.15
        * 3
        * args.rounds
        * wanted[k]
        * args.size
        / warm[k][f"pass1_{k}-items_samples_per_s"]
        for k in wanted
    }
    total = sum(need.values())
    factor = min(1.0, left / total) if total > 0 else 1.0
    return {k: max(2, int(wanted[k] * factor)) for k in wanted}


def device_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {}
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        info["gpu"] = f"unknown ({exc})"
    for pkg in ("vllm", "ray", "torch"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a flat folder (the device's $OUT)")
    ap.add_argument("--model-size", default="0.5b", choices=sorted(SIZES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=32, help="DisRM groups per round (at most).")
    ap.add_argument(
        "--judge-groups", type=int, default=16, help="Judge groups per round (at most)."
    )
    ap.add_argument("--size", type=int, default=16, help="Samples per group.")
    ap.add_argument("--prompt-chars", type=int, default=1000)
    ap.add_argument("--response-chars", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=32, help="Requests (groups) in flight.")
    ap.add_argument("--slots", type=int, default=2, help="Slots per model entry.")
    ap.add_argument("--warm-groups", type=int, default=4, help="Groups per warm-up pass.")
    ap.add_argument("--read", default="prompt_logprobs", help="The judge scorers' `read`.")
    ap.add_argument("--via", choices=["direct", "serve"], default="direct")
    ap.add_argument("--kinds", default="rm,judge", help="Which kinds to measure.")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=560,
        help="Measure within this many seconds of the start (results saved, then shutdown).",
    )
    ap.add_argument(
        "--reserve-s", type=float, default=40, help="Kept out of the rounds' sizing (slack)."
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in args.kinds.split(",") if k]
    name = f"groups-{args.model_size}"
    result: dict[str, Any] = {
        "command": "python -m benchmarks.gpu.bench_groups " + " ".join(sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "device": device_info(),
        "errors": [],
    }
    dest = args.out / f"{name}.json"

    def save() -> None:
        result["wall_s"] = round(time.monotonic() - T0, 1)
        dest.write_text(json.dumps(result, indent=1))

    def left() -> float:
        return args.deadline_s - (time.monotonic() - T0)

    from benchmarks.gpu.bench_paths import GpuSampler, write_log_tail
    from benchmarks.gpu.models_gpu import build_in_child
    from gateway.harness.running import running_gateway

    work = WORK
    shutil.rmtree(work, ignore_errors=True)
    (work / "run").mkdir(parents=True)
    t = time.monotonic()
    built = build_in_child(WORK.parent / "models", list(SIZES[args.model_size]))
    result["build"] = {"seconds": round(time.monotonic() - t, 1), "models": built}
    log(f"models ready in {result['build']['seconds']}s")
    cfg = served_config(built, args.model_size, args.slots, work / "state", args.read)
    path = work / "groups.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result["config"] = cfg["applications"][0]["args"]
    save()
    sampler = GpuSampler()
    started = time.monotonic()
    try:
        with running_gateway(path, work / "run", timeout_s=max(60.0, left() - 60)) as (
            serve_url,
            _,
        ):
            result["serving_after_s"] = round(time.monotonic() - started, 1)
            url = serve_url
            direct = cfg["applications"][0]["args"]["gateway"].get("direct_port")
            if args.via == "direct" and direct:
                try:
                    httpx.get(f"http://127.0.0.1:{direct}/v1/models", timeout=10).raise_for_status()
                    url = f"http://127.0.0.1:{direct}"
                except httpx.HTTPError as exc:
                    result["errors"].append(f"direct port {direct}: {exc}; using Serve's port")
            result["url"] = "direct" if url != serve_url else "serve"
            cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
            result["models"] = {
                c["id"]: {
                    k: c.get(k) for k in ("determinism", "selftest", "prefix_cache", "numerics")
                }
                for c in cards
            }
            log(f"serving after {result['serving_after_s']}s via {result['url']}")
            for c in cards:
                log(f"  {c['id']}: {c.get('determinism')} prefix_cache {c.get('prefix_cache')}")
            save()
            warm: dict[str, dict[str, Any]] = {}
            for kind in kinds:
                t = time.monotonic()
                warm[kind] = asyncio.run(warm_up(url, kind, args))
                warm[kind]["seconds"] = round(time.monotonic() - t, 1)
                log(f"warm-up {kind}: {warm[kind]}")
            result["warm_up"] = warm
            if "judge" in kinds:  # short (c=1, 2 groups): before the rounds, so it always runs
                try:
                    result["judging_cost"] = asyncio.run(judging_cost(url, args))
                    log(f"judging cost: {json.dumps(result['judging_cost'])}")
                except Exception as exc:  # noqa: BLE001
                    result["errors"].append(f"judging_cost: {type(exc).__name__}: {exc}"[:2000])
            wanted = {"rm": args.groups, "judge": args.judge_groups}
            wanted = {k: wanted[k] for k in kinds}
            used = size_rounds(warm, wanted, args, left() - args.reserve_s)
            result["groups_requested"], result["groups_used"] = wanted, used
            log(f"groups per round: {used} ({left():.0f}s left)")
            save()
            for kind in kinds:
                kargs = copy.copy(args)
                kargs.groups = used[kind]
                kargs.concurrency = min(args.concurrency, used[kind])
                since = time.time()
                t = time.monotonic()
                try:
                    res = asyncio.run(run_kind(url, kind, kargs))
                except Exception as exc:  # noqa: BLE001 - record and go on
                    result["errors"].append(f"{kind}: {type(exc).__name__}: {exc}"[:2000])
                    log(f"{kind} failed: {exc}")
                    continue
                res["seconds"] = round(time.monotonic() - t, 1)
                res["groups_per_round"] = kargs.groups
                res["concurrency"] = kargs.concurrency
                for arm in ARMS:
                    res[arm]["gpu"] = gpu_util(sampler, arm_label(kind, arm), since)
                result[kind] = res
                log(f"{kind}: {json.dumps(res)}")
                save()
            save()
            write_log_tail(work / "run", args.out / f"{name}-log.txt")  # before the shutdown
            log("stopping the gateway")
    except Exception as exc:
        result["errors"].append(f"run: {type(exc).__name__}: {exc}"[:4000])
        log(f"FAILED: {type(exc).__name__}: {str(exc)[:4000]}")
    finally:
        save()
        write_log_tail(work / "run", args.out / f"{name}-log.txt")
    print(f"-> {dest}")
    if result["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
