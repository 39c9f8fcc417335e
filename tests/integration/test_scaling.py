"""Deterministic scaling end to end: rm 2 -> 3 (`rmgate scale`) -> 2 (`serve deploy`).

Under a steady, paced load (a saturating one only makes the new engine boot for minutes):
no request is lost or answered with other bits, only keys that jump hashing moves change
slot (and only onto the new slot), the surviving slots' engines and the ingress are not
restarted, and results are bitwise equal before, during and after.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.core.routing.hashing import slot_for_key
from gateway.harness.running import dashboard_address, metric_total
from tests.integration.conftest import REPO, TEST_CONFIG

pytestmark = pytest.mark.integration

TEXTS = [f"{a}+{b}={c}" for a in range(10) for b in range(10) for c in range(0, 19, 5)][:200]
BIN = Path(sys.executable).parent


def dashboard() -> str:
    return dashboard_address(Path(os.environ["RMGATE_TEST_SERVE_LOG"]))


def engine_logs(prefix: str) -> list[str]:
    return sorted(
        p.name
        for p in (Path(os.environ["RMGATE_TEST_LOG_ROOT"]) / "engines").glob(f"{prefix}-*.log")
    )


async def classify_all(url: str, texts: list[str]) -> dict[str, tuple[int, int, list[float]]]:
    """text -> (key, slot, probs), at concurrency 16."""
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(text: str):
            async with sem:
                r = await client.post(url + "/classify", json={"model": "rm", "input": text})
            assert r.status_code == 200, r.text
            return text, (
                int(r.headers["x-rmgate-key"], 16),
                int(r.headers["x-rmgate-slot"]),
                r.json()["data"][0]["probs"],
            )

        return dict(await asyncio.gather(*(one(t) for t in texts)))


#: The load: WORKERS clients, each pausing PACE_S between requests: a steady stream
#: (~8 requests/s) through the whole scale event, not a saturating one, so that the new
#: slot's engine boots in about a minute on two cores instead of waiting minutes behind
#: the serving engines (each DisRM request costs them ~25 ms of CPU).
WORKERS, PACE_S = 2, 0.25


class Load(threading.Thread):
    """Sends the texts round and round (WORKERS at once, paced) until stopped; keeps every
    answer."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.answers, self.errors = url, threading.Event(), [], []

    def run(self) -> None:
        async def worker(w: int, client: httpx.AsyncClient) -> None:
            i = w
            while not self.stop.is_set():
                text = TEXTS[i % len(TEXTS)]
                r = await client.post(self.url + "/classify", json={"model": "rm", "input": text})
                if r.status_code == 200:
                    self.answers.append(
                        (text, int(r.headers["x-rmgate-slot"]), r.json()["data"][0]["probs"])
                    )
                else:
                    self.errors.append((r.status_code, r.text[:300]))
                i += 2 * WORKERS
                await asyncio.sleep(PACE_S)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=900) as client:
                await asyncio.gather(*(worker(w, client) for w in range(WORKERS)))

        asyncio.run(main())


def serve_status(address: str) -> str:
    return subprocess.run(
        [str(BIN / "serve"), "status", "--address", address],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    ).stdout


def run_under_load(
    url: str, cmd: list[str], timeout_s: float, until: Callable[[], bool] = lambda: True
) -> tuple[Load, str]:
    """Run ``cmd`` while the load runs, then keep the load on until ``until()`` holds."""
    load = Load(url)
    load.start()
    try:
        out = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "RAY_AUTH_MODE": "token"},
        )
        assert out.returncode == 0, out.stdout + out.stderr
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "the change was not applied in time"
            time.sleep(2)
    finally:
        load.stop.set()
        load.join(timeout=900)
    return load, out.stdout


def slots_of(url: str, model: str) -> int:
    cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
    return next(c for c in cards if c["id"] == model)["slots"]


async def test_scale_rm_2_3_2_under_load(gateway, gateway_direct_url, tmp_path):
    url, _ = gateway
    address = dashboard()
    base = await classify_all(url, TEXTS)
    assert {slot for _, slot, _ in base.values()} == {0, 1}
    logs_before = {s: engine_logs(f"rm-{s}") for s in (0, 1)}
    requests_before = metric_total(url, "rmgate_requests_total")
    scaled_up = False
    try:
        # 2 -> 3 with the convenience command, while 4 clients keep sending
        load, out = run_under_load(
            url, [str(BIN / "rmgate"), "scale", "rm", "3", "--address", address], 1200
        )
        scaled_up = True
        assert "rm: 2 -> 3 slots" in out
        assert not load.errors, load.errors[:5]
        assert load.answers and all(base[t][2] == probs for t, _, probs in load.answers)
        assert slots_of(url, "rm") == 3
        # the new slot started one engine: where rm's prefix-cache check failed on this host,
        # the verdict was remembered (deployments/engine/prefix_verdicts.py)
        assert len(engine_logs("rm-2")) == 1, engine_logs("rm-2")
        up = await classify_all(url, TEXTS)
        moved = [t for t in TEXTS if up[t][1] != base[t][1]]
        assert all(up[t][1] == 2 for t in moved), "a key moved between old slots"
        assert all(up[t][1] == slot_for_key(up[t][0], 3) for t in TEXTS)
        assert 0 < len(moved) / len(TEXTS) <= 1 / 3 + 0.01, len(moved)
        assert all(up[t][2] == base[t][2] for t in TEXTS), "results changed after scaling"
        print(
            f"2->3: {len(moved)}/{len(TEXTS)} keys moved, {len(load.answers)} requests "
            f"answered during the scale-up, 0 errors"
        )

        # 3 -> 2 by re-applying the config (replicas: 2) with Serve's own `serve deploy`
        rendered = tmp_path / "serve.yaml"
        port = int(url.rsplit(":", 1)[1])
        # as the session gateway was started: its port and its direct port (another
        # ingress argument would redeploy the ingress)
        subprocess.run(
            [
                str(BIN / "rmgate"),
                "render",
                str(TEST_CONFIG),
                "--port",
                str(port),
                "--direct-port",
                gateway_direct_url.rsplit(":", 1)[1],
                "-o",
                str(rendered),
            ],
            cwd=REPO,
            check=True,
            timeout=120,
        )
        assert yaml.safe_load(rendered.read_text())["applications"][0]["name"] == "rmgate"
        load, _ = run_under_load(
            url,
            [str(BIN / "serve"), "deploy", str(rendered), "--address", address],
            300,
            until=lambda: slots_of(url, "rm") == 2 and "rm-2" not in serve_status(address),
        )
        scaled_up = False
        assert not load.errors, load.errors[:5]
        assert all(base[t][2] == probs for t, _, probs in load.answers)
        down = await classify_all(url, TEXTS)
        assert {t: v[1] for t, v in down.items()} == {t: v[1] for t, v in base.items()}
        assert all(down[t][2] == base[t][2] for t in TEXTS)
        # neither surviving engine nor the ingress restarted (its counters only grew)
        assert {s: engine_logs(f"rm-{s}") for s in (0, 1)} == logs_before
        assert metric_total(url, "rmgate_requests_total") > requests_before
    finally:
        if scaled_up or slots_of(url, "rm") != 2:  # leave the session gateway as we found it
            subprocess.run(
                [str(BIN / "rmgate"), "scale", "rm", "2", "--address", address],
                cwd=REPO,
                timeout=600,
                env={**os.environ, "RAY_AUTH_MODE": "token"},
            )
