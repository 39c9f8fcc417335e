"""Numerics classes end to end: real ``rmgate serve`` with ``placement: class`` over real
vLLM CPU engines.

Runs before the session's gateway starts (file order: ``test_cli_*``), with its own gateway:
the judge and the DisRM with two slots each, each slot's engine on its own core
(``cpu_cores_per_slot: 1``). Shows that the two slots of a model form one class (equal
identity and probe digest), that with slot 0 made slow (its engine stopped 90 % of the time) the
keys of slot 0 are answered by slot 1 under load without a single differing answer, and
that a killed engine's keys go to its class mate at once instead of waiting for a restart.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from benchmarks.harness import engine_launcher_pid, running_gateway
from gateway.client.check import disrm_calls, grm_calls
from gateway.core.answers import answer_of
from gateway.core.hashing import slot_for_key

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENGINE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}


def config(models_dir: Path) -> dict:
    common = {"replicas": 2, "determinism": "auto", "engine_args": ENGINE,
              "cpu_cores_per_slot": 1}
    return {"applications": [{"name": "rmgate", "route_prefix": "/",
                              "import_path": "gateway.app:build_app", "args": {
        "gateway": {"placement": "class", "load_bound": 1.0, "slot_wait_s": 180},
        "models": [
            {"name": "judge", "kind": "generative", "model_path": str(models_dir / "grm"),
             "sampling_defaults": {"temperature": 1.0, "max_tokens": 8}, **common},
            {"name": "rm", "kind": "discriminative", "model_path": str(models_dir / "disrm"),
             **common},
        ]}}]}


@pytest.fixture(scope="module")
def classes_gateway(demo_models, tmp_path_factory):
    work = tmp_path_factory.mktemp("numerics")
    path = work / "classes.yaml"
    path.write_text(yaml.safe_dump(config(demo_models)))
    with running_gateway(path, work) as (url, engines):
        yield url, engines


@contextmanager
def slowed(pgids: list[int], stopped_s: float = 0.09, running_s: float = 0.01):
    """Make engines really slow, whatever the scheduler does: their whole process groups
    are stopped 90 % of the time (SIGSTOP/SIGCONT), and always continued at the end."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            for pgid in pgids:
                os.killpg(pgid, signal.SIGSTOP)
            time.sleep(stopped_s)
            for pgid in pgids:
                os.killpg(pgid, signal.SIGCONT)
            time.sleep(running_s)

    worker = threading.Thread(target=cycle, daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join()
        for pgid in pgids:
            os.killpg(pgid, signal.SIGCONT)


def _engine_group(engines: Path, slot_app: str) -> int:
    port = int(sorted(engines.glob(f"{slot_app}-*.log"))[-1].stem.rsplit("-", 1)[1])
    return engine_launcher_pid(port)  # the launcher leads the engine's process group


async def _replay(url: str, calls, order: list[int], concurrency: int) -> dict[int, tuple]:
    """index -> (status, canonical answer, answering slot, placement header, seconds)."""
    sem = asyncio.Semaphore(concurrency)
    out: dict[int, tuple] = {}
    async with httpx.AsyncClient(base_url=url, timeout=300,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as c:
        async def one(i: int) -> None:
            async with sem:
                start = time.monotonic()
                r = await c.post(calls[i].path, json=calls[i].body)
                answer = answer_of(calls[i].path, r.json()).canonical if r.status_code == 200 \
                    else r.text
                out[i] = (r.status_code, answer, r.headers.get("x-rmgate-slot"),
                          r.headers.get("x-rmgate-placement"), time.monotonic() - start,
                          int(r.headers.get("x-rmgate-key", "0"), 16))
        await asyncio.gather(*(one(i) for i in order))
    return out


def test_the_slots_of_a_model_form_one_class(classes_gateway):
    url, _ = classes_gateway
    models = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}
    for name in ("judge", "rm"):
        card = models[name]
        assert card["placement"] == "class"
        digests = [n["probe_digest"] for n in card["numerics"]]
        assert None not in card["numerics_classes"], card
        assert len(set(card["numerics_classes"])) == 1 and len(set(digests)) == 1, card
        assert card["classes"] == {card["numerics_classes"][0]: [0, 1]} and not card["drained"]
        identity = card["numerics"][0]["identity"]
        assert identity["mode"] == "serialize" and identity["omp_threads"] == "1"
    # the two models are different classes (another model digest, another probe set)
    assert models["judge"]["numerics_classes"][0] != models["rm"]["numerics_classes"][0]


def test_a_slow_slots_keys_are_answered_by_its_class_mate_with_the_same_bits(classes_gateway):
    url, engines = classes_gateway
    calls = grm_calls(60, model="judge", seed=5, max_tokens=8) + disrm_calls(120, model="rm",
                                                                             seed=6)
    calls = [c for c in calls if not isinstance(c.body.get("input"), list)]  # one key each
    reference = asyncio.run(_replay(url, calls, list(range(len(calls))), 1))
    assert all(r[0] == 200 for r in reference.values())
    runs = []
    with slowed([_engine_group(engines, "judge-0"), _engine_group(engines, "rm-0")]):
        for seed in (1, 2):
            order = list(range(len(calls)))
            random.Random(seed).shuffle(order)
            runs.append(asyncio.run(_replay(url, calls, order, 32)))
    differing = sum(run[i][1] != reference[i][1] for run in runs for i in reference)
    assert differing == 0
    slow = [(run[i], calls[i]) for run in runs for i in reference
            if slot_for_key(run[i][5], 2) == 0]
    moved = [r for r, _ in slow if r[2] != "0"]
    print(f"\nslow slot 0: {len(moved)} of {len(slow)} of its keys' requests answered by "
          f"slot 1; 0 of {len(runs) * len(reference)} answers differ")
    # The target is a third; measured 46-66 of 138 here (33-48 %). The assertion
    # keeps a margin for a loaded CI machine: bounded load moves keys only past its bound.
    assert len(moved) >= len(slow) / 4
    assert all(r[3] and r[3].startswith("0->1:") for r in moved)


def test_a_killed_engines_keys_go_to_its_class_mate_at_once(classes_gateway):
    url, engines = classes_gateway
    calls = disrm_calls(300, model="rm", seed=11)
    calls = [c for c in calls if not isinstance(c.body.get("input"), list)]
    order = list(range(len(calls)))
    reference = asyncio.run(_replay(url, calls, order, 4))
    group = _engine_group(engines, "rm-0")

    async def under_load() -> dict[int, tuple]:
        async def kill() -> None:
            await asyncio.sleep(1.0)
            os.killpg(group, signal.SIGKILL)
        killer = asyncio.ensure_future(kill())
        out = await _replay(url, calls, order, 4)
        await killer
        return out

    start = time.monotonic()
    result = asyncio.run(under_load())
    took = time.monotonic() - start
    assert all(result[i][0] == 200 for i in order), [result[i] for i in order
                                                     if result[i][0] != 200][:3]
    assert all(result[i][1] == reference[i][1] for i in order)  # 0 lost, 0 changed
    homed = [result[i] for i in order if slot_for_key(result[i][5], 2) == 0]
    away = [r for r in homed if r[2] == "1"]
    worst = max(r[4] for r in homed)
    print(f"\nrm-0 killed under load: {len(away)} of {len(homed)} of its keys answered by "
          f"rm-1; slowest request of a slot-0 key {worst:.2f} s; the {len(order)} requests "
          f"took {took:.1f} s")
    assert away and worst < 15.0  # a restart takes ~40-50 s on this machine
