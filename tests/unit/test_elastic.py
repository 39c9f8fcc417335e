"""Sleep, wake and autoscaling as logic: the scale rule, the on_sleep policies in the
transport, the engine's sleep gate, the admin routes. Real engines: tests/integration/
test_sleep_wake.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from deployments.engine.sleep_gate import PROBE_HEADER, SleepGate
from gateway.core.api.errors import DeadlineExceeded, ModelAsleep, SlotUnavailable
from gateway.core.config.elastic import AutoscalingSpec
from gateway.core.config.settings import AppConfig, GatewaySettings, ModelSpec
from gateway.core.elastic.autoscale import ScaleRule
from gateway.core.elastic.sleep import action_for, engine_is_asleep, model_state
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.placement import Placement
from gateway.core.routing.slots import SlotTable
from gateway.core.service import RewardService
from gateway.http.app import create_app
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.slot_transport import SlotTransport

SPEC = AutoscalingSpec(
    min_slots=0, max_slots=4, target_ongoing_per_slot=2, upscale_delay_s=5, downscale_delay_s=30
)


# ---- the scale rule ---------------------------------------------------------------------
def test_more_slots_only_after_the_load_held_for_the_upscale_delay():
    rule = ScaleRule("rm", SPEC)
    assert rule.observe(0.0, 7, 1) is None  # asks for 4
    assert rule.observe(3.0, 3, 1) is None  # asks for 2
    d = rule.observe(5.0, 8, 1)
    assert d is not None and (d.current, d.target, d.direction) == (1, 2, "up")  # the least
    assert "ongoing" in d.reason


def test_a_dip_restarts_the_delay_and_zero_wakes_at_once():
    rule = ScaleRule("rm", SPEC)
    assert rule.observe(0.0, 5, 1) is None
    assert rule.observe(2.0, 2, 1) is None  # back to the target: the delay starts over
    assert rule.observe(6.0, 5, 1) is None
    assert rule.observe(11.0, 5, 1) is not None
    assert ScaleRule("rm", SPEC).observe(0.0, 1, 0).target == 1  # from zero: no delay


def test_fewer_slots_after_the_downscale_delay_down_to_min_slots():
    rule = ScaleRule("rm", SPEC)
    assert rule.observe(0.0, 0, 3) is None
    d = rule.observe(30.0, 0, 3)
    assert d is not None and d.target == 0 and d.direction == "down"
    floor = ScaleRule("rm", SPEC.model_copy(update={"min_slots": 1}))
    floor.observe(0.0, 0, 3)
    assert floor.observe(30.0, 0, 3).target == 1


def test_no_scale_down_while_slots_start_and_the_delay_counts_from_when_all_serve():
    """A start longer than the downscale delay (an engine that proves its prefix cache and
    restarts without it) must not be undone the moment it ends."""
    rule = ScaleRule("judge", SPEC)
    for t in (0.0, 30.0, 300.0):
        assert rule.observe(t, 0, 2, starting=1) is None  # slot 1 still starting
    assert rule.observe(301.0, 0, 2) is None  # both serve: the delay starts now
    assert rule.observe(330.0, 0, 2) is None
    d = rule.observe(331.0, 0, 2)
    assert d is not None and d.target == 0
    up = ScaleRule("judge", SPEC)  # more load is answered while a slot starts
    up.observe(0.0, 8, 1, starting=1)
    assert up.observe(5.0, 8, 1, starting=1).target == 4


@given(st.lists(st.tuples(st.floats(0, 3), st.integers(0, 40)), max_size=60), st.integers(0, 4))
def test_every_decision_moves_towards_the_load_within_bounds(steps, current):
    rule, now = ScaleRule("rm", SPEC), 0.0
    for dt, ongoing in steps:
        now += dt
        d = rule.observe(now, ongoing, current)
        if d is not None:
            assert SPEC.min_slots <= d.target <= SPEC.max_slots and d.target != current
            current = d.target


def test_autoscaling_bounds_are_checked():
    with pytest.raises(ValidationError, match="exceeds"):
        AutoscalingSpec(min_slots=3, max_slots=2)
    with pytest.raises(ValidationError, match="outside autoscaling"):
        ModelSpec(
            name="rm",
            kind="discriminative",
            model_path="/m",
            replicas=3,
            autoscaling={"min_slots": 0, "max_slots": 2},
        )


# ---- policies -----------------------------------------------------------------------------
def test_a_scale_to_zero_always_wakes_a_users_sleep_follows_on_sleep():
    assert action_for("refuse", "autoscaler") == "wake"
    assert action_for("refuse", "user") == "refuse" and action_for("wait", "user") == "wait"
    assert model_state(["asleep", "asleep"]) == "asleep"
    assert model_state(["awake", "kept_out"]) == "kept_out"
    assert model_state(["awake", "asleep"]) == "mixed"


# ---- the transport meets a sleeping slot ---------------------------------------------------
class SleepySlot:
    """A slot replica's handle: asleep until woken (``wake_up`` counts the wakes)."""

    def __init__(self, slept_by: str = "user", comes_back: str = "awake") -> None:
        self.state, self.slept_by, self.comes_back, self.wakes = "asleep", slept_by, comes_back, 0
        outer = self

        class _Endpoint:
            def remote(self):
                async def get():
                    if outer.state == "awake":
                        return {"url": "http://engine", "mode": "serialize", "state": "awake"}
                    return {
                        "state": outer.state,
                        "sleep": {
                            "state": outer.state,
                            "slept_by": outer.slept_by,
                            "kept_out": "woke up in numerics class b, not a"
                            if outer.state == "kept_out"
                            else None,
                        },
                    }

                return get()

        class _Wake:
            def remote(self):
                async def wake():
                    outer.wakes += 1
                    await asyncio.sleep(0.05)
                    outer.state = outer.comes_back
                    return {"state": outer.state, "changed": True, "kept_out": "other class"}

                return wake()

        self.endpoint, self.wake_up = _Endpoint(), _Wake()


def slot_transport(slot: SleepySlot, on_sleep: str = "wake") -> SlotTransport:
    handler = lambda request: httpx.Response(200, json={"ok": True})  # noqa: E731
    return SlotTransport(
        {"rm": [slot]},
        GatewaySettings(),
        SlotTable({"rm": 1}),
        engine_client=HttpxEngineClient(httpx.AsyncClient(transport=httpx.MockTransport(handler))),
        on_sleep={"rm": on_sleep},
    )


ONE = Placement(((0, 10.0),))


async def test_wake_wakes_the_slot_once_for_every_request_then_answers():
    slot = SleepySlot()
    t = slot_transport(slot, "wake")
    replies = await asyncio.gather(
        *(t.post("rm", ONE, "/classify", b"{}", Deadline.after(30)) for _ in range(5))
    )
    assert all(r.status == 200 for r in replies) and slot.wakes == 1


async def test_refuse_is_a_503_with_retry_after_and_no_wake():
    slot = SleepySlot()
    with pytest.raises(ModelAsleep) as err:
        await slot_transport(slot, "refuse").post("rm", ONE, "/classify", b"{}", Deadline.after(30))
    assert err.value.status == 503 and err.value.headers["Retry-After"] and slot.wakes == 0


async def test_wait_holds_the_request_until_its_deadline_and_no_longer():
    slot = SleepySlot()
    with pytest.raises(DeadlineExceeded):
        await slot_transport(slot, "wait").post("rm", ONE, "/classify", b"{}", Deadline.after(0.3))
    assert slot.wakes == 0


async def test_the_request_header_overrides_on_sleep_and_an_autoscaler_sleep_always_wakes():
    slot = SleepySlot()
    asked = Deadline.after(30, on_sleep="wake")
    assert (await slot_transport(slot, "refuse").post("rm", ONE, "/", b"{}", asked)).status == 200
    scaled = SleepySlot(slept_by="autoscaler")
    reply = await slot_transport(scaled, "refuse").post("rm", ONE, "/", b"{}", Deadline.after(30))
    assert reply.status == 200 and scaled.wakes == 1


async def test_a_slot_kept_out_after_its_wake_is_never_answered_from():
    slot = SleepySlot(comes_back="kept_out")
    with pytest.raises(SlotUnavailable, match="other class|numerics class"):
        await slot_transport(slot).post("rm", ONE, "/classify", b"{}", Deadline.after(30))


async def test_a_wake_longer_than_the_deadline_is_a_504_not_a_hang():
    slot = SleepySlot()
    with pytest.raises(DeadlineExceeded):
        await slot_transport(slot).post("rm", ONE, "/classify", b"{}", Deadline.after(0.01))


# ---- the engine's sleep gate ---------------------------------------------------------------
async def test_the_gate_refuses_while_paused_and_counts_requests_inside():
    release = asyncio.Event()

    async def engine(scope, receive, send):
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = SleepGate(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gate), base_url="http://e") as c:
        slow = asyncio.create_task(c.post("/slow"))
        await asyncio.sleep(0.05)
        assert (await c.post("/rmgate/pause")).json() == {"paused": True, "inflight": 1}
        refused = await c.post("/classify")
        assert engine_is_asleep(refused.status_code, refused.content)
        assert (await c.post("/classify", headers={PROBE_HEADER: "1"})).status_code == 200
        assert (await c.get("/health")).status_code == 200
        release.set()
        assert (await slow).status_code == 200  # the request inside finished
        assert (await c.get("/rmgate/gate")).json() == {"paused": True, "inflight": 0}
        await c.post("/rmgate/resume")
        assert (await c.post("/classify")).status_code == 200
        assert (await c.post("/rmgate/nothing")).status_code == 404


# ---- the admin routes -----------------------------------------------------------------------
class Slots:
    """A transport's sleep side, recording what was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def sleep_slot(self, model, slot, level, by):
        self.calls.append(("sleep", model, slot, level, by))
        return {"slot": slot, "state": "asleep", "is_sleeping": True, "last": {"seconds": 0.1}}

    async def wake_slot(self, model, slot, timeout_s):
        self.calls.append(("wake", model, slot))
        return {"slot": slot, "state": "awake", "is_sleeping": False}

    async def slot_state(self, model, slot, timeout_s):
        return {"slot": slot, "state": "asleep", "is_sleeping": True}


CONFIG = {
    "models": [
        {"name": "rm", "kind": "discriminative", "model_path": "/m", "replicas": 2},
        {"name": "rm2", "kind": "discriminative", "model_path": "/m"},
    ]
}


def admin_app(monkeypatch, keys: bool):
    if keys:
        monkeypatch.setenv("RMGATE_API_KEYS", "user")
        monkeypatch.setenv("RMGATE_ADMIN_API_KEYS", "admin")
    slots = Slots()
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), slots))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://g"), slots


async def test_sleep_and_wake_act_on_every_slot_of_the_model_asked(monkeypatch):
    client, slots = admin_app(monkeypatch, keys=False)
    async with client:
        r = await client.post("/sleep?level=2&model=rm")
        assert r.status_code == 200 and r.json()["status"] == "sleeping" and r.json()["level"] == 2
        assert slots.calls == [("sleep", "rm", 0, 2, "user"), ("sleep", "rm", 1, 2, "user")]
        assert json.loads(r.text)["models"]["rm"]["state"] == "asleep"
        assert (await client.post("/wake_up")).json()["status"] == "awake"  # every model
        assert len([c for c in slots.calls if c[0] == "wake"]) == 3
        assert (await client.get("/is_sleeping?model=rm2")).json()["is_sleeping"] is True
        assert (await client.post("/sleep?level=3")).status_code == 422  # vLLM's 0..2
        assert (await client.post("/sleep?model=nope")).status_code == 404


async def test_with_api_keys_only_an_admin_key_sleeps_or_wakes(monkeypatch):
    client, slots = admin_app(monkeypatch, keys=True)
    async with client:
        user = {"authorization": "Bearer user"}
        r = await client.post("/sleep", headers=user)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
        assert (await client.post("/wake_up")).status_code == 401
        assert (await client.get("/is_sleeping", headers=user)).status_code == 200
        admin = {"authorization": "Bearer admin"}
        assert (await client.post("/sleep", headers=admin)).status_code == 200
        assert slots.calls and all(c[0] == "sleep" for c in slots.calls)


async def test_a_bad_on_sleep_header_is_a_400(monkeypatch):
    client, _ = admin_app(monkeypatch, keys=False)
    async with client:
        r = await client.post(
            "/classify", json={"model": "rm", "input": "x"}, headers={"x-rmgate-on-sleep": "nap"}
        )
        assert r.status_code == 400 and "x-rmgate-on-sleep" in r.json()["error"]["message"]


def test_the_clients_awake_block_wakes_on_entry_and_sleeps_on_exit_even_on_error(monkeypatch):
    from gateway.client import RewardClient

    monkeypatch.setenv("RMGATE_API_KEYS", "user")
    monkeypatch.setenv("RMGATE_ADMIN_API_KEYS", "admin")
    slots = Slots()
    app = create_app(RewardService(AppConfig.model_validate(CONFIG), slots))  # type: ignore[arg-type]
    client = RewardClient(
        "http://g", api_key="user", admin_key="admin", transport=httpx.ASGITransport(app)
    )
    with client:
        with pytest.raises(RuntimeError, match="phase failed"), client.awake(model="rm", level=2):
            assert [c[0] for c in slots.calls] == ["wake", "wake"]
            raise RuntimeError("phase failed")
        assert slots.calls[-2:] == [("sleep", "rm", 0, 2, "user"), ("sleep", "rm", 1, 2, "user")]
        assert client.is_sleeping("rm") is True
        user_only = RewardClient("http://g", api_key="user", transport=httpx.ASGITransport(app))
        with user_only, pytest.raises(Exception, match="403"):
            user_only.sleep()


async def test_a_slot_counts_as_starting_until_the_ingress_has_described_it():
    slot = SleepySlot()
    slot.state = "awake"
    t = slot_transport(slot)
    assert t.undescribed({"rm": 1}) == {"rm": 1}  # and asked, in the background
    for _ in range(100):
        if t.undescribed({"rm": 1}) == {"rm": 0}:
            break
        await asyncio.sleep(0.01)
    assert t.undescribed({"rm": 1}) == {"rm": 0}
