"""Same requests, other orders and concurrency: bitwise-equal rewards, same slots."""

from __future__ import annotations

import pytest

from gateway.client.check import disrm_calls, grm_calls, replay, shuffled

pytestmark = pytest.mark.integration

#: (shuffle seed, concurrency): two orders, one request at a time against 32 in flight.
#: Longer replays (more orders, more requests) are `rmgate check --repeats N` and the
#: benchmarks' job, not the suite's.
RUNS = [(1, 1), (2, 32)]
#: Requests per kind: the GRM's answer 12 tokens each on serialized engines.
SIZES = {"grm": 120, "disrm": 200}


@pytest.mark.parametrize("kind", ["grm", "disrm"])
async def test_replays_are_bitwise_identical(gateway, kind):
    url, _ = gateway
    calls = grm_calls(SIZES[kind]) if kind == "grm" else disrm_calls(SIZES[kind])
    runs = [await replay(url, calls, shuffled(len(calls), s), c) for s, c in RUNS]
    first = runs[0]
    assert all(r.status == 200 for r in first.values()), [
        r.essence for r in first.values() if r.status != 200
    ][:3]
    for run in runs[1:]:
        differing = [i for i in first if run[i].essence != first[i].essence]
        assert not differing, f"{len(differing)} responses differ, e.g. {differing[:5]}"
        assert all(run[i].slot == first[i].slot for i in first)
        assert all(run[i].seed == first[i].seed for i in first)
    # The slots are really used, and GRM requests without a seed got a derived one.
    assert len({r.slot for r in first.values() if "," not in (r.slot or "")}) == 2
    if kind == "grm":
        assert all(first[i].seed is not None for i in first)
        explicit = {i: calls[i].body["seed"] for i in first if "seed" in calls[i].body}
        assert all(first[i].seed == str(s) for i, s in explicit.items())
