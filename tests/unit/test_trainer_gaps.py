"""What trainers' own reward code sends (issue 14), against a fake engine: model aliases,
``/v1/models`` as OpenAI's ``Model``, ``/v1/embeddings`` (verl's SGLang path), ``max_tokens``
above the context, defaults from the model folder, and the API key in the URL path."""

from __future__ import annotations

import base64
import json
import struct

import httpx
import openai
import pytest

from gateway.core.config.settings import AppConfig
from gateway.core.service import RewardService
from gateway.http.app import create_app
from tests.unit.test_ingress import CONFIG, FakeTransport
from tests.unit.test_ops import make_client


def _client(cfg: dict, transport: FakeTransport) -> httpx.AsyncClient:
    gw = RewardService(AppConfig.model_validate(cfg), transport)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    )


ALIASED = {
    **CONFIG,
    "models": [{**CONFIG["models"][0], "aliases": ["Org/Judge-7B"]}, CONFIG["models"][1]],
}


async def test_aliases_path_and_basename_are_the_same_request():
    transport = FakeTransport()
    async with _client(ALIASED, transport) as c:
        chat = {"messages": [{"role": "user", "content": "2+3=5?"}]}
        keys = set()
        for name in ("judge", "Org/Judge-7B", "/m/grm", "grm"):
            r = await c.post("/v1/chat/completions", json={**chat, "model": name})
            assert r.status_code == 200, (name, r.text)
            keys.add(r.headers["x-rmgate-key"])
        assert len(keys) == 1 and {s[3]["model"] for s in transport.sent} == {"judge"}
        missing = await c.post("/v1/chat/completions", json={**chat, "model": "Org/Other"})
        assert missing.status_code == 404
        message = missing.json()["error"]["message"]
        assert "Org/Judge-7B" in message and "disrm" in message  # lists what it answers to


def test_an_alias_taken_twice_is_refused():
    cfg = {
        **CONFIG,
        "models": [
            {**CONFIG["models"][0], "aliases": ["x"]},
            {**CONFIG["models"][1], "aliases": ["x"]},
        ],
    }
    with pytest.raises(ValueError, match="alias 'x'"):
        AppConfig.model_validate(cfg)
    with pytest.raises(ValueError, match="alias 'rm'"):
        AppConfig.model_validate(
            {**CONFIG, "models": [{**CONFIG["models"][0], "aliases": ["rm"]}, CONFIG["models"][1]]}
        )


async def test_models_entries_parse_as_openai_models():
    async with _client(ALIASED, FakeTransport()) as c:
        data = (await c.get("/v1/models")).json()["data"]
    for entry in data:
        model = openai.types.Model.model_validate(entry)
        assert model.created > 0 and model.object == "model"
    assert data[0]["aliases"] == ["Org/Judge-7B", "grm"] and data[0]["max_model_len"] == 1024


@pytest.mark.parametrize("encoding", ["float", "base64"])
async def test_embeddings_are_the_classify_logits_of_the_same_request(encoding):
    """verl's SGLang reward path reads data[-1].embedding[-1] of /v1/embeddings."""
    transport = FakeTransport()
    async with _client(CONFIG, transport) as c:
        emb = await c.post(
            "/v1/embeddings", json={"model": "rm", "input": "abc", "encoding_format": encoding}
        )
        cls = await c.post(
            "/classify", json={"model": "rm", "input": "abc", "use_activation": False}
        )
    assert emb.status_code == 200, emb.text
    assert emb.headers["x-rmgate-key"] == cls.headers["x-rmgate-key"]
    vector = emb.json()["data"][-1]["embedding"]
    if encoding == "base64":
        raw = base64.b64decode(vector)
        vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert vector[-1] == cls.json()["data"][-1]["probs"][-1]
    assert emb.json()["object"] == "list" and emb.json()["data"][0]["object"] == "embedding"
    assert transport.sent[0][2:] == transport.sent[1][2:]  # the same /classify request


async def test_embeddings_errors_are_clear():
    async with _client(CONFIG, FakeTransport()) as c:
        assert (
            await c.post("/v1/embeddings", json={"model": "judge", "input": "a"})
        ).status_code == 400  # a GRM has no embeddings here
        assert (await c.post("/v1/embeddings", json={"model": "rm"})).status_code == 422
        assert (
            await c.post("/v1/embeddings", json={"model": "rm", "input": "a", "dimensions": 3})
        ).status_code == 422


async def test_max_tokens_above_the_context_is_capped_and_said():
    transport = FakeTransport()
    async with _client(CONFIG, transport) as c:
        chat = {"model": "judge", "messages": [{"role": "user", "content": "2+3=5?"}]}
        big = await c.post("/v1/chat/completions", json={**chat, "max_tokens": 100_000})
        whole = await c.post("/v1/chat/completions", json={**chat, "max_tokens": 1024})
        small = await c.post("/v1/chat/completions", json={**chat, "max_tokens": 9})
    assert big.headers["x-rmgate-max-tokens-clamped"] == "max_tokens=100000->1024"
    assert big.headers["x-rmgate-key"] == whole.headers["x-rmgate-key"]
    assert "x-rmgate-max-tokens-clamped" not in whole.headers
    assert [s[3]["max_tokens"] for s in transport.sent] == [1024, 1024, 9]
    assert small.status_code == 200


async def test_sampling_defaults_from_the_model_folder(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 99_999, "do_sample": True})
    )
    judge = {
        **CONFIG["models"][0],
        "model_path": str(tmp_path),
        "sampling_defaults": {"top_p": 0.5},
        "sampling_defaults_from": "model",
    }
    transport = FakeTransport()
    async with _client({**CONFIG, "models": [judge, CONFIG["models"][1]]}, transport) as c:
        await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
    sent = transport.sent[0][3]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.6, 0.5, 1024)
    assert "do_sample" not in sent


async def test_the_api_key_in_the_url_path(monkeypatch):
    """verl's and OpenRLHF's reward clients cannot send a header."""
    monkeypatch.setenv("RMGATE_API_KEYS", "k1")
    async with make_client(default_reward_model="rm") as c:
        body = {"input": "x"}
        assert (await c.post("/keys/k1/classify", json=body)).status_code == 200
        assert (await c.post("/keys/k1/get_reward", json={"query": ["x"]})).status_code == 200
        assert (await c.post("/get_reward", json={"query": ["x"]})).status_code == 401
        assert (await c.post("/keys/nope/classify", json=body)).status_code == 401
        assert (await c.post("/classify", json=body)).status_code == 401
        assert (await c.get("/keys/k1/v1/models")).status_code == 200
        schema = (await c.get("/openapi.json")).json()
        assert not any(p.startswith("/keys") for p in schema["paths"])
