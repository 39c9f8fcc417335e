"""An engine between requests does not hold a core (``deployments.engine.vllm_server``).

vLLM's engine processes spin for a second after every message; an engine answering a
request every 250 ms then spins without pause (measured: 11 CPU-seconds in 10.7 s, one
whole core, against under one with the bound), and on a 2-core host two such engines
leave nothing for a third to boot. The plain engine (``determinism: off``, planned for
a CPU host like every slot's) answers a paced stream; its process group must use well
under half a core.
"""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.harness.cpu_accounting import group_cpu_by_kind

pytestmark = pytest.mark.integration

REQUESTS, PACE_S = 24, 0.25
#: Busy cores allowed: a request costs the engine a few ms; the unbounded spin costs 1.0.
MAX_CORES = 0.5


def test_a_paced_engine_does_not_spin_between_requests(plain_engine):
    engine, _ = plain_engine
    engine.wait_ready(600)
    group = {"engine": engine.pid}
    with httpx.Client(base_url=engine.url, timeout=60) as client:
        client.post("/classify", json={"input": "warm-up 0+0=0", "use_activation": False})
        before = sum(group_cpu_by_kind(group)["engine"].values())
        start = time.monotonic()
        for i in range(REQUESTS):
            r = client.post(
                "/classify", json={"input": f"idle cpu {i}+{i}={2 * i}", "use_activation": False}
            )
            assert r.status_code == 200, r.text
            time.sleep(PACE_S)
        wall = time.monotonic() - start
        used = sum(group_cpu_by_kind(group)["engine"].values()) - before
    cores = used / wall
    print(f"engine group: {used:.2f} CPU-s in {wall:.1f} s = {cores:.2f} cores")
    assert cores < MAX_CORES, f"the engine spun between requests: {cores:.2f} cores busy"
