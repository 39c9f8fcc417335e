"""What a lightly loaded CPU engine costs between requests: vLLM's one-second busy-wait
against rmgate's bound (``deployments.engine.vllm_server``), side by side in one run.

One variable: ``RMGATE_ENGINE_SPIN_S`` (empty: vLLM's own 1 s spin; ``0.002``: what rmgate
plans on CPU). Each round starts the demo DisRM's engine as a slot plans it, sends
``--requests`` requests ``--pace-s`` apart (the shape of a trainer's steady stream, or
of the suite's paced loads) and reads the engine's process group's CPU seconds; then a
second engine of the same plan boots while the first keeps answering the stream (what a
scale event or a restart does on a small host), and its boot time is recorded. Every
answer's bits are compared across the two settings.

    .venv/bin/python -m benchmarks.engine_spin [--requests 40] [--pace-s 0.25]
        [--out benchmarks/reports/engine_spin-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.ingress_stack import REPO
from deployments.engine.args import Platform, plan_engine
from deployments.engine.process import EngineProcess, EngineStartError, free_port
from deployments.engine.vllm_server import SPIN_ENV
from gateway.core.config.settings import ModelSpec
from gateway.harness.cpu_accounting import group_cpu_by_kind
from gateway.harness.processes import stop_process_group

MODELS = REPO / "models" / "demo"
#: How long the second engine is given to boot (alone it takes about 40 s).
BOOT_LIMIT_S = 300.0


def engine(spin: str, name: str) -> EngineProcess:
    spec = ModelSpec(
        name="rm",
        kind="discriminative",
        model_path=str(MODELS / "disrm"),
        engine_args={"dtype": "float32", "max_model_len": 1024, "enforce_eager": True},
        engine_env={SPIN_ENV: spin},
    )
    port = free_port()
    e = EngineProcess(plan_engine(spec, Platform("cpu", "cpu"), port=port), "127.0.0.1", port, name)
    e.start()
    return e


def cpu_s(e: EngineProcess) -> float:
    return sum(group_cpu_by_kind({"e": e.pid or 0})["e"].values())


def stream(url: str, n: int, pace_s: float, answers: list[bytes], stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        i = 0
        while (n and i < n) or (not n and not stop.is_set()):
            r = client.post(
                "/classify",
                json={"input": f"{i % 97}+{i % 13}={i % 97 + i % 13}", "use_activation": False},
            )
            r.raise_for_status()
            answers.append(r.content.split(b'"data":', 1)[1])
            i += 1
            time.sleep(pace_s)


def one_setting(spin: str, requests: int, pace_s: float) -> dict[str, Any]:
    first = engine(spin, f"spin{spin or 'vllm'}-a")
    second: EngineProcess | None = None
    try:
        first.wait_ready(600)
        answers: list[bytes] = []
        stream(first.url, 1, 0, [], threading.Event())  # warm-up
        before, start = cpu_s(first), time.monotonic()
        stream(first.url, requests, pace_s, answers, threading.Event())
        wall = time.monotonic() - start
        used = cpu_s(first) - before
        # a second engine boots while the first keeps answering a paced stream
        stop = threading.Event()
        load = threading.Thread(target=stream, args=(first.url, 0, pace_s, [], stop), daemon=True)
        load.start()
        boot_start = time.monotonic()
        second = engine(spin, f"spin{spin or 'vllm'}-b")
        boot_s: float | None
        try:
            second.wait_ready(BOOT_LIMIT_S)
            boot_s = round(time.monotonic() - boot_start, 1)
        except EngineStartError:  # not up within the limit: recorded as such
            boot_s = None
        stop.set()
        load.join(timeout=120)
    finally:
        for e in (first, second):
            if e is not None and e.proc is not None:
                stop_process_group(e.proc, grace_s=10)
    return {
        "spin_env": spin or "(unset: vLLM's 1 s)",
        "requests": requests,
        "pace_s": pace_s,
        "engine_cpu_s": round(used, 2),
        "wall_s": round(wall, 2),
        "cores_busy": round(used / wall, 3),
        "second_engine_boot_s_under_stream": boot_s,
        "boot_limit_s": BOOT_LIMIT_S,
        "answers": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--pace-s", type=float, default=0.25)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "reports" / f"engine_spin-{datetime.date.today()}.json",
    )
    args = parser.parse_args()
    runs = [one_setting(spin, args.requests, args.pace_s) for spin in ("", "0.002")]
    differing = sum(a != b for a, b in zip(runs[0]["answers"], runs[1]["answers"]))
    for r in runs:
        r["answers"] = len(r.pop("answers"))
        boot = r["second_engine_boot_s_under_stream"]
        print(
            f"{r['spin_env']:>24}: {r['engine_cpu_s']:6.2f} CPU-s in {r['wall_s']:5.1f} s "
            f"({r['cores_busy']:.2f} cores); a second engine beside the stream: "
            + (f"up in {boot} s" if boot is not None else f"not up in {BOOT_LIMIT_S:.0f} s")
        )
    print(f"answers differing in bits between the two: {differing} of {runs[0]['answers']}")
    result = {
        "command": "python -m benchmarks.engine_spin "
        f"--requests {args.requests} --pace-s {args.pace_s}",
        "date": str(datetime.date.today()),
        "runs": runs,
        "answers_differing": differing,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
