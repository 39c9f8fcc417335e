"""The ledger's cache through the HTTP app (fake engines, a real SQLite file and a real
PostgreSQL server, each test on both): hits are
the recorded bytes, identical requests in flight make one engine call, a leader that goes
away fails nobody, ``x-rmgate-cache: off`` and ``determinism: off`` reach the engine, an
unknown class is never cached, receipts find their rows, invalidation stops hits."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.ledger_policy.identity import reward_identity
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.engine_access import SlotInfo, SlotView
from gateway.core.routing.keys import canonical_json
from gateway.core.routing.numerics import ModelClasses
from gateway.core.service import RewardService
from gateway.http.app import create_app
from gateway.ledger.ledger import Ledger
from gateway.ledger.sqlite_store import SqliteLedger
from gateway.ledger.writer import LedgerWriter

CONFIG = {
    "models": [
        {
            "name": "judge",
            "kind": "generative",
            "model_path": "/m/grm",
            "replicas": 2,
            "sampling_defaults": {"max_tokens": 8},
        },
        {"name": "rm", "kind": "discriminative", "model_path": "/m/disrm", "replicas": 2},
        {"name": "loose", "kind": "discriminative", "model_path": "/m/disrm", "determinism": "off"},
    ],
    "gateway": {"placement": "pinned", "default_reward_model": "rm"},
}


class CountingEngines:
    """Answers like vLLM, counts calls, can hold every call until released."""

    def __init__(self, classes: tuple[str | None, ...] = ("A", "A")) -> None:
        self.calls = 0
        self.classes = classes
        self.release = asyncio.Event()
        self.release.set()

    async def post(
        self, model: str, placement, path: str, body: bytes, deadline: Deadline
    ) -> EngineReply:
        self.calls += 1
        await self.release.wait()
        data = json.loads(body)
        slot = placement.first
        cls = self.classes[slot] if model != "loose" else "L"
        if path == "/classify":
            # a fresh float each call: a hit must return the recorded bytes, not new ones
            size = len(json.dumps(data.get("input") or data.get("messages")))
            out = {"data": [{"index": 0, "probs": [size + self.calls / 1e6]}]}
        else:
            out = {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"9 call {self.calls}"},
                    }
                ]
            }
        return EngineReply(200, json.dumps(out).encode(), f"fp-{slot}", slot, cls)

    async def describe(self, model, slot, timeout_s):
        return SlotInfo(
            model=model,
            slot=slot,
            url="http://x",
            fingerprint=f"fp-{slot}",
            mode="serialize",
            max_inflight=1,
        )

    async def health(self, model, slot, timeout_s):
        return "healthy"

    def slot_view(self, model: str, slots: int) -> SlotView:
        return SlotView(ModelClasses(self.classes[:slots] if model != "loose" else ("L",)))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """A fresh ledger store: an SQLite file, or a new database on a throwaway PostgreSQL
    server (``tests/conftest.py``)."""
    if request.param == "sqlite":
        return SqliteLedger(tmp_path / "ledger.sqlite3")
    return request.getfixturevalue("postgres_ledger")


@pytest.fixture
async def setup(store):
    engines = CountingEngines()
    ledger = Ledger(store, LedgerWriter(store, flush_interval_s=0.01), recent=1000)
    ledger.writer.start()
    gw = RewardService(AppConfig.model_validate(CONFIG), engines, ledger=ledger)
    app = create_app(gw, ledger=ledger)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gw"
    ) as client:
        yield client, engines, ledger
    await ledger.writer.aclose()


async def test_a_hit_is_the_recorded_answer_without_an_engine_call(setup):
    client, engines, ledger = setup
    first = await client.post("/classify", json={"model": "rm", "input": "abc"})
    assert first.headers["x-rmgate-cache"] == "miss" and engines.calls == 1
    receipt = first.headers["x-rmgate-receipt"]
    body = canonical_json({"input": "abc", "model": "rm"})
    assert receipt == reward_identity("rm", "A", "/classify", body)
    again = await client.post("/classify", json={"input": "abc", "model": "rm"})
    assert again.headers["x-rmgate-cache"] == "hit" and engines.calls == 1
    assert again.content == first.content  # the recorded bytes
    assert again.headers["x-rmgate-receipt"] == receipt
    assert again.headers["x-rmgate-slot"] == first.headers["x-rmgate-slot"]
    # the store answers after memory forgets it
    await ledger.writer.flush()
    ledger.recent.forget("rm")
    third = await client.post("/classify", json={"model": "rm", "input": "abc"})
    assert third.headers["x-rmgate-cache"] == "hit" and third.content == first.content
    row = (await client.get(f"/v1/ledger/{receipt}")).json()
    assert row["answer"] == first.text and row["slot"] == int(first.headers["x-rmgate-slot"])
    assert (
        row["numerics_class"] == "A"
        and row["score"] == json.loads(first.content)["data"][0]["probs"][0]
    )
    assert json.loads(row["body"]) == {"input": "abc", "model": "rm"}


async def test_identical_requests_in_flight_make_one_engine_call(setup):
    client, engines, _ = setup
    engines.release.clear()
    tasks = [
        asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json={"model": "judge", "messages": [{"role": "user", "content": "same"}]},
            )
        )
        for _ in range(64)
    ]
    while engines.calls < 1:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    engines.release.set()
    answers = await asyncio.gather(*tasks)
    assert engines.calls == 1
    assert len({a.content for a in answers}) == 1
    outcomes = [a.headers["x-rmgate-cache"] for a in answers]
    # one leader; the rest shared its flight, or (their store lookup ending after it) hit
    assert outcomes.count("miss") == 1 and set(outcomes) <= {"miss", "shared", "hit"}
    assert outcomes.count("shared") >= 1


async def test_the_leader_going_away_fails_no_waiter(setup):
    client, engines, _ = setup
    engines.release.clear()
    body = {"model": "rm", "input": "lead"}
    leader = asyncio.create_task(client.post("/classify", json=body))
    while engines.calls < 1:
        await asyncio.sleep(0.01)
    waiters = [asyncio.create_task(client.post("/classify", json=body)) for _ in range(4)]
    await asyncio.sleep(0.05)
    leader.cancel()  # its client went away
    await asyncio.sleep(0.05)
    engines.release.set()
    answers = await asyncio.gather(*waiters)
    assert all(a.status_code == 200 for a in answers)
    assert len({a.content for a in answers}) == 1
    assert engines.calls == 2  # the leader's call, abandoned, and one waiter's


async def test_cache_off_per_request_and_determinism_off_reach_the_engine(setup):
    client, engines, _ = setup
    await client.post("/classify", json={"model": "rm", "input": "x"})
    off = await client.post(
        "/classify", json={"model": "rm", "input": "x"}, headers={"x-rmgate-cache": "off"}
    )
    assert engines.calls == 2 and "x-rmgate-cache" not in off.headers
    assert off.headers["x-rmgate-receipt"]  # recorded all the same (the first row is kept)
    for _ in range(2):
        loose = await client.post("/classify", json={"model": "loose", "input": "y"})
        assert "x-rmgate-cache" not in loose.headers
    assert engines.calls == 4


async def test_an_unknown_class_is_never_cached_nor_named(setup):
    client, engines, _ = setup
    engines.classes = (None, None)
    for _ in range(2):
        r = await client.post("/classify", json={"model": "rm", "input": "u"})
        assert r.headers["x-rmgate-cache"] == "miss" and "x-rmgate-receipt" not in r.headers
    assert engines.calls == 2


async def test_another_class_misses(setup):
    client, engines, _ = setup
    await client.post("/classify", json={"model": "rm", "input": "up"})
    engines.classes = ("B", "B")  # an upgrade: every slot of another class
    r = await client.post("/classify", json={"model": "rm", "input": "up"})
    assert r.headers["x-rmgate-cache"] == "miss" and engines.calls == 2


async def test_rewards_details_carry_receipts_and_invalidation_stops_hits(setup):
    client, engines, ledger = setup
    items = {"items": [{"prompt": "p", "response": f"r{i}"} for i in range(3)]}
    first = (await client.post("/v1/rewards", json=items)).json()
    receipts = [d["receipt"] for d in first["details"]]
    assert len(set(receipts)) == 3 and all(d["cache"] == "miss" for d in first["details"])
    second = (await client.post("/v1/rewards", json=items)).json()
    assert second["rewards"] == first["rewards"]
    assert [d["cache"] for d in second["details"]] == ["hit"] * 3
    await ledger.writer.flush()
    assert await ledger.invalidate("rm", "A") == 3
    third = (await client.post("/v1/rewards", json=items)).json()
    assert [d["cache"] for d in third["details"]] == ["miss"] * 3
    assert engines.calls == 6
    await ledger.writer.flush()
    assert ledger.store.get(receipts[0]) is not None  # the fresh answer replaced it


async def test_a_receipt_that_is_not_one_is_a_clear_error(setup):
    client, _, _ = setup
    assert (await client.get("/v1/ledger/zz")).json()["error"]["code"] == "invalid_request"
    missing = await client.get("/v1/ledger/" + "0" * 64)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "receipt_not_found"


async def test_a_request_that_looked_while_its_twin_was_answered_makes_no_second_call(setup):
    """A store lookup takes a thread hop: a request whose lookup ends after its twin's
    flight has ended finds the twin's answer in memory, not a reason to call again."""
    client, engines, ledger = setup
    slow_get = ledger.store.get

    def get(identity, **kw):
        import time

        time.sleep(0.2)
        return slow_get(identity, **kw)

    ledger.store.get = get
    body = {"model": "rm", "input": "twins"}
    first = asyncio.create_task(client.post("/classify", json=body))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(client.post("/classify", json=body))
    a, b = await asyncio.gather(first, second)
    assert engines.calls == 1 and a.content == b.content
    assert a.headers["x-rmgate-cache"] == "miss" and b.headers["x-rmgate-cache"] == "hit"


async def test_a_hit_returns_the_first_recorded_bytes_whatever_was_computed_since(setup):
    """Answers computed with the cache off are recorded, but the store keeps the first of
    an identity, so memory must not hold a later one: a hit returns the kept row."""
    client, engines, ledger = setup
    body = {"model": "rm", "input": "first wins"}
    first = await client.post("/classify", json=body, headers={"x-rmgate-cache": "off"})
    second = await client.post("/classify", json=body, headers={"x-rmgate-cache": "off"})
    assert first.content != second.content  # this fake answers each call anew
    await ledger.writer.flush()
    hit = await client.post("/classify", json=body)
    assert hit.headers["x-rmgate-cache"] == "hit" and hit.content == first.content


@pytest.mark.parametrize(
    "setting,asked,allowed",
    [
        ("on", None, True),
        ("on", True, True),
        ("on", False, False),
        ("opt_in", None, False),
        ("opt_in", True, True),
        ("opt_in", False, False),
        ("off", None, False),
        ("off", True, False),
        ("off", False, False),
    ],
)
def test_who_decides_whether_the_cache_answers(setting, asked, allowed):
    from gateway.core.ledger_policy.reuse import cache_decision

    assert cache_decision(setting, asked) is allowed


async def test_opt_in_answers_from_the_ledger_only_those_who_ask(store):
    engines = CountingEngines()
    ledger = Ledger(store, LedgerWriter(store, flush_interval_s=0.01), recent=1000)
    config = {**CONFIG, "gateway": {**CONFIG["gateway"], "cache": "opt_in"}}
    gw = RewardService(AppConfig.model_validate(config), engines, ledger=ledger)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    ) as client:
        body = {"model": "rm", "input": "opt in"}
        plain = [await client.post("/classify", json=body) for _ in range(2)]
        assert engines.calls == 2 and all("x-rmgate-cache" not in r.headers for r in plain)
        await ledger.writer.flush()  # recorded, not remembered: the store answers
        asked = await client.post("/classify", json=body, headers={"x-rmgate-cache": "on"})
        assert asked.headers["x-rmgate-cache"] == "hit" and engines.calls == 2
        assert asked.content == plain[0].content  # the first recorded answer
    await ledger.writer.aclose()
