"""The canary against a scripted slot transport: a slot whose probe answers change leaves
its class (drained under strict, its keys to its class mate) and comes back when they match."""

from __future__ import annotations

import json

import httpx

from deployments.engine.numerics import probe_digest
from gateway.core.config.settings import AppConfig, GatewaySettings
from gateway.core.routing.placement import place_in_class
from gateway.core.routing.slots import SlotTable
from gateway.serve.canary import Canary
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.slot_transport import SlotTransport
from tests.unit.test_routing import FakeClock, FakeHandle

CFG = AppConfig.model_validate(
    {"models": [{"name": "m", "kind": "discriminative", "model_path": "/m", "replicas": 2}]}
)


def engine(scales: dict[str, float]):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(
            200,
            json={"data": [{"index": 0, "probs": [len(body["input"]) * scales[request.url.host]]}]},
        )

    return httpx.MockTransport(handler)


async def test_a_drifted_slot_leaves_its_class_and_comes_back():
    scales = {"a": 1.0, "b": 1.0}
    digest = probe_digest("http://a", "discriminative", "m", transport=engine(scales))
    clock = FakeClock()
    handles = {"m": [FakeHandle("http://a"), FakeHandle("http://b")]}
    for h in handles["m"]:
        h.info["numerics"] = {"class_id": "A", "probe_digest": digest}
    slots = SlotTable({"m": 2})
    t = SlotTransport(
        handles,
        GatewaySettings(),
        slots,
        clock=clock,
        sleep=clock.sleep,
        engine_client=HttpxEngineClient(httpx.AsyncClient(transport=engine(scales))),
    )
    canary = Canary(CFG, t, slots)
    assert [v.outcome for v in await canary.check_all()] == ["match", "match"]

    scales["b"] = 1.0 + 1e-12  # slot 1's arithmetic changed by one ulp-ish
    verdicts = await canary.check_all()
    assert [v.outcome for v in verdicts] == ["match", "drift"]
    assert verdicts[1].observed != verdicts[1].expected
    view = t.slot_view("m", 2)
    assert view.classes.classes[1].startswith("drift-")
    assert view.classes.drained(1) and "canary" in view.classes.drain_reason(1)
    key_of_1 = next(
        k
        for k in range(10_000)
        if place_in_class(
            k, view.classes, {}, failover="wait", slot_wait_s=1, failover_after_s=1, load_bound=1.25
        ).home
        == 1
    )
    p = place_in_class(
        key_of_1,
        view.classes,
        {},
        failover="wait",
        slot_wait_s=1,
        failover_after_s=1,
        load_bound=1.25,
    )
    assert p.candidates == ((0, 1),) and p.reason == "drained"  # to its class mate

    scales["b"] = 1.0
    assert [v.outcome for v in await canary.check_all()] == ["match", "readmitted"]
    assert t.slot_view("m", 2).classes.classes == ("A", "A")


async def test_strict_drains_a_drifted_slot_among_three():
    scales = {"a": 1.0, "b": 1.0, "c": 2.0}
    digest = probe_digest("http://a", "discriminative", "m", transport=engine(scales))
    clock = FakeClock()
    handles = {"m": [FakeHandle(f"http://{h}") for h in "abc"]}
    for h in handles["m"]:
        h.info["numerics"] = {"class_id": "A", "probe_digest": digest}
    cfg = AppConfig.model_validate(
        {"models": [{"name": "m", "kind": "discriminative", "model_path": "/m", "replicas": 3}]}
    )
    slots = SlotTable({"m": 3})
    t = SlotTransport(
        handles,
        GatewaySettings(),
        slots,
        clock=clock,
        sleep=clock.sleep,
        engine_client=HttpxEngineClient(httpx.AsyncClient(transport=engine(scales))),
    )
    verdicts = await Canary(cfg, t, slots).check_all()
    assert [v.outcome for v in verdicts] == ["match", "match", "drift"]
    classes = t.slot_view("m", 3).classes
    assert classes.drained(2) and "canary" in classes.drain_reason(2)
    assert classes.mates(2) == [0, 1]


async def test_a_slot_that_restarts_during_its_check_is_not_judged():
    """Probes answered by a restarted engine (other numerics) must not be held against the
    digest the old engine reported: that is the new engine's start-up business."""
    scales = {"a": 1.0, "b": 1.0, "b2": 2.0}
    digest = probe_digest("http://a", "discriminative", "m", transport=engine(scales))
    clock = FakeClock()
    handles = {"m": [FakeHandle("http://a"), FakeHandle("http://b")]}
    for pid, h in enumerate(handles["m"]):
        h.info.update(numerics={"class_id": "A", "probe_digest": digest}, engine_pid=pid)
    slots = SlotTable({"m": 2})

    def restarting(request: httpx.Request) -> httpx.Response:
        if request.url.host == "b":  # the old engine is gone; the replica now reports b2
            handles["m"][1].info.update(
                url="http://b2", engine_pid=7, numerics={"class_id": "B", "probe_digest": "x"}
            )
            raise httpx.ConnectError("refused")
        return engine(scales).handler(request)

    t = SlotTransport(
        handles,
        GatewaySettings(),
        slots,
        clock=clock,
        sleep=clock.sleep,
        engine_client=HttpxEngineClient(
            httpx.AsyncClient(transport=httpx.MockTransport(restarting))
        ),
    )
    canary = Canary(CFG, t, slots)
    await t.describe("m", 1, 5)  # the old engine, cached
    verdict = await canary.check("m", 1)
    assert verdict.outcome == "restarted"
    assert t.directory.known_class("m", 1) == "B"  # its own report, no drift verdict
