"""Single flight and reward identities: one call per identity in flight, nobody fails
because another client went away."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.ledger_policy.identity import reward_identity
from gateway.core.ledger_policy.single_flight import SingleFlight


def test_identity_names_model_class_path_and_body():
    base = reward_identity("rm", "c1", "/classify", b'{"input":"x"}')
    assert len(base) == 64 and int(base, 16) >= 0
    assert base == reward_identity("rm", "c1", "/classify", b'{"input":"x"}')
    others = {
        reward_identity("rm2", "c1", "/classify", b'{"input":"x"}'),
        reward_identity("rm", "c2", "/classify", b'{"input":"x"}'),
        reward_identity("rm", "c1", "/pooling", b'{"input":"x"}'),
        reward_identity("rm", "c1", "/classify", b'{"input":"y"}'),
        reward_identity("r", "mc1", "/classify", b'{"input":"x"}'),
    }  # no ambiguity
    assert base not in others and len(others) == 5


async def test_a_burst_of_identical_requests_makes_one_call():
    flights: SingleFlight[str, bytes] = SingleFlight()
    calls = 0
    release = asyncio.Event()

    async def call() -> bytes:
        nonlocal calls
        calls += 1
        await release.wait()
        return b"answer"

    tasks = [asyncio.ensure_future(flights.run("id", call)) for _ in range(64)]
    await asyncio.sleep(0.01)
    release.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1 and {v for v, _ in results} == {b"answer"}
    assert sum(shared for _, shared in results) == 63 and len(flights) == 0


async def test_the_leaders_client_leaving_does_not_fail_the_others():
    flights: SingleFlight[str, bytes] = SingleFlight()
    calls = 0
    started = asyncio.Event()

    async def call() -> bytes:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.sleep(0.05)
        return b"answer"

    leader = asyncio.ensure_future(flights.run("id", call))
    await started.wait()
    waiters = [asyncio.ensure_future(flights.run("id", call)) for _ in range(3)]
    await asyncio.sleep(0)
    leader.cancel()  # its client went away mid-call
    results = await asyncio.gather(*waiters)
    assert [v for v, _ in results] == [b"answer"] * 3
    assert calls == 2  # one waiter took over, the other two shared its call
    with pytest.raises(asyncio.CancelledError):
        await leader


async def test_a_waiter_that_leaves_does_not_disturb_the_flight():
    flights: SingleFlight[str, int] = SingleFlight()

    async def call() -> int:
        await asyncio.sleep(0.02)
        return 7

    leader = asyncio.ensure_future(flights.run("id", call))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(flights.run("id", call))
    await asyncio.sleep(0)
    waiter.cancel()
    assert await leader == (7, False)


async def test_a_failed_leader_hands_over_and_its_error_stays_its_own():
    flights: SingleFlight[str, int] = SingleFlight()
    attempts = 0

    async def flaky() -> int:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.01)
        if attempts == 1:
            raise RuntimeError("engine gone")
        return 5

    first = asyncio.ensure_future(flights.run("id", flaky))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(flights.run("id", flaky))
    with pytest.raises(RuntimeError, match="engine gone"):
        await first
    assert await second == (5, False) and attempts == 2
