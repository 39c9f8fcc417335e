"""The ingress's CPU per request, in the suite: the gateway's ASGI app over a transport that
answers at no cost, against a bare pass-through measured in the same test
(``benchmarks/ingress_cpu.py``). A ratio, never an absolute time: a change that makes every
request cost more shows here on every run.

Measured when this test was written (2 cores, the rest of the suite idle): classify 4.9x,
chat 5.3x, rewards 6.6x the bare route (before the API-key dependency left FastAPI's thread
pool: 11.5x, 14.1x, 15.0x). The bound leaves room for a noisy host, not for a regression
of that size.
"""

from __future__ import annotations

from benchmarks.ingress_cpu import measure

#: The largest ratio accepted for any of the three requests.
BOUND = 10.0


async def test_the_ingress_costs_a_bounded_multiple_of_a_bare_route():
    result = await measure(requests=300, rounds=3)
    print({name: r["ratio"] for name, r in result.items()})
    assert set(result) == {"classify", "chat", "rewards"}
    for name, r in result.items():
        assert r["ratio"] < BOUND, (name, r)
