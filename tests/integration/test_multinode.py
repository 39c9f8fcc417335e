"""Two Ray nodes on one machine (two raylets, both on 127.0.0.1), one model's two slots on
different nodes, the ingress on the head: a replay answers as the single-node gateway does;
the worker node lost under load loses and changes nothing; an engine port refuses callers
without its secret. (Issue 15.)

Every process a node starts inherits that node's marker (``RMGATE_TEST_NODE``) and log
folder, so the test finds engines per node and ends everything by pid (never ``ray stop``).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.harness.cluster import NODE_LABEL, local_cluster, rmgate_on_cluster
from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration
TEXTS = [f"{a}+{b}={c}" for a in range(10) for b in range(10) for c in range(0, 19, 9)][:200]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(GCS address, nodes) of a two-node Ray cluster: A the head, B a worker."""
    with local_cluster(["nodeA", "nodeB"], tmp_path_factory.mktemp("cluster")) as out:
        yield out


def multinode_config(demo_models: Path, where: list[str]) -> dict:
    """configs/test-cpu.yaml's DisRM alone, slot i on node ``where[i]`` (``engine_host``
    left to ``rmgate serve --address``, which sets ``node``: engines with their secret), the
    ingress kept on the head (the node that takes HTTP traffic here, and the one not lost),
    two ingress replicas (same bits as one)."""
    cfg = yaml.safe_load((REPO / "configs" / "test-cpu.yaml").read_text())
    app = cfg["applications"][0]
    rm = next(m for m in app["args"]["models"] if m["name"] == "rm")
    # slot 0 placed by a custom resource, the others by a node label: both are Ray's own
    rm.update(
        model_path=str(demo_models / "disrm"),
        replicas=len(where),
        slot_ray_actor_options=[{"resources": {where[0]: 0.01}}]
        + [
            {
                "label_selector": {NODE_LABEL: n},  # where a restart may go instead:
                "fallback_strategy": [{"label_selector": {NODE_LABEL: where[0]}}],
            }
            for n in where[1:]
        ],
    )
    app["args"]["models"] = [rm]
    app["args"].pop("programs", None)  # their components name the judge, not served here
    app["args"]["gateway"] = {
        "slot_wait_s": 180,
        "placement": "class",
        "default_reward_model": "rm",
        "ingress_replicas": 2,
        "cache": "off",
    }  # node loss must reach the engines
    app["deployments"] = [
        {"name": "gateway", "ray_actor_options": {"num_cpus": 0, "resources": {where[0]: 0.01}}}
    ]
    return cfg


@pytest.fixture(scope="module")
def cluster_gateway(cluster, demo_models, tmp_path_factory):
    address, nodes = cluster
    work = tmp_path_factory.mktemp("mn")
    path = work / "serve.yaml"
    path.write_text(yaml.safe_dump(multinode_config(demo_models, ["nodeA", "nodeB"])))
    with rmgate_on_cluster(path, address, work) as url:
        yield url, nodes


async def _replay(url: str, texts: list[str], concurrency: int = 32) -> dict[str, tuple]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as c:

        async def one(t: str):
            async with sem:
                r = await c.post(url + "/classify", json={"model": "rm", "input": t})
            assert r.status_code == 200, r.text
            return t, (r.json()["data"][0]["probs"], r.headers["x-rmgate-slot"])

        return dict(await asyncio.gather(*(one(t) for t in texts)))


async def test_slots_on_two_nodes_answer_as_one_node_does(cluster_gateway, gateway):
    url, nodes = cluster_gateway
    # every engine each node started served its slot (a slot whose prefix-cache check
    # fails on this host starts twice: deployments/engine/prefix_verdicts.py)
    assert {p.name.split("-")[1] for p in nodes["nodeA"].engine_logs("rm")} == {"0"}
    assert {p.name.split("-")[1] for p in nodes["nodeB"].engine_logs("rm")} == {"1"}
    ingresses = [
        pid
        for pid in nodes["nodeA"].pids()
        if b"ServeReplica:rmgate:gateway" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(ingresses) == 2  # gateway.ingress_replicas: 2, both on the head
    models = httpx.get(url + "/v1/models", timeout=30)
    card = models.json()["data"][0]
    where = card["nodes"]
    for slot in where:  # each engine has its secret, told to the ingress only
        env = Path(f"/proc/{slot['engine_pid']}/environ").read_bytes().split(b"\0")
        secret = next(e.split(b"=", 1)[1] for e in env if e.startswith(b"RMGATE_ENGINE_SECRET="))
        assert len(secret) >= 32 and secret.decode() not in models.text
    assert where[0]["node_id"] != where[1]["node_id"]  # /v1/models shows where each runs
    assert where[0]["engine_pid"] in nodes["nodeA"].pids()
    assert where[1]["engine_pid"] in nodes["nodeB"].pids()
    runs = []
    for seed in (1, 2):
        order = list(TEXTS)
        random.Random(seed).shuffle(order)
        runs.append(await _replay(url, order))
    assert {t: v[0] for t, v in runs[0].items()} == {t: v[0] for t, v in runs[1].items()}
    assert {v[1] for v in runs[0].values()} == {"0", "1"}
    single = await _replay(gateway[0], TEXTS)  # the one-node session gateway, same model
    assert {t: v[0] for t, v in single.items()} == {t: v[0] for t, v in runs[0].items()}


def test_an_engine_port_refuses_a_caller_without_the_secret(cluster_gateway):
    _, nodes = cluster_gateway
    live = max(nodes["nodeB"].engine_logs("rm"), key=lambda p: p.stat().st_mtime)
    port = live.stem.rsplit("-", 1)[1]
    code = (
        "import httpx; r = httpx.post('http://127.0.0.1:%s/classify', json={'model': 'rm',"
        " 'input': 'x'}, timeout=30); print(r.status_code)" % port
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "401", out.stdout + out.stderr


async def test_losing_the_worker_node_under_load_loses_and_changes_nothing(cluster_gateway):
    """Slot 1's keys go to its class mate at once; slot 1 itself restarts on the head (its
    fallback placement) and answers with the same bits."""
    url, nodes = cluster_gateway
    texts = (TEXTS * 3)[:500]
    before = await _replay(url, TEXTS)
    assert nodes["nodeB"].raylet_pids(), "the worker node's raylet"
    sem = asyncio.Semaphore(32)
    done: list[tuple[str, float, object, str, str]] = []
    killed: list[float] = []

    async with httpx.AsyncClient(timeout=600) as c:

        async def one(t: str) -> None:
            async with sem:
                r = await c.post(url + "/classify", json={"model": "rm", "input": t})
            assert r.status_code == 200, r.text  # nothing accepted is lost
            done.append(
                (
                    t,
                    time.monotonic(),
                    r.json()["data"][0]["probs"],
                    r.headers["x-rmgate-slot"],
                    r.headers.get("x-rmgate-placement", ""),
                )
            )

        async def kill_soon() -> None:
            await asyncio.sleep(2)
            killed.append(time.monotonic())
            assert nodes["nodeB"].lose()  # its raylet and every process it started

        await asyncio.gather(kill_soon(), *(one(t) for t in texts))
    assert len(done) == len(texts)
    assert [probs for t, _, probs, _, _ in done] == [before[t][0] for t, *_ in done]
    after = [(at, slot, why) for _, at, _, slot, why in done if at > killed[0]]
    moved = [at for at, slot, why in after if "1->0" in why]
    assert moved, "slot 1's keys answered by its class mate after its node was lost"
    head = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["nodes"][0]

    def slot1_back_on_the_head() -> dict | None:
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        where = card["nodes"][1]
        back = (
            card["health"][1] == "healthy"
            and where is not None
            and where["node_id"] == head["node_id"]
        )
        return card if back else None

    deadline = time.monotonic() + 240
    while (card := slot1_back_on_the_head()) is None and time.monotonic() < deadline:
        await asyncio.sleep(2)
    assert card is not None, "slot 1 restarted on the head (its fallback placement)"
    assert card["nodes"][1]["engine_pid"] in nodes["nodeA"].pids()
    back = time.monotonic() - killed[0]
    again = await _replay(url, TEXTS)
    assert {t: v[0] for t, v in again.items()} == {t: v[0] for t, v in before.items()}
    print(
        json.dumps(
            {
                "first_answer_by_class_mate_after_kill_s": round(moved[0] - killed[0], 2),
                "answered_after_kill": len(after),
                "moved": len(moved),
                "slot1_back_on_head_after_s": round(back, 1),
                "slots_answering_after": sorted({v[1] for v in again.values()}),
                "classes": card["numerics_classes"],
            }
        )
    )
