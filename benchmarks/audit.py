"""What the continuous audit costs a trainer, and how fast it catches a slot that is off.

Two real ``rmgate serve`` runs of the demo DisRM (two slots), the same closed-loop load
of distinct ``/classify`` requests at ``--concurrency`` (the engines kept full), one
variable between them: ``gateway.audit.sample`` 0 (off) then ``--sample``, ``--rounds``
pairs in turn (the machine's drift hits both). Printed side by side: the trainer's requests per second and latency percentiles, and in the audited run the
re-answers made and skipped (their queue overflows when no slot is ever idle: audits wait
for idle slots, so under full load they yield).

``config()`` is also the end-to-end test's gateway (``tests/integration/test_audit_e2e.py``):
a clean model and one whose slot 1 nudges every second answer by one ulp
(``deployments.engine.fault``), its fingerprint unchanged.

    .venv/bin/python -m benchmarks.audit [--seconds 60] [--concurrency 8] [--sample 1.0]
        [--rounds 2] [--out benchmarks/reports/audit-DATE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from deployments.engine.fault import FAULT_ENV
from gateway.harness.processes import NO_CACHE
from gateway.harness.running import REPO, metric_total, running_gateway, serve_config

ENGINE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}


def model(name: str, path: Path, fault: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "discriminative",
        "model_path": str(path),
        "replicas": 2,
        "determinism": "auto",
        "engine_args": ENGINE,
        "engine_env": {FAULT_ENV: fault} if fault else {},
        "cpu_cores_per_slot": 1,
    }


def config(
    disrm: Path, state_dir: Path, sample: float, with_fault: bool, max_per_minute: int = 600
) -> dict[str, Any]:
    """``rm`` (two slots of one class); with ``with_fault`` also ``rm_bad``, whose slot 1
    answers every second ``/classify`` one ulp off."""
    models = [model("rm", disrm)] + ([model("rm_bad", disrm, "1:2")] if with_fault else [])
    return serve_config(
        {
            "gateway": {
                "slot_wait_s": 180,
                "canary_interval_s": 0,
                "ledger": {"state_dir": str(state_dir)},
                "audit": {"sample": sample, "max_per_minute": max_per_minute},
            },
            "models": models,
        }
    )


async def load(url: str, model: str, seconds: float, concurrency: int, tag: str) -> list[float]:
    """Distinct requests, closed loop, for ``seconds``: each one's latency."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    count = iter(range(10**9))

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            text = f"{tag} {next(count)}+{concurrency}="
            t0 = time.monotonic()
            r = await client.post(
                url + "/classify", json={"model": model, "input": text}, headers=NO_CACHE
            )
            r.raise_for_status()
            latencies.append(time.monotonic() - t0)

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return latencies


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "req_s": round(len(latencies) / seconds, 2),
        "p50_ms": round(q[49] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
    }


def run(sample: float, seconds: float, concurrency: int, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"audit-{sample}.yaml"
    path.write_text(
        yaml.safe_dump(config(REPO / "models/demo/disrm", work / f"state-{sample}", sample, False))
    )
    with running_gateway(path, work / f"run-{sample}") as (url, _):
        asyncio.run(load(url, "rm", 5, concurrency, "warm"))
        lat = asyncio.run(load(url, "rm", seconds, concurrency, f"s{sample}"))
        audit = httpx.get(url + "/v1/audit", timeout=30).json()
        skipped = metric_total(url, "rmgate_audit_skipped_total")
    return {
        "sample": sample,
        **summary(lat, seconds),
        "audits": {k: sum(c[k] for c in audit["classes"]) for k in ("same", "different", "failed")},
        "audit_skipped": skipped,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--sample", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2, help="Pairs of runs, off then on.")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):  # off, on, off, on...: the machine's drift hits both
            for sample in (0.0, args.sample):
                runs.append(run(sample, args.seconds, args.concurrency, Path(tmp) / str(i)))
    off = [r for r in runs if r["sample"] == 0.0]
    on = [r for r in runs if r["sample"] != 0.0]

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.fmean(r[key] for r in rows)

    result = {
        "command": "python -m benchmarks.audit "
        f"--seconds {args.seconds:g} --concurrency {args.concurrency} --sample {args.sample:g} "
        f"--rounds {args.rounds}",
        "runs": runs,
        "req_s_on_over_off": round(mean(on, "req_s") / mean(off, "req_s"), 3),
        "p50_on_over_off": round(mean(on, "p50_ms") / mean(off, "p50_ms"), 3),
        "p99_on_over_off": round(mean(on, "p99_ms") / mean(off, "p99_ms"), 3),
        "per_round_req_s_on_over_off": [
            round(b["req_s"] / a["req_s"], 3) for a, b in zip(off, on, strict=True)
        ],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
