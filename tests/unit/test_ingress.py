"""The HTTP surface against a fake engine transport: routing, seeds, splitting, errors."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.core.api.results import EngineReply
from gateway.core.config.settings import AppConfig
from gateway.core.routing.deadline import Deadline
from gateway.core.routing.engine_access import SlotInfo, SlotView
from gateway.core.routing.hashing import slot_for_key
from gateway.core.routing.keys import derive_seed, request_key
from gateway.core.routing.numerics import ModelClasses
from gateway.core.service import RewardService
from gateway.http.app import create_app

CONFIG = {
    "models": [
        {
            "name": "judge",
            "kind": "generative",
            "model_path": "/m/grm",
            "replicas": 3,
            "sampling_defaults": {"temperature": 0.7, "max_tokens": 8},
        },
        {"name": "rm", "kind": "discriminative", "model_path": "/m/disrm", "replicas": 2},
    ],
    "gateway": {"max_body_bytes": 4096},
}


class FakeTransport:
    """Records what the gateway sends; answers like vLLM would."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str, dict]] = []
        self.reply_status = 200

    async def post(
        self, model: str, placement, path: str, body: bytes, deadline: Deadline
    ) -> EngineReply:
        slot = placement.home
        self.deadline = deadline
        data = json.loads(body)
        self.sent.append((model, slot, path, data))
        if self.reply_status != 200:
            return EngineReply(
                self.reply_status,
                json.dumps(
                    {"error": {"message": "engine says no", "type": "BadRequestError"}}
                ).encode(),
                slot=slot,
            )
        if path in ("/classify", "/pooling"):
            score = float(len(data["input"]))
            item = (
                {"index": 0, "probs": [score]}
                if path == "/classify"
                else {"index": 0, "data": [score]}
            )
            out = {
                "id": "classify-x",
                "object": "list",
                "model": model,
                "data": [item],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        else:
            out = {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"seed={data.get('seed')}"},
                        "finish_reason": "stop",
                    }
                ],
            }
        return EngineReply(200, json.dumps(out).encode(), f"fp-{model}-{slot}", slot)

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None:
        return SlotInfo(
            model=model,
            slot=slot,
            url="http://x",
            fingerprint=f"fp-{model}-{slot}",
            mode="serialize",
            max_inflight=1,
        )

    async def health(self, model: str, slot: int, timeout_s: float) -> str:
        return "healthy"

    async def slot_state(self, model: str, slot: int, timeout_s: float) -> dict:
        return {"slot": slot, "state": "awake", "is_sleeping": False}

    def slot_view(self, model: str, slots: int) -> SlotView:
        return SlotView(ModelClasses((None,) * slots))


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
async def client(transport):
    gw = RewardService(AppConfig.model_validate(CONFIG), transport)
    app = create_app(gw)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        yield c


CHAT = {"messages": [{"role": "user", "content": "2+3=5?"}]}


async def test_chat_routes_by_key_and_derives_seed(client, transport):
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    key = request_key("/v1/chat/completions", {**CHAT, "model": "judge"})
    assert r.headers["x-rmgate-key"] == f"{key:08x}"
    assert r.headers["x-rmgate-slot"] == str(slot_for_key(key, 3))
    assert r.headers["x-rmgate-seed"] == str(derive_seed(key))
    assert r.headers["x-rmgate-fingerprint"] == f"fp-judge-{slot_for_key(key, 3)}"
    model, slot, path, sent = transport.sent[0]
    assert sent["seed"] == derive_seed(key) and sent["temperature"] == 0.7
    assert sent["max_tokens"] == 8 and sent["model"] == "judge"


async def test_explicit_seed_and_fields_win_over_defaults(client, transport):
    r = await client.post(
        "/v1/chat/completions", json={**CHAT, "seed": 11, "temperature": 1.0, "model": "judge"}
    )
    assert r.headers["x-rmgate-seed"] == "11"
    assert transport.sent[0][3]["seed"] == 11 and transport.sent[0][3]["temperature"] == 1.0


async def test_same_request_in_other_spellings_same_key(client):
    body = {**CHAT, "model": "judge", "seed": 3}
    a = await client.post(
        "/v1/chat/completions",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    b = await client.post(
        "/v1/chat/completions",
        content=json.dumps(dict(reversed(body.items())), indent=2, ensure_ascii=True).encode(),
        headers={"content-type": "application/json"},
    )
    c = await client.post("/v1/chat/completions", json={**body, "user": "u1", "stream": False})
    assert a.headers["x-rmgate-key"] == b.headers["x-rmgate-key"] == c.headers["x-rmgate-key"]
    # The model may be omitted when one generative model is served: same key.
    d = await client.post("/v1/chat/completions", json={**CHAT, "seed": 3})
    assert d.headers["x-rmgate-key"] == a.headers["x-rmgate-key"]


async def test_classify_list_is_split_and_reassembled_in_order(client, transport):
    items = ["a", "bbb", "cc", "dddd", "e"]
    r = await client.post("/classify", json={"model": "rm", "input": items})
    assert r.status_code == 200
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(5))
    assert [d["probs"][0] for d in data] == [float(len(x)) for x in items]
    assert [s[3]["input"] for s in transport.sent] == items
    expected_slots = [
        slot_for_key(request_key("/classify", {"model": "rm", "input": x}), 2) for x in items
    ]
    assert r.headers["x-rmgate-slot"] == ",".join(map(str, expected_slots))
    assert [s[1] for s in transport.sent] == expected_slots
    assert r.json()["usage"]["prompt_tokens"] == 5


async def test_item_alone_and_in_a_list_get_the_same_slot(client):
    alone = await client.post("/classify", json={"input": "bbb"})
    listed = await client.post("/classify", json={"input": ["a", "bbb"]})
    assert listed.headers["x-rmgate-slot"].split(",")[1] == alone.headers["x-rmgate-slot"]


@pytest.mark.parametrize("flag", ["use_activation", "activation", "softmax"])
async def test_activation_synonyms_become_use_activation(client, transport, flag):
    r = await client.post("/classify", json={"input": "x", flag: False})
    assert r.status_code == 200
    sent = transport.sent[0][3]
    assert sent["use_activation"] is False
    assert "activation" not in sent and "softmax" not in sent


async def test_activation_synonyms_share_a_key(client):
    keys = {
        (await client.post("/classify", json={"input": "x", f: True})).headers["x-rmgate-key"]
        for f in ("use_activation", "activation", "softmax")
    }
    assert len(keys) == 1


async def test_conflicting_activation_flags_are_400(client):
    r = await client.post(
        "/classify", json={"input": "x", "activation": True, "use_activation": False}
    )
    assert r.status_code == 400


@pytest.mark.parametrize(
    "raw,status",
    [
        (b"{bad json", 400),
        (b"", 400),
        (b"[1, 2]", 400),
        (b'"text"', 400),
        (b'{"input": NaN}', 400),
        (b"\xff\xfe{}", 400),
        (b"[" * 100_000, 413),
    ],
)
async def test_malformed_bodies(client, raw, status):
    r = await client.post("/classify", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/classify", "/v1/chat/completions"])
async def test_deep_nesting_is_400_not_500(client, path):
    nested = '{"input": ' + "[" * 1800 + "]" * 1800 + "}"  # under the 4 KiB limit
    r = await client.post(path, content=nested.encode())
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "path,body",
    [
        ("/classify", {"input": 5}),
        ("/classify", {"input": "x", "use_activation": "yes"}),
        ("/classify", {"model": 3, "input": "x"}),
        ("/classify", {"input": []}),
        ("/classify", {}),
        ("/v1/chat/completions", {"messages": "hi"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {**CHAT, "seed": "5"}),
        ("/v1/completions", {"prompt": {"a": 1}}),
    ],
)
async def test_wrong_types_are_422(client, path, body):
    r = await client.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_model_is_404(client):
    r = await client.post("/classify", json={"model": "nope", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_wrong_kind_is_400(client):
    r = await client.post("/classify", json={"model": "judge", "input": "x"})
    assert r.status_code == 400


async def test_unknown_route_and_method_are_json(client):
    r = await client.post("/v2/nothing", json={})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    r = await client.get("/classify")
    assert r.status_code == 405 and r.json()["error"]


async def test_oversize_body_is_413(client):
    r = await client.post("/classify", json={"input": "x" * 5000})
    assert r.status_code == 413


async def test_stream_is_refused_with_400(client):
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]


async def test_engine_4xx_is_passed_through(client, transport):
    transport.reply_status = 400
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "engine says no"


async def test_engine_5xx_becomes_502_not_500(client, transport):
    transport.reply_status = 500
    r = await client.post("/classify", json={"input": "x"})
    assert r.status_code == 502


async def test_models_and_health(client):
    r = await client.get("/v1/models")
    data = r.json()
    assert data["object"] == "list"
    assert [(m["id"], m["kind"], m["slots"]) for m in data["data"]] == [
        ("judge", "generative", 3),
        ("rm", "discriminative", 2),
    ]
    assert data["data"][0]["determinism"] == "serialize"
    assert data["data"][0]["health"] == ["healthy"] * 3
    assert (await client.get("/health")).json() == {"status": "ok"}


async def test_openapi_documents_the_endpoints(client):
    paths = (await client.get("/openapi.json")).json()["paths"]
    for p in (
        "/v1/chat/completions",
        "/v1/completions",
        "/classify",
        "/pooling",
        "/v1/models",
        "/health",
    ):
        assert p in paths


class BusyTransport(FakeTransport):
    """Every slot in class A; the judge's slot 0 (only) is busy."""

    def slot_view(self, model: str, slots: int) -> SlotView:
        return SlotView(ModelClasses(("A",) * slots), {0: 10} if model == "judge" else {})

    async def post(self, model, placement, path, body, deadline):
        reply = await super().post(
            model, type(placement)(((placement.first, 1.0),)), path, body, deadline
        )
        return EngineReply(reply.status, reply.body, reply.fingerprint, reply.slot, "A")


async def test_class_placement_moves_a_busy_slots_key_and_says_so():
    cfg = AppConfig.model_validate({**CONFIG, "gateway": {"placement": "class"}})
    gw = RewardService(cfg, BusyTransport())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    ) as c:
        moved = stayed = 0
        for i in range(40):
            r = await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": f"q{i}"}]}
            )
            assert r.status_code == 200 and r.headers["x-rmgate-class"] == "A"
            home = slot_for_key(int(r.headers["x-rmgate-key"], 16), 3)
            if home == 0:
                moved += 1
                assert r.headers["x-rmgate-slot"] != "0"
                assert r.headers["x-rmgate-placement"] == f"0->{r.headers['x-rmgate-slot']}:load"
                assert "x-rmgate-failover" not in r.headers
            else:
                stayed += 1
                assert r.headers["x-rmgate-slot"] == str(home)
                assert "x-rmgate-placement" not in r.headers
        text = (await c.get("/metrics")).text
        models = (await c.get("/v1/models")).json()["data"]
    assert moved and stayed
    assert f'rmgate_placements_away_total{{model="judge",reason="load"}} {float(moved)}' in text
    assert 'rmgate_slot_class{model="judge",numerics_class="A",slot="0"} 1.0' in text
    judge = next(m for m in models if m["id"] == "judge")
    assert judge["placement"] == "class" and judge["classes"] == {"A": [0, 1, 2]}
