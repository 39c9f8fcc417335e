"""The ingress's CPU per request, in the suite: the gateway's ASGI app over a transport that
answers at no cost, against a bare pass-through measured in the same test
(``benchmarks/ingress_cpu.py``). A ratio, never an absolute time: a change that makes every
request cost more shows here on every run.

Measured with the hot path in front of FastAPI (``gateway/http/hot_path.py``; 2 cores,
nothing else running; this test's own settings, two runs): classify 4.7-4.9x, chat
4.5-4.7x, rewards 6.7-6.8x the bare route; before it, classify 6.4-7.2x, chat 6.2-7.2x,
rewards 8.7-9.6x.
Before the API-key dependency left FastAPI's thread pool (``benchmarks/ingress_cpu.py``,
2,000 requests x 5 rounds, medians): 19.6x, 15.3x, 20.4x. The bound leaves room for a noisy
host, not for a regression of that size.
"""

from __future__ import annotations

import pytest

from benchmarks.ingress_cpu import measure

pytestmark = pytest.mark.timing  # asserts durations / CPU shares: run when the machine is quiet

#: The largest ratio accepted for any of the three requests.
BOUND = 11.0


async def test_the_ingress_costs_a_bounded_multiple_of_a_bare_route():
    result = await measure(requests=400, rounds=5)
    print({name: r["ratio"] for name, r in result.items()})
    assert set(result) == {"classify", "chat", "rewards"}
    for name, r in result.items():
        assert r["ratio"] < BOUND, (name, r)
