"""The reward ledger on a real PostgreSQL server, through the session's real gateway
(``configs/test-cpu.yaml``: cache off, every answer recorded): receipts, a server stopped
under load and started again, a full buffer while it is down, ``rmgate ledger replay``
against the same deployment (exit 0) and against plain vLLM on the wide DisRM (the negative
control: changes, exit 1).

Named to run after test_multinode.py and test_negative_control.py: the plain engine it
shares with the negative control must not be started while the two-node cluster runs (the
three together went past a 24 GB host's memory, and Ray's OOM killer took the session
gateway's Serve controller)."""

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
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "ledger", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )


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


def test_hits_from_postgresql_are_the_engines_answers_bit_for_bit(gateway, ledger_postgres):
    """``cache: opt_in`` (configs/test-cpu.yaml): 100 judge + 100 DisRM requests answered by
    the engines (and recorded), then sent again asking for the cache: every one a hit,
    byte for byte the first answer, read from PostgreSQL."""
    url, _ = gateway
    calls = [
        (
            "/v1/chat/completions",
            {
                "model": "judge",
                "max_tokens": 6,
                "messages": [{"role": "user", "content": f"pg {i}: is {i}*2={2 * i + i % 2}?"}],
            },
        )
        for i in range(100)
    ]
    calls += [("/classify", {"model": "rm", "input": f"pg {i}: {i}*3={3 * i}"}) for i in range(100)]

    async def send(headers=None) -> list[httpx.Response]:
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=600, base_url=url) as client:

            async def one(path, body):
                async with sem:
                    return await client.post(path, json=body, headers=headers)

            return list(await asyncio.gather(*(one(p, b) for p, b in calls)))

    fresh = asyncio.run(send())
    assert all(r.status_code == 200 for r in fresh)
    assert all("x-rmgate-cache" not in r.headers for r in fresh)  # opt_in, not asked
    store = PostgresLedger(ledger_postgres.dsn)
    try:
        receipts = [r.headers["x-rmgate-receipt"] for r in fresh]
        end = time.monotonic() + 30
        while any(store.get(x) is None for x in receipts[-1:] + receipts[:1]):
            assert time.monotonic() < end
            time.sleep(0.2)
    finally:
        store.close()
    time.sleep(0.5)
    cached = asyncio.run(send({"x-rmgate-cache": "on"}))
    assert [r.headers.get("x-rmgate-cache") for r in cached] == ["hit"] * len(calls)
    assert [r.content for r in cached] == [r.content for r in fresh]
    assert [r.headers["x-rmgate-receipt"] for r in cached] == receipts


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


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def test_a_full_buffer_with_the_database_down_answers_and_counts_the_loss(gateway, ledger_postgres):
    """``max_buffered: 200`` (configs/test-cpu.yaml): 300 answers with the server down are
    all answered; the rows past the bound are dropped and counted, the rest written when
    the server is back."""
    url, _ = gateway
    dropped = metric(url, "rmgate_ledger_rows_dropped_total")
    since = time.time()
    ledger_postgres.stop()
    try:

        async def send() -> list[int]:
            sem = asyncio.Semaphore(16)
            async with httpx.AsyncClient(timeout=120) as client:

                async def one(i: int) -> int:
                    async with sem:
                        return (
                            await client.post(
                                url + "/classify",
                                json={"model": "rm", "input": f"nobody records {i}"},
                            )
                        ).status_code

                return await asyncio.gather(*(one(i) for i in range(300)))

        assert asyncio.run(send()) == [200] * 300
        lost = metric(url, "rmgate_ledger_rows_dropped_total") - dropped
        assert lost >= 100, lost
    finally:
        ledger_postgres.start()
    store = PostgresLedger(ledger_postgres.dsn)
    try:
        assert wait_for_rows(store, since, int(300 - lost)) == 300 - lost
    finally:
        store.close()


@pytest.fixture(scope="module")
def plain_vllm(plain_engine):
    engine, _ = plain_engine
    engine.wait_ready(600)
    return engine.url


def test_replay_finds_no_change_on_the_same_deployment_and_changes_without_the_policy(
    gateway, ledger_postgres, plain_vllm
):
    """Record the wide DisRM's answers through rmgate, replay them to rmgate (identical,
    exit 0) and to plain vLLM under concurrency (batch and prefix-cache variance: changed,
    exit 1; tests/integration/test_negative_control.py says which shows on which CPU)."""
    import random

    url, _ = gateway
    since = time.time()
    rng = random.Random(28)
    inputs = [chr(c) for c in range(33, 97, 2)] + [
        "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(300, 470)))
        for _ in range(16)
    ]
    for x in inputs:
        # truncate_prompt_tokens -1 (to the context: no input here is longer) makes these
        # requests of their own: the negative control, earlier, recorded the one-token
        # inputs' plain bodies, and a ledger keeps an identity's first row (and its time)
        r = httpx.post(
            url + "/classify",
            json={
                "model": "rm-large",
                "input": x,
                "use_activation": False,
                "truncate_prompt_tokens": -1,
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
    store = PostgresLedger(ledger_postgres.dsn)
    try:
        assert wait_for_rows(store, since, len(inputs)) >= len(inputs)
    finally:
        store.close()
    common = ["--db", ledger_postgres.dsn, "--model", "rm-large", "--since", str(since), "-c", "16"]
    same = rmgate_ledger("replay", url, *common)
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"{len(inputs)} identical, 0 changed, 0 failed" in same.stdout, same.stdout
    # plain vLLM: the first pass batches (AVX-512: batch variance), the second also reads
    # its own prefix cache (AVX2: prefix-cache variance); one of them must show changes
    runs = [
        rmgate_ledger(
            "replay",
            plain_vllm,
            *common,
            "--plot",
            str(Path(os.environ.get("TMPDIR", "/tmp")) / "replay.png"),
        )
        for _ in range(2)
    ]
    changed = [r for r in runs if r.returncode == 1]
    assert changed, [r.stdout + r.stderr for r in runs]
    assert "changed" in changed[0].stdout and "max |diff|" in changed[0].stdout
    assert all(r.returncode in (0, 1) for r in runs), [r.stderr for r in runs]
    stats = rmgate_ledger("stats", "--db", ledger_postgres.dsn, "--json")
    assert stats.returncode == 0 and '"rm-large"' in stats.stdout, stats.stderr
