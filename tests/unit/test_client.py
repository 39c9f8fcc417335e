"""RewardClient against a scripted transport: order, retries, Retry-After, errors, timeout.

Connection reuse, close() and the context managers: tests/unit/test_client_connections.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest

from gateway.client import RetryPolicy, RewardClient, RewardRequestError, run_sync
from gateway.client.verl import _result

pytestmark = pytest.mark.timing  # asserts durations / CPU shares: run when the machine is quiet

FAST = RetryPolicy(max_attempts=5, backoff_s=0.01, max_backoff_s=0.05)


def scripted(fail_first: dict[str, list[int]] | None = None, delay_by_index: bool = False):
    """A /v1/rewards server: reward = float(response); optional scripted failures."""
    fail_first = fail_first or {}
    calls: list[dict] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        first = body["items"][0]["response"]
        script = fail_first.get(first)
        if script:
            status = script.pop(0)
            return httpx.Response(
                status,
                json={"error": {"message": "busy"}},
                headers={"Retry-After": "0"} if status in (429, 503) else {},
            )
        if delay_by_index:  # later items answer first: completion order != submission order
            await asyncio.sleep(0.02 * (10 - int(float(first)) % 10))
        return httpx.Response(
            200,
            json={
                "rewards": [float(it["response"]) for it in body["items"]],
                "details": [{"slot": 0} for _ in body["items"]],
            },
        )

    return httpx.MockTransport(handler), calls


def items(n: int) -> list[dict]:
    return [{"prompt": "p", "response": str(i)} for i in range(n)]


def test_results_in_submission_order_despite_completion_order():
    transport, _ = scripted(delay_by_index=True)
    with RewardClient("127.0.0.1:1", transport=transport, batch_size=1, concurrency=10) as c:
        assert c.score(items(20)) == [float(i) for i in range(20)]
        assert c.score(items(20)) == [float(i) for i in range(20)]  # again, same pool


def test_retries_429_503_504_then_succeeds_without_duplicates():
    transport, calls = scripted({"0": [503, 429, 504], "3": [504]})
    with RewardClient("http://x", transport=transport, batch_size=1, retry=FAST) as client:
        assert client.score(items(5)) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(calls) == 5 + 4


@pytest.mark.parametrize("status", [500, 502])
def test_500_and_502_are_not_retried(status):
    """A 500 (a bug) or a 502 (the engine failed after the gateway's own retries) would
    only fail again: raised at once, not retried."""
    transport, calls = scripted({"0": [status]})
    with RewardClient("http://x", transport=transport, batch_size=1, retry=FAST) as client:
        with pytest.raises(RewardRequestError) as err:
            client.score(items(1))
    assert err.value.status == status and len(calls) == 1


def test_each_attempt_tells_the_gateway_what_is_left_of_the_budget():
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(float(request.headers["x-rmgate-timeout"]))
        if len(seen) < 3:
            return httpx.Response(503, json={}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"rewards": [1.0], "details": [{}]})

    with RewardClient(
        "http://x", transport=httpx.MockTransport(handler), retry=FAST, timeout_s=30
    ) as client:
        assert client.score(items(1)) == [1.0]
    assert len(seen) == 3 and 29 < seen[0] <= 30 and seen[0] >= seen[1] >= seen[2]


def test_retries_stay_within_the_budget_against_a_gateway_that_keeps_refusing():
    """8 attempts of a 1 s timeout each used to take up to 8 s plus backoff; now the
    whole request, retries included, ends within its budget."""

    async def refusing(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.2)
        return httpx.Response(503, json={}, headers={"Retry-After": "0.1"})

    with RewardClient("http://x", transport=httpx.MockTransport(refusing), timeout_s=1.0) as client:
        t = time.monotonic()
        with pytest.raises(RewardRequestError, match="within its 1s budget"):
            client.score(items(1))
        assert time.monotonic() - t <= 1.0 + 0.2


def test_retry_after_is_honoured():
    policy = RetryPolicy(max_attempts=3, backoff_s=0.0, max_backoff_s=5)
    assert policy.delay(0, "2") == 2.0
    assert policy.delay(5, "100") == 5.0  # capped
    assert 0.0 <= policy.delay(3, None) <= 5.0


def test_4xx_raises_at_once():
    transport, calls = scripted({"0": [422]})
    with RewardClient("http://x", transport=transport, batch_size=1, retry=FAST) as client:
        with pytest.raises(RewardRequestError) as err:
            client.score(items(1))
    assert err.value.status == 422 and len(calls) == 1


def test_gives_up_after_the_retry_budget():
    transport, calls = scripted({"0": [503] * 10})
    with RewardClient("http://x", transport=transport, retry=FAST) as client:
        with pytest.raises(RewardRequestError, match="after 5 attempts within"):
            client.score(items(1))
    assert len(calls) == 5


def test_connection_errors_are_retried():
    attempts = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={"rewards": [1.0], "details": [{}]})

    with RewardClient("http://x", transport=httpx.MockTransport(handler), retry=FAST) as c:
        assert c.score(items(1)) == [1.0] and attempts["n"] == 3


def test_total_timeout():
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json={"rewards": [0.0], "details": [{}]})

    with RewardClient(
        "http://x", transport=httpx.MockTransport(slow), total_timeout_s=0.2
    ) as client:
        t = time.monotonic()
        with pytest.raises(RewardRequestError, match="within"):
            client.score(items(1))
        assert time.monotonic() - t < 3
        t = time.monotonic()
        with pytest.raises(RewardRequestError, match="within"):
            asyncio.run(client.ascore(items(1)))  # the async path, too
        assert time.monotonic() - t < 3


async def test_sync_api_works_inside_a_running_loop():
    transport, _ = scripted()
    async with RewardClient("http://x", transport=transport) as client:
        assert client.score(items(3)) == [0.0, 1.0, 2.0]  # called from async code
        assert await client.ascore(items(2)) == [0.0, 1.0]


def test_api_key_header_and_chat_and_classify_share_the_client():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/classify":
            return httpx.Response(200, json={"data": [{"probs": [0.0, 2.5]}]})
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    with RewardClient(
        "http://x", model="m", api_key="secret", transport=httpx.MockTransport(handler)
    ) as client:
        assert client.classify(["t"]) == [2.5]
        assert client.chat([{"messages": []}])[0]["choices"][0]["message"]["content"] == "ok"
    assert [r.headers["authorization"] for r in seen] == ["Bearer secret"] * 2
    assert json.loads(seen[1].content)["model"] == "m"


def test_run_sync_still_runs_a_coroutine():
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_sync(answer()) == 42


async def test_run_sync_inside_a_running_loop():
    async def answer() -> int:
        return 7

    assert run_sync(answer()) == 7


def test_verl_result_reads_an_int_slot():
    assert _result(1.5, {"index": 0, "key": "00000000", "slot": 3}) == {
        "score": 1.5,
        "rmgate_masked": 0.0,
        "rmgate_slot": 3,
        "rmgate_parsed": 1.0,
    }
    masked = _result(None, {"slot": 1, "mask": True, "mask_reason": "engine: 502"})
    assert masked["score"] == 0.0 and masked["rmgate_masked"] == 1.0
    assert _result(0.0, {"slot": "2", "parsed": False})["rmgate_slot"] == 2  # digit string
    assert _result(0.0, {"slot": "2", "parsed": False})["rmgate_parsed"] == 0.0
    assert _result(0.0, {})["rmgate_slot"] == 0


def test_client_imports_nothing_server_side():
    code = (
        "import sys, gateway.client, gateway.client.verl; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'torch', "
        "'fastapi', 'starlette', 'uvicorn', 'aiohttp', 'prometheus_client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
