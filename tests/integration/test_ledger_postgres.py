"""The reward ledger on a real PostgreSQL server, through the session's real gateway
(``configs/test-cpu.yaml``: cache off, every answer recorded): receipts, a server stopped
under load and started again, ``rmgate ledger replay`` against the same deployment (exit 0)
and against plain vLLM on the wide DisRM (the negative control: changes, exit 1)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.ledger.postgres_store import PostgresLedger

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def wait_for_rows(store: PostgresLedger, since: float, n: int, timeout_s: float = 30) -> int:
    end = time.monotonic() + timeout_s
    while True:
        found = sum(1 for _ in store.rows(since=since))
        if found >= n or time.monotonic() > end:
            return found
        time.sleep(0.2)


def rmgate_ledger(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


def test_receipts_name_recorded_rows(gateway, ledger_postgres):
    url, _ = gateway
    items = [{"prompt": "2+3=?", "response": f"{i}"} for i in range(4)]
    rows = {}
    for model in ("rm", "judge"):
        r = httpx.post(url + "/v1/rewards", json={"model": model, "items": items}, timeout=300)
        assert r.status_code == 200, r.text
        rows[model] = r.json()
    time.sleep(1.0)  # the writer's flush interval is 0.2 s
    for model, answer in rows.items():
        for reward, detail in zip(answer["rewards"], answer["details"]):
            got = httpx.get(f"{url}/v1/ledger/{detail['receipt']}", timeout=30)
            assert got.status_code == 200, got.text
            row = got.json()
            assert row["model"] == model and row["slot"] == detail["slot"]
            assert row["numerics_class"] == detail["numerics_class"]
            if model == "rm":
                assert row["score"] == detail["raw_score"] == reward
            else:
                assert row["text"] == detail["judge_text"]
            assert "cache" not in detail  # this gateway runs cache: off


def test_a_database_down_under_load_fails_no_request(gateway, ledger_postgres):
    url, _ = gateway
    since = time.time()
    bodies = [{"model": "rm", "input": f"pg outage {i} is fine"} for i in range(60)]

    async def send() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            async def one(i: int) -> int:
                await asyncio.sleep(i * 0.05)  # spread over ~3 s
                return (await client.post(url + "/classify", json=bodies[i])).status_code
            return await asyncio.gather(*(one(i) for i in range(len(bodies))))

    async def outage() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(ledger_postgres.stop)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(ledger_postgres.start)

    async def both() -> list[int]:
        statuses, _ = await asyncio.gather(send(), outage())
        return statuses

    statuses = asyncio.run(both())
    assert statuses == [200] * len(bodies)
    store = PostgresLedger(ledger_postgres.dsn)
    try:  # the buffered rows are written once the server is back (writer retries each 1 s)
        assert wait_for_rows(store, since, len(bodies)) == len(bodies)
    finally:
        store.close()
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert "rmgate_ledger_write_errors_total" in metrics


@pytest.fixture(scope="module")
def plain_vllm(plain_engine):
    engine, _ = plain_engine
    engine.wait_ready(600)
    return engine.url


def test_replay_finds_no_change_on_the_same_deployment_and_changes_without_the_policy(
        gateway, ledger_postgres, plain_vllm):
    """Record the wide DisRM's answers through rmgate, replay them to rmgate (identical,
    exit 0) and to plain vLLM under concurrency (batch and prefix-cache variance: changed,
    exit 1; tests/integration/test_negative_control.py says which shows on which CPU)."""
    import random
    url, _ = gateway
    since = time.time()
    rng = random.Random(28)
    inputs = [chr(c) for c in range(33, 97)] + [
        "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(300, 470)))
        for _ in range(24)]
    for x in inputs:
        r = httpx.post(url + "/classify", json={"model": "rm-large", "input": x,
                                                "use_activation": False}, timeout=120)
        assert r.status_code == 200, r.text
    store = PostgresLedger(ledger_postgres.dsn)
    try:
        assert wait_for_rows(store, since, len(inputs)) >= len(inputs)
    finally:
        store.close()
    common = ["--db", ledger_postgres.dsn, "--model", "rm-large", "--since", str(since),
              "-c", "16"]
    same = rmgate_ledger("replay", url, *common)
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"{len(inputs)} identical, 0 changed, 0 failed" in same.stdout, same.stdout
    # plain vLLM: the first pass batches (AVX-512: batch variance), the second also reads
    # its own prefix cache (AVX2: prefix-cache variance); one of them must show changes
    runs = [rmgate_ledger("replay", plain_vllm, *common, "--plot",
                          str(Path(os.environ.get("TMPDIR", "/tmp")) / "replay.png"))
            for _ in range(2)]
    changed = [r for r in runs if r.returncode == 1]
    assert changed, [r.stdout + r.stderr for r in runs]
    assert "changed" in changed[0].stdout and "max |diff|" in changed[0].stdout
    assert all(r.returncode in (0, 1) for r in runs), [r.stderr for r in runs]
    stats = rmgate_ledger("stats", "--db", ledger_postgres.dsn, "--json")
    assert stats.returncode == 0 and '"rm-large"' in stats.stdout, stats.stderr
