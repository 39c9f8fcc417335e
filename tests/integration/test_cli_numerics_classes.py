"""Numerics classes end to end: real ``rmgate serve`` with ``placement: class`` over real
vLLM CPU engines.

Runs after the session's gateway is stopped (``tests/conftest.py`` orders the files with
gateways of their own last), with its own gateway:
the judge and the DisRM with two slots each, each slot's engine on its own core
(``cpu_cores_per_slot: 1``), the canary every few seconds. In order, on the one gateway:

1. the two slots of a model form one class (equal identity and probe digest);
2. with slot 0 made slow (its engine stopped 90 % of the time) the keys of slot 0 are
   answered by slot 1 under load without a single differing answer;
3. a killed engine's keys go to its class mate at once instead of waiting for a restart;
4. while that engine restarts (a fault in ``rm``), ``rmgate scale judge`` 2 -> 1 works;
5. the canary drains a slot whose weights are swapped under it (vLLM's ``/collective_rpc
   reload_weights``, a real engine feature) and re-admits it when they are put back; its
   keys keep their bits meanwhile;
6. a slot restarted with another dtype under the same name is another class, drained under
   ``strict``; the same bodies sent to it give other answers (the negative control: the
   class boundary is what keeps the bits).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.client.check import disrm_calls, grm_calls
from gateway.core.api.answers import answer_of
from gateway.core.routing.hashing import slot_for_key
from gateway.core.routing.keys import group_key
from gateway.harness.processes import engine_launcher_pid, engine_port, engine_secret_headers
from gateway.harness.running import dashboard_address, metric_total, running_gateway
from gateway.harness.slowdowns import duty_cycled
from tests.integration.prefix_groups import GROUP_REWARDS, MODELS, grpo_items, post_rewards

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: The canary's interval here: short, so that a drift is seen within seconds.
CANARY_S = 4.0
ENGINE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}
YES = {
    "type": "judge_prob",
    "template": "Is {prompt}{response} right?",
    "answer_prefix": "Score: ",
    "yes": ["1"],
    "no": ["0"],
}


def config(models_dir: Path) -> dict:
    common = {"replicas": 2, "determinism": "auto", "engine_args": ENGINE, "cpu_cores_per_slot": 1}
    return {
        "applications": [
            {
                "name": "rmgate",
                "route_prefix": "/",
                "import_path": "gateway.serve.app:build_app",
                "args": {
                    # cache off: these tests watch which slot computes each (repeated) request
                    "gateway": {
                        "placement": "class",
                        "load_bound": 1.0,
                        "slot_wait_s": 180,
                        "canary_interval_s": CANARY_S,
                        "cache": "off",
                    },
                    "models": [
                        {
                            "name": "judge",
                            "kind": "generative",
                            "model_path": str(models_dir / "grm"),
                            "sampling_defaults": {"temperature": 1.0, "max_tokens": 8},
                            **common,
                        },
                        # dev mode: the engine's /collective_rpc, to swap its weights
                        # under it (test 5)
                        {
                            "name": "rm",
                            "kind": "discriminative",
                            "model_path": str(models_dir / "disrm"),
                            "engine_env": {"VLLM_SERVER_DEV_MODE": "1"},
                            **common,
                        },
                    ],
                    # the session gateway's judge_prob program (prefix_groups): its groups'
                    # rewards, computed with a proven prefix cache, compared here without one
                    "programs": [
                        {
                            "name": "judge_yes",
                            "components": [{"name": "p", "model": "judge", "scorer": YES}],
                        }
                    ],
                },
            }
        ]
    }


@pytest.fixture(scope="module")
def classes_gateway(demo_models, tmp_path_factory):
    work = tmp_path_factory.mktemp("numerics")
    path = work / "classes.yaml"
    path.write_text(yaml.safe_dump(config(demo_models)))
    with running_gateway(path, work) as (url, engines):
        yield url, engines, work


def _engine_group(engines: Path, slot_app: str) -> int:
    return engine_launcher_pid(engine_port(engines, slot_app))  # it leads the group


async def _replay(url: str, calls, order: list[int], concurrency: int) -> dict[int, tuple]:
    """index -> (status, canonical answer, answering slot, placement header, seconds)."""
    sem = asyncio.Semaphore(concurrency)
    out: dict[int, tuple] = {}
    async with httpx.AsyncClient(
        base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency + 4)
    ) as c:

        async def one(i: int) -> None:
            async with sem:
                start = time.monotonic()
                r = await c.post(calls[i].path, json=calls[i].body)
                answer = (
                    answer_of(calls[i].path, r.json()).canonical if r.status_code == 200 else r.text
                )
                out[i] = (
                    r.status_code,
                    answer,
                    r.headers.get("x-rmgate-slot"),
                    r.headers.get("x-rmgate-placement"),
                    time.monotonic() - start,
                    int(r.headers.get("x-rmgate-key", "0"), 16),
                )

        await asyncio.gather(*(one(i) for i in order))
    return out


def test_the_slots_of_a_model_form_one_class(classes_gateway):
    url, _, _ = classes_gateway
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


@pytest.mark.parametrize("model", MODELS)
async def test_groups_answered_with_a_proven_cache_have_the_bits_of_items_without_one(
    classes_gateway, request, model
):
    """The session gateway's engines cached the groups' shared prompts (``prefix_cache:
    auto``, proven at start-up); these engines have no prefix cache. The same items, sent one
    by one here, shuffled, must give the session's group rewards bit for bit."""
    stashed = request.config.stash.get(GROUP_REWARDS, {}).get(model)
    if stashed is None:
        pytest.skip(
            "needs the session gateway's group rewards (tests/integration/test_prefix_cache.py)"
        )
    url, _, _ = classes_gateway
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    assert all(not any(m["prefix_cache"]) for m in models), "the reference has no cache"
    items = grpo_items()
    alone = await post_rewards(url, model, [[item] for item in items], 8, 4)
    assert [a["rewards"][0] for a in alone] == stashed


def test_a_slow_slots_keys_are_answered_by_its_class_mate_with_the_same_bits(classes_gateway):
    url, engines, _ = classes_gateway
    calls = grm_calls(60, model="judge", seed=5, max_tokens=8) + disrm_calls(
        120, model="rm", seed=6
    )
    calls = [c for c in calls if not isinstance(c.body.get("input"), list)]  # one key each
    reference = asyncio.run(_replay(url, calls, list(range(len(calls))), 1))
    assert all(r[0] == 200 for r in reference.values())
    runs = []
    with duty_cycled([_engine_group(engines, "judge-0"), _engine_group(engines, "rm-0")]):
        for seed in (1, 2):
            order = list(range(len(calls)))
            random.Random(seed).shuffle(order)
            runs.append(asyncio.run(_replay(url, calls, order, 32)))
    differing = sum(run[i][1] != reference[i][1] for run in runs for i in reference)
    assert differing == 0
    slow = [
        (run[i], calls[i]) for run in runs for i in reference if slot_for_key(run[i][5], 2) == 0
    ]
    moved = [r for r, _ in slow if r[2] != "0"]
    print(
        f"\nslow slot 0: {len(moved)} of {len(slow)} of its keys' requests answered by "
        f"slot 1; 0 of {len(runs) * len(reference)} answers differ"
    )
    # The target is a third; measured 46-66 of 138 here (33-48 %). The assertion
    # keeps a margin for a loaded CI machine: bounded load moves keys only past its bound.
    assert len(moved) >= len(slow) / 4
    assert all(r[3] and r[3].startswith("0->1:") for r in moved)


def test_a_killed_engines_keys_go_to_its_class_mate_at_once(classes_gateway):
    url, engines, _ = classes_gateway
    calls = disrm_calls(300, model="rm", seed=11)
    calls = [c for c in calls if not isinstance(c.body.get("input"), list)]
    order = list(range(len(calls)))
    reference = asyncio.run(_replay(url, calls, order, 4))
    group = _engine_group(engines, "rm-0")
    groups = _home_groups(4, 8, slot=0)
    group_reference = asyncio.run(_send_groups(url, groups, passes=1))

    async def under_load() -> tuple[dict[int, tuple], list[tuple]]:
        async def kill() -> None:
            await asyncio.sleep(1.0)
            os.killpg(group, signal.SIGKILL)

        killer = asyncio.ensure_future(kill())
        out, grouped = await asyncio.gather(
            _replay(url, calls, order, 4), _send_groups(url, groups, passes=4, start_s=0.8)
        )
        await killer
        return out, grouped

    start = time.monotonic()
    result, grouped = asyncio.run(under_load())
    took = time.monotonic() - start
    # groups of slot 0 sent across the kill: every one answered, with its bits, by the
    # class mate once its home is gone
    assert all(status == 200 for status, _, _ in grouped), grouped[:2]
    assert all(
        rewards == group_reference[i % len(groups)][1] for i, (_, rewards, _) in enumerate(grouped)
    )
    assert any("1" in slots for _, _, slots in grouped), "no group went to the class mate"
    assert all(result[i][0] == 200 for i in order), [
        result[i] for i in order if result[i][0] != 200
    ][:3]
    assert all(result[i][1] == reference[i][1] for i in order)  # 0 lost, 0 changed
    homed = [result[i] for i in order if slot_for_key(result[i][5], 2) == 0]
    away = [r for r in homed if r[2] == "1"]
    worst = max(r[4] for r in homed)
    print(
        f"\nrm-0 killed under load: {len(away)} of {len(homed)} of its keys answered by "
        f"rm-1; slowest request of a slot-0 key {worst:.2f} s; the {len(order)} requests "
        f"took {took:.1f} s"
    )
    assert away and worst < 15.0  # a restart takes ~40-50 s on this machine


def _home_groups(n: int, size: int, slot: int) -> list[list[dict]]:
    """``n`` groups of ``size`` DisRM items whose group key's home is ``slot`` (of 2)."""
    out: list[list[dict]] = []
    g = 0
    while len(out) < n:
        name = f"kill-{g}"
        g += 1
        if slot_for_key(group_key("rm", name), 2) != slot:
            continue
        prompt = f"Problem {g}: add " + " + ".join(str(k) for k in range(g, g + 30))
        out.append([{"prompt": prompt, "response": f" {r}", "group": name} for r in range(size)])
    return out


async def _send_groups(
    url: str, groups: list[list[dict]], passes: int, start_s: float = 0.0
) -> list[tuple[int, list, set[str]]]:
    """(status, rewards, answering slots) of each group, sent one after another,
    ``passes`` times over, starting after ``start_s``."""
    await asyncio.sleep(start_s)
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        for _ in range(passes):
            for items in groups:
                r = await c.post("/v1/rewards", json={"model": "rm", "items": items})
                if r.status_code != 200:
                    out.append((r.status_code, [], set()))
                    continue
                slots = {str(d["slot"]) for d in r.json()["details"]}
                out.append((200, r.json()["rewards"], slots))
    return out


def _card(url: str, model: str) -> dict:
    cards = httpx.get(url + "/v1/models", timeout=60).json()["data"]
    return next(c for c in cards if c["id"] == model)


def _wait(what: str, check, timeout_s: float = 240.0, poke=None) -> None:
    """Poll ``check()`` until it holds (``poke()`` between polls, e.g. a request that makes
    the gateway look at a slot again)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not in {timeout_s:.0f} s: {what}"
        if poke is not None:
            poke()
        time.sleep(1.0)


def _single_key_disrm(n: int, seed: int):
    return [
        c
        for c in disrm_calls(n, model="rm", seed=seed)
        if not isinstance(c.body.get("input"), list)
    ]


def _direct(port: int, calls) -> list[str]:
    """The canonical answers of one engine reached directly (no gateway, no placement)."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}", timeout=120, headers=engine_secret_headers(port)
    ) as c:
        return [
            answer_of(call.path, c.post(call.path, json=call.body).json()).canonical
            for call in calls
        ]


#: Serve's REST API in a fresh process: Ray reads its auth mode once per process (the C++
#: side caches it), so in a test process where Ray was used before ``RAY_AUTH_MODE=token``
#: was set, requests carry no token and get 401 (seen in the full suite, not alone).
ADMIN_SCRIPT = """
import json, sys
from gateway.serve.admin import ServeAdmin
admin = ServeAdmin(sys.argv[1])
if sys.argv[2] == "statuses":
    print(json.dumps(admin.statuses()))
else:  # redeploy slot app argv[3] with its engine_args updated by the JSON argv[4]
    apps = admin.applications()
    changed = json.loads(json.dumps(apps))
    spec = next(a for a in changed if a["name"] == sys.argv[3])["args"]["spec"]
    spec["engine_args"] = {**spec["engine_args"], **json.loads(sys.argv[4])}
    admin.apply(changed, 600, current=apps)
    print("{}")
"""


def _admin(work: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ADMIN_SCRIPT, dashboard_address(work / "serve.log"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_scaling_one_model_works_while_another_models_engine_restarts(classes_gateway):
    """The fault the issue measured: ``rmgate scale`` used to judge every application and
    failed on another model's restarting slot. Now it judges only what it changes.

    rm-1 is killed now (rm-0 is still restarting after the previous test's kill: the two
    boots overlap instead of following each other), so that its restart (~40 s) spans the
    whole scale. The judge is scaled 2 -> 1 only: no engine to boot, and the later tests
    use rm alone."""
    url, engines, work = classes_gateway
    os.killpg(_engine_group(engines, "rm-1"), signal.SIGKILL)
    _wait(
        "rm-1 seen failing by Serve",
        lambda: _admin(work, "statuses").get("rm-1") != "RUNNING",
        timeout_s=60,
    )
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    address = dashboard_address(work / "serve.log")
    out = subprocess.run(
        [str(BIN / "rmgate"), "scale", "judge", "1", "--address", address],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    during = _admin(work, "statuses").get("rm-1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _card(url, "judge")["slots"] == 1
    print(f"\nrmgate scale judge 2 -> 1 while rm-1 restarted (rm-1 was {during})")
    assert during != "RUNNING", "the fault was over before the scale: not a test"
    body = {
        "model": "judge",
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 3,
        "max_tokens": 4,
    }
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=300).status_code == 200


def test_the_canary_drains_a_slot_whose_weights_change_under_it(
    classes_gateway, demo_models, tmp_path
):
    from safetensors.torch import load_file, save_file

    url, engines, _ = classes_gateway
    _wait(
        "rm healthy, one class",
        lambda: (lambda c: c["health"] == ["healthy"] * 2 and not c["drained"])(_card(url, "rm")),
    )
    calls = _single_key_disrm(160, seed=21)
    order = list(range(len(calls)))
    reference = asyncio.run(_replay(url, calls, order, 4))
    # Other weights of the same shapes (the score head scaled by 1.01): what an engine that
    # was handed the wrong checkpoint by a weight sync would serve.
    other = tmp_path / "disrm-other"
    shutil.copytree(demo_models / "disrm", other)
    weights = load_file(other / "model.safetensors")
    weights["score.weight"] = weights["score.weight"] * 1.01
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    port1, port0 = engine_port(engines, "rm-1"), engine_port(engines, "rm-0")

    def reload(path: Path) -> None:
        r = httpx.post(
            f"http://127.0.0.1:{port1}/collective_rpc",
            timeout=120,
            headers=engine_secret_headers(port1),
            json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
        )
        assert r.status_code == 200, r.text

    drift_before = metric_total(url, "rmgate_canary_drift_total")
    reload(other)
    try:
        sample = calls[:20]
        assert _direct(port1, sample) != _direct(port0, sample)  # the swap changes answers
        _wait(
            "the canary drains rm-1",
            lambda: "1" in _card(url, "rm")["drained"],
            timeout_s=20 * CANARY_S,
        )
        assert "canary" in _card(url, "rm")["drained"]["1"]
        assert metric_total(url, "rmgate_canary_drift_total") > drift_before
        shuffled = order[:]
        random.Random(3).shuffle(shuffled)
        during = asyncio.run(_replay(url, calls, shuffled, 8))
        assert all(during[i][:2] == reference[i][:2] for i in order)  # 0 lost, 0 changed
        homed = [during[i] for i in order if slot_for_key(during[i][5], 2) == 1]
        assert homed and all(r[2] == "0" and r[3].startswith("1->0:drained") for r in homed)
    finally:
        reload(demo_models / "disrm")
    _wait(
        "the canary re-admits rm-1",
        lambda: not _card(url, "rm")["drained"],
        timeout_s=20 * CANARY_S,
    )
    after = asyncio.run(_replay(url, calls, order, 1))
    assert all(after[i][:2] == reference[i][:2] for i in order)
    assert {after[i][2] for i in order} == {"0", "1"}  # idle again: each key on its own slot
    print(
        f"\ncanary: rm-1 drained after its weights changed, {len(homed)} of its keys' "
        "requests answered by rm-0 with unchanged bits, re-admitted after the swap back"
    )


def test_a_slot_restarted_with_another_dtype_is_another_class(classes_gateway):
    """The negative control of the class boundary: the same bodies on the two classes'
    engines differ, and the gateway keeps every key on the majority class."""
    url, engines, work = classes_gateway
    calls = _single_key_disrm(160, seed=31)
    order = list(range(len(calls)))
    reference = asyncio.run(_replay(url, calls, order, 4))
    old_port = engine_port(engines, "rm-1")
    _admin(work, "redeploy", "rm-1", json.dumps({"dtype": "bfloat16"}))

    def classes_seen() -> bool:
        card = _card(url, "rm")
        return card["health"] == ["healthy"] * 2 and "1" in card["drained"]

    _wait(
        "rm-1 back as another class",
        classes_seen,
        timeout_s=300,
        poke=lambda: asyncio.run(_replay(url, calls[:8], list(range(8)), 8)),
    )
    card = _card(url, "rm")
    assert card["numerics_classes"][0] != card["numerics_classes"][1]
    assert card["numerics"][1]["identity"]["dtype"] == "bfloat16"
    assert "majority" in card["drained"]["1"]
    shuffled = order[:]
    random.Random(4).shuffle(shuffled)
    during = asyncio.run(_replay(url, calls, shuffled, 8))
    assert all(during[i][:2] == reference[i][:2] for i in order)
    assert all(during[i][2] == "0" for i in order)
    new_port = engine_port(engines, "rm-1")
    assert new_port != old_port
    forced = sum(
        a != b
        for a, b in zip(_direct(new_port, calls), _direct(engine_port(engines, "rm-0"), calls))
    )
    print(
        f"\nrm-1 restarted in bfloat16: class {card['numerics_classes'][1]} vs "
        f"{card['numerics_classes'][0]}, drained; the same {len(calls)} bodies on the two "
        f"engines directly: {forced} differ; through rmgate: 0 differ"
    )
    assert forced >= 1
