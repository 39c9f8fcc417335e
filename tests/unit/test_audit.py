"""The continuous audit against a scripted engine per slot: sampling, what a mismatch
proves, draining the slot the evidence names (and no other), the ledger's audit rows, the
idle wait, the queue bound, the routes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.core.audit.policy import AuditBook, AuditRecord, Evidence, blame, sampled
from gateway.core.config.settings import AppConfig, GatewaySettings
from gateway.core.ledger_policy.row import LedgerRow
from gateway.core.routing.numerics import ModelClasses
from gateway.core.routing.slots import SlotTable
from gateway.ledger.ledger import Ledger
from gateway.observability import metrics
from gateway.serve.auditor import Auditor
from gateway.transport.engine_client import HttpxEngineClient
from gateway.transport.slot_transport import SlotTransport
from tests.unit.test_routing import FakeHandle


def receipts(n: int) -> list[str]:
    return [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]


# ---- policy -------------------------------------------------------------------------------
def test_sampling_takes_its_share_by_the_receipt_alone():
    all_ = receipts(4000)
    assert not any(sampled(r, 0.0) for r in all_)
    assert all(sampled(r, 1.0) for r in all_)
    picked = [r for r in all_ if sampled(r, 0.25)]
    assert 800 < len(picked) < 1200
    assert picked == [r for r in all_ if sampled(r, 0.25)]  # the same rows every time
    assert not sampled("not hex", 0.5)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_larger_share_keeps_every_row_a_smaller_one_kept(a: float, b: float):
    lo, hi = sorted((a, b))
    for r in receipts(50):
        assert not sampled(r, lo) or sampled(r, hi)


def ev(**kw) -> Evidence:
    base = dict(recorded_slot=0, recorded="R", peer_slot=1, peer="P")
    return Evidence(**{**base, **kw})  # type: ignore[arg-type]


def test_blame_names_a_slot_only_on_evidence():
    # the recorded slot does not reproduce its own answer
    assert blame(ev(original="X", peer_again="P")).slot == 0
    # the peer answers the same request two ways
    assert blame(ev(original="R", peer_again="Q")).slot == 1
    # a third mate sides with the record / with the peer
    assert blame(ev(original="R", peer_again="P", third_slot=2, third="R")).slot == 1
    assert blame(ev(original="R", peer_again="P", third_slot=2, third="P")).slot == 0
    # two self-consistent slots disagree, nobody to decide: nobody named
    found = blame(ev(original="R", peer_again="P"))
    assert found.slot is None and "suspect" in found.reason
    assert blame(ev(original="R", peer_again="P", third_slot=2, third="Z")).slot is None


def record(outcome: str, cls: str = "A") -> AuditRecord:
    return AuditRecord("r", "m", cls, 0, 1, outcome, None, "", time.time())  # type: ignore[arg-type]


def test_a_mismatch_makes_the_class_suspect_until_a_run_of_same():
    book = AuditBook(clear_after=3)
    book.add(record("same"))
    assert not book.tallies[("m", "A")].suspect
    book.add(record("different"))
    assert book.tallies[("m", "A")].suspect and book.last_mismatch["receipt"] == "r"
    book.add(record("same"))
    book.add(record("failed"))
    book.add(record("same"))
    assert book.tallies[("m", "A")].suspect
    book.add(record("same"))
    assert not book.tallies[("m", "A")].suspect
    got = book.as_dict()["classes"][0]
    assert (got["same"], got["different"], got["failed"]) == (4, 1, 1)


def test_set_aside_classes_are_drained_under_either_policy():
    for policy in ("strict", "mixed"):
        view = ModelClasses(("A", "audit-A", "A"), policy)  # type: ignore[arg-type]
        assert view.drained(1) and not view.drained(0)
        assert view.majority == "A" and view.mates(1) == [0, 2]
        assert "audit" in (view.drain_reason(1) or "")


def test_the_audit_needs_the_ledgers_bodies():
    with pytest.raises(ValidationError, match="keep_bodies"):
        GatewaySettings(audit={"sample": 0.1}, ledger={"keep_bodies": False})
    with pytest.raises(ValidationError, match="ledger"):
        GatewaySettings(audit={"sample": 0.1}, ledger={"backend": "off"})
    assert GatewaySettings(audit={"sample": 0.1}).audit.sample == 0.1
    assert GatewaySettings(ledger={"backend": "off"}).audit.sample == 0  # off by default


# ---- the auditor over a scripted engine per slot ------------------------------------------
class Engines:
    """Slot hosts answer ``/classify`` with a value from the input; a host in ``flaky``
    adds one ulp to every second answer (its answers depend on something besides the
    request: the failure the audit exists to catch); one in ``other`` always adds it."""

    def __init__(self, flaky: set[str] = frozenset(), other: set[str] = frozenset()) -> None:
        self.flaky, self.other = set(flaky), set(other)
        self.calls: dict[str, int] = {}
        self.busy: set[str] = set()

    def value(self, host: str, text: str) -> float:
        n = self.calls[host] = self.calls.get(host, 0) + 1
        v = len(text) / 7
        if host in self.other or (host in self.flaky and n % 2 == 0):
            v = float.fromhex(v.hex()) + 2**-50
        return v

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        probs = [self.value(request.url.host, body["input"])]
        return httpx.Response(200, json={"data": [{"index": 0, "probs": probs}]})


async def setup(tmp_path, engines: Engines, hosts="ab", **audit):
    cfg = AppConfig.model_validate(
        {
            "models": [
                {"name": "m", "kind": "discriminative", "model_path": "/m", "replicas": len(hosts)}
            ],
            "gateway": {
                "ledger": {"state_dir": str(tmp_path)},
                "audit": {"sample": 1.0, "max_per_minute": 60_000, **audit},
            },
        }
    )
    handles = {"m": [FakeHandle(f"http://{h}") for h in hosts]}
    for h in handles["m"]:
        h.info["numerics"] = {"class_id": "A", "probe_digest": "d"}
    slots = SlotTable({"m": len(hosts)})
    transport = SlotTransport(
        handles,
        cfg.gateway,
        slots,
        engine_client=HttpxEngineClient(
            httpx.AsyncClient(transport=httpx.MockTransport(engines.handler))
        ),
    )
    for s in range(len(hosts)):
        await transport.describe("m", s, 1.0)
    ledger = Ledger.open(cfg.gateway.ledger)
    return Auditor(cfg, transport, slots, ledger, sleep=lambda s: asyncio.sleep(0)), ledger


def recorded(engines: Engines, slot: int, text: str, hosts="ab") -> LedgerRow:
    body = json.dumps({"model": "m", "input": text}).encode()
    answer = json.dumps(
        {"data": [{"index": 0, "probs": [engines.value(hosts[slot], text)]}]}
    ).encode()
    return LedgerRow(
        hashlib.sha256(body).hexdigest(),
        "m",
        "A",
        "/classify",
        hashlib.sha256(body).hexdigest(),
        body,
        answer,
        200,
        None,
        None,
        slot,
        None,
        None,
        0.01,
        time.time(),
    )


async def test_class_mates_that_agree_are_counted_same_and_recorded(tmp_path):
    engines = Engines()
    auditor, ledger = await setup(tmp_path, engines)
    for i in range(6):
        rec = await auditor.audit(recorded(engines, i % 2, f"x{i}"), peer=1 - i % 2)
        assert rec.outcome == "same" and rec.audit_slot == 1 - i % 2
    rows = ledger.store.audits(model="m")
    assert [r.outcome for r in rows] == ["same"] * 6
    assert auditor.report()["classes"][0]["same"] == 6 and not auditor.book.drained


async def test_a_slot_that_contradicts_itself_is_drained_and_its_mate_is_not(tmp_path):
    engines = Engines(flaky={"b"})
    auditor, ledger = await setup(tmp_path, engines)
    before = metrics.AUDIT_DRAINED.labels("m", "1")._value.get()
    outcomes = []
    for i in range(12):
        slot = i % 2
        rec = await auditor.audit(recorded(engines, slot, f"y{i}"), peer=1 - slot)
        outcomes.append((rec.outcome, rec.blamed_slot))
    # drained once, although rows it recorded before the drain go on being found out
    assert [d["slot"] for d in auditor.book.drained] == [1]
    assert sum(b == 1 for _, b in outcomes) >= 2
    assert all(b in (None, 1) for _, b in outcomes)  # slot 0 is never named
    view = auditor.transport.slot_view("m", 2)
    assert view.classes.classes == ("A", "audit-A") and view.classes.drained(1)
    assert metrics.AUDIT_DRAINED.labels("m", "1")._value.get() == before + 1
    report = auditor.report()
    assert report["last_mismatch"]["numerics_class"] == "A"
    assert report["classes"][0]["suspect"] is True
    # what slot 1 recorded in class A is no longer answered from the ledger
    invalidations = ledger.store.invalidations_since(0)
    assert [(i.slot, i.numerics_class) for i in invalidations] == [(1, "A")]
    assert invalidations[0].reason.startswith("audit")


async def test_two_self_consistent_slots_that_disagree_name_nobody(tmp_path):
    engines = Engines(other={"b"})  # b always answers one ulp off, consistently
    auditor, _ = await setup(tmp_path, engines)
    rec = await auditor.audit(recorded(engines, 0, "z"), peer=1)
    assert rec.outcome == "different" and rec.blamed_slot is None
    assert not auditor.book.drained and auditor.report()["classes"][0]["suspect"]
    # with a third class mate the odd one out is named and drained
    engines3 = Engines(other={"b"})
    auditor3, _ = await setup(tmp_path / "3", engines3, hosts="abc")
    rec = await auditor3.audit(recorded(engines3, 0, "z", "abc"), peer=1)
    assert rec.blamed_slot == 1 and [d["slot"] for d in auditor3.book.drained] == [1]


async def test_report_only_and_the_last_slot_are_not_drained(tmp_path):
    engines = Engines(flaky={"b"})
    auditor, _ = await setup(tmp_path, engines, on_mismatch="report")
    for i in range(8):
        await auditor.audit(recorded(engines, 1, f"w{i}"), peer=0)
    assert any(r["different"] for r in auditor.report()["classes"]) and not auditor.book.drained
    # a class of one slot re-answers on that slot; naming it drains nothing
    one = Engines(flaky={"a"})
    alone, _ = await setup(tmp_path / "1", one, hosts="a")
    recs = [await alone.audit(recorded(one, 0, f"v{i}", "a"), peer=0) for i in range(4)]
    assert any(r.outcome == "different" for r in recs) and not alone.book.drained


async def test_the_loop_waits_for_an_idle_mate_and_bounds_its_queue(tmp_path):
    engines = Engines()
    auditor, ledger = await setup(tmp_path, engines, queue=3)
    rows = [recorded(engines, 0, f"q{i}") for i in range(5)]
    skipped = metrics.AUDIT_SKIPPED.labels("m", "queue_full")._value.get()
    for row in rows:
        ledger.record(row)  # the ledger tells the auditor
    assert len(auditor.queue) == 3
    assert metrics.AUDIT_SKIPPED.labels("m", "queue_full")._value.get() == skipped + 2
    gate = auditor.transport.gate(await auditor.transport.describe("m", 1, 1.0))
    gate.inflight = 1  # a trainer's request on the only mate
    task = asyncio.ensure_future(auditor.run())
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(auditor.queue) == 3 and engines.calls.get("b", 0) == 0  # waited
    gate.inflight = 0
    for _ in range(500):
        await asyncio.sleep(0.01)
        if len(ledger.store.audits()) == 3:
            break
    task.cancel()
    assert not auditor.queue and engines.calls["b"] == 3
    assert [r.receipt for r in ledger.store.audits()] == [r.identity for r in rows[2:]]


async def test_another_replicas_drain_reaches_this_one(tmp_path):
    engines = Engines()
    auditor, ledger = await setup(tmp_path, engines)
    await ledger.invalidate("m", "A", 1, reason="audit: slot 1 answers two ways")
    await ledger._learn_invalidations()
    assert auditor.transport.directory.known_class("m", 1) == "audit-A"
    assert auditor.transport.directory.known_class("m", 0) == "A"
    # an operator's invalidation drains nothing
    await ledger.invalidate("m", "A", 0, reason="rmgate ledger invalidate")
    await ledger._learn_invalidations()
    assert auditor.transport.directory.known_class("m", 0) == "A"


async def test_on_demand_audits_recorded_rows(tmp_path):
    engines = Engines(flaky={"b"})
    auditor, ledger = await setup(tmp_path, engines, sample=0.0 + 1e-12)
    for i in range(10):
        ledger.record(recorded(engines, i % 2, f"d{i}"))
    auditor.queue.clear()
    await ledger.writer.flush()
    got = await auditor.audit_now(model="m", sample=10)
    assert got["audited"] == 10 and got["different"] >= 1
    assert {d["slot"] for d in auditor.book.drained} <= {1}


async def test_the_routes_show_and_run_the_audit(tmp_path):
    from gateway.core.service import RewardService
    from gateway.http.app import create_app

    engines = Engines()
    auditor, ledger = await setup(tmp_path, engines)
    ledger.record(recorded(engines, 0, "h"))
    await ledger.writer.flush()
    service = RewardService(
        AppConfig.model_validate(
            {"models": [{"name": "m", "kind": "discriminative", "model_path": "/m"}]}
        ),
        auditor.transport,
    )
    app = create_app(service, auditor=auditor)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        got = (await client.get("/v1/audit")).json()
        assert got["enabled"] and got["sample"] == 1.0 and got["queued"] == 1
        bad = await client.post("/v1/audit", json={"sample": 0})
        assert bad.status_code == 422 and "sample" in bad.text, bad.text
        ran = (await client.post("/v1/audit", json={"model": "m", "sample": 5})).json()
        assert ran["audited"] == 1 and ran["same"] == 1, ran
    off = create_app(service)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=off), base_url="http://t"
    ) as client:
        assert (await client.get("/v1/audit")).json()["enabled"] is False


# ---- the negative control's fault ------------------------------------------------------------
async def test_the_fault_nudges_every_nth_answer_of_its_slot_only(monkeypatch):
    from deployments.engine.fault import FAULT_ENV, SLOT_ENV, Nudger
    from deployments.engine.sleep_gate import PROBE_HEADER, SleepGate

    assert Nudger.from_env({FAULT_ENV: "1:2", SLOT_ENV: "0"}) is None  # another slot's
    assert Nudger.from_env({SLOT_ENV: "1"}) is None  # not set: nothing
    monkeypatch.setenv(FAULT_ENV, "1:2")
    monkeypatch.setenv(SLOT_ENV, "1")

    async def engine(scope, receive, send):
        body = json.dumps({"data": [{"index": 0, "probs": [0.1, 0.25]}]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})

    gate = SleepGate(engine)

    async def answer(headers=()) -> float:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/classify", "method": "POST", "headers": list(headers)}
        await gate(scope, None, send)
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        start = sent[0]
        assert (
            dict(start["headers"]).get(b"content-length", str(len(body)).encode())
            == str(len(body)).encode()
        )
        return json.loads(body)["data"][0]["probs"][-1]

    got = [await answer() for _ in range(4)]
    assert got[0] == got[2] == 0.25 and got[1] == got[3] == math.nextafter(0.25, math.inf)
    assert [await answer([(PROBE_HEADER.encode(), b"1")]) for _ in range(4)] == [0.25] * 4
