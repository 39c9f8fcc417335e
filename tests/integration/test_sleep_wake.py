"""Sleep, wake and autoscaling end to end on CPU: real engines behind real Ray Serve.

A gateway of its own (one DisRM, ``on_sleep: refuse``, autoscaling 0..2 slots with short
delays), in the order a colocated RL run meets it:

1. a load ramp: the autoscaler adds slot 1 (it serves only once its numerics class is slot
   0's), then, idle, scales to zero (slot 0 asleep, its engine gone); the next request
   wakes it (an autoscaler's sleep always wakes, whatever ``on_sleep``). Every answer has
   the bits of the fixed one-slot run, none failed;
2. a trainer's sleep: admin key only; engine processes gone and memory freed; requests
   under each ``on_sleep`` policy (refuse: 503 + Retry-After, wait: held until the deadline
   or the wake, wake: answered); a sleep while requests are in flight loses none;
3. a slot whose weights changed on disk while it slept wakes up in another numerics class:
   kept out, named in ``/v1/models``, its requests refused rather than answered otherwise.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from benchmarks.autoscale import config
from gateway.harness.processes import vllm_servers
from gateway.harness.running import metric_total, running_gateway

pytestmark = pytest.mark.integration

USER, ADMIN = "user-key", "admin-key"
AS_USER = {"authorization": f"Bearer {USER}"}
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}
TEXTS = [f"{a}+{b}={(a * b) % 19}" for a in range(12) for b in range(10)]  # 120 keys
NO_CACHE = {"x-rmgate-cache": "off"}


@pytest.fixture(scope="module")
def elastic(demo_models, tmp_path_factory):
    work = tmp_path_factory.mktemp("elastic")
    model = work / "disrm"  # a copy: test 3 changes its weights
    shutil.copytree(demo_models / "disrm", model)
    path = work / "elastic.yaml"
    # on_sleep refuse: a trainer's sleep holds; a scale to zero wakes all the same
    path.write_text(yaml.safe_dump(config(model, 2, 8, on_sleep="refuse")))
    env = {"RMGATE_API_KEYS": USER, "RMGATE_ADMIN_API_KEYS": ADMIN}
    with running_gateway(path, work, env=env, headers=AS_USER) as (url, engines):
        yield url, engines, model


def card(url: str) -> dict:
    return httpx.get(url + "/v1/models", headers=AS_USER, timeout=60).json()["data"][0]


def wait_for(what: str, check, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f}s"
        time.sleep(1.0)


def engines_running(engines: Path) -> int:
    return len(vllm_servers(engines))


def classify(
    url: str, text: str, headers: dict | None = None, timeout: float = 600
) -> httpx.Response:
    return httpx.post(
        url + "/classify",
        json={"model": "rm", "input": text},
        headers={**AS_USER, **NO_CACHE, **(headers or {})},
        timeout=timeout,
    )


async def load(url: str, texts: list[str], concurrency: int, until=None, headers=None):
    """Every text (again and again while ``until()`` is false), ``concurrency`` at once:
    text -> set of answers, the slots that answered, and the failures."""
    answers: dict[str, set[float]] = {}
    slots: set[str] = set()
    failed: list[str] = []
    queue = list(texts)
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker(w: int) -> None:
            i = w
            while i < len(queue) or (until is not None and not until()):
                text = queue[i % len(queue)]
                i += concurrency
                r = await client.post(
                    url + "/classify",
                    json={"model": "rm", "input": text},
                    headers={**AS_USER, **NO_CACHE, **(headers or {})},
                )
                if r.status_code != 200:
                    failed.append(f"{r.status_code} {r.text[:200]}")
                    continue
                answers.setdefault(text, set()).add(r.json()["data"][0]["probs"][0])
                slots.add(r.headers["x-rmgate-slot"])

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return answers, slots, failed


REFERENCE: dict[str, float] = {}


def same_bits(answers: dict[str, set[float]]) -> list[str]:
    return [t for t, seen in answers.items() if seen != {REFERENCE[t]}]


def test_autoscaling_follows_a_ramp_and_scales_to_zero_with_unchanged_bits(elastic):
    url, engines, _ = elastic
    wait_for("awake", lambda: card(url)["state"] in ("awake", "asleep"))
    answers, _, failed = asyncio.run(load(url, TEXTS, 1))  # the fixed one-slot run
    assert not failed, failed
    REFERENCE.update({t: next(iter(v)) for t, v in answers.items()})

    start = time.monotonic()
    served_by_two: list[float] = []

    def enough() -> bool:
        if not served_by_two and card(url)["slots"] == 2:
            served_by_two.append(time.monotonic() - start)
        return bool(served_by_two) and time.monotonic() - start > served_by_two[0] + 4

    answers, slots, failed = asyncio.run(load(url, TEXTS, 8, until=timed(enough, 300)))
    assert served_by_two, "the autoscaler never added slot 1 under load"
    assert not failed, failed[:5]
    assert not same_bits(answers)
    assert slots == {"0", "1"}, slots  # the new slot served, with slot 0's bits
    up = [d for d in card(url)["autoscaling"]["decisions"] if d["to"] > d["from"]]
    assert up and up[-1]["outcome"] == "applied" and "ongoing" in up[-1]["reason"]
    print(f"\nautoscaling: slot 1 routed to {served_by_two[0]:.0f}s after the load began")

    # idle: down to zero (slot 1 drained and removed, slot 0 asleep, no engine left)
    wait_for("scaled to zero", lambda: card(url)["state"] == "asleep", timeout_s=120)
    assert card(url)["slots"] == 1
    wait_for("no engine left", lambda: engines_running(engines) == 0, timeout_s=60)
    assert card(url)["slot_states"][0]["slept_by"] == "autoscaler"
    # the next request wakes it although on_sleep is refuse (a scale to zero is not a sleep)
    r = classify(url, TEXTS[0])
    assert r.status_code == 200 and r.json()["data"][0]["probs"][0] == REFERENCE[TEXTS[0]]
    assert metric_total(url, "rmgate_autoscale_decisions_total") >= 2


def timed(check, timeout_s: float):
    """``check``, but true (stop) once ``timeout_s`` has passed as well."""
    deadline = time.monotonic() + timeout_s
    last = [0.0]

    def until() -> bool:
        now = time.monotonic()
        if now > deadline:
            return True
        if now - last[0] < 1.0:
            return False
        last[0] = now
        return check()

    return until


def sleep(url: str, headers: dict = AS_ADMIN, level: int = 1) -> httpx.Response:
    return httpx.post(f"{url}/sleep?level={level}&model=rm", headers=headers, timeout=300)


def wake(url: str) -> httpx.Response:
    return httpx.post(url + "/wake_up?model=rm", headers=AS_ADMIN, timeout=600)


def test_a_trainers_sleep_frees_the_engine_and_each_on_sleep_policy_holds(elastic):
    url, engines, _ = elastic
    assert REFERENCE, "needs the ramp's reference answers"
    assert sleep(url, headers=AS_USER).status_code == 403  # an API key is not an admin key
    assert sleep(url, headers={}).status_code == 401
    r = sleep(url)
    assert r.status_code == 200, r.text
    slot = r.json()["models"]["rm"]["slots"][0]
    assert r.json()["status"] == "sleeping" and slot["state"] == "asleep"
    assert slot["slept_by"] == "user" and slot["how"] == "stopped"
    assert engines_running(engines) == 0 and slot["last"].get("engine_rss_after", 0) == 0
    assert httpx.get(url + "/is_sleeping", headers=AS_USER, timeout=30).json()["is_sleeping"]

    refused = classify(url, TEXTS[1])  # the model's on_sleep: refuse
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_asleep"
    assert int(refused.headers["retry-after"]) > 0
    t = time.monotonic()
    held = classify(url, TEXTS[1], {"x-rmgate-on-sleep": "wait", "x-rmgate-timeout": "2"})
    assert held.status_code == 504 and time.monotonic() - t < 10  # held, never past its deadline

    waited: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: waited.append(classify(url, TEXTS[2], {"x-rmgate-on-sleep": "wait"}))
    )
    waiter.start()
    time.sleep(2)
    assert not waited  # still waiting for someone to wake the model
    woke = wake(url)
    assert woke.status_code == 200 and woke.json()["status"] == "awake", woke.text
    last = woke.json()["models"]["rm"]["slots"][0]["last"]
    assert last["class_before"] == last["class_after"]  # the numerics re-probe ran
    waiter.join(timeout=120)
    assert waited and waited[0].status_code == 200
    assert waited[0].json()["data"][0]["probs"][0] == REFERENCE[TEXTS[2]]

    # a sleep while requests are in flight: the ones inside finish, the rest wake it again
    # (2 at once: the autoscaler's target, so it adds no slot meanwhile)
    slept: list[httpx.Response] = []
    sleeper = threading.Timer(0.3, lambda: slept.append(sleep(url)))
    t = time.monotonic()
    moves = metric_total(url, "rmgate_slot_transition_seconds_count")
    sleeper.start()
    answers, _, failed = asyncio.run(load(url, TEXTS, 2, headers={"x-rmgate-on-sleep": "wake"}))
    took = time.monotonic() - t
    sleeper.join()
    assert slept and slept[0].status_code == 200, slept
    assert not failed, failed[:5]
    assert len(answers) == len(TEXTS) and not same_bits(answers)
    # a sleep and a wake, both inside the load
    assert metric_total(url, "rmgate_slot_transition_seconds_count") >= moves + 2
    assert card(url)["slot_states"][0]["last"]["op"] == "wake"
    print(f"\nin-flight sleep: {len(TEXTS)} answered in {took:.0f}s across a sleep and a wake")


def test_a_slot_that_wakes_up_in_another_numerics_class_is_kept_out(elastic):
    from safetensors.torch import load_file, save_file

    url, _, model = elastic
    assert sleep(url).status_code == 200
    weights = load_file(model / "model.safetensors")  # what a bad weight sync would leave
    weights["score.weight"] = weights["score.weight"] * 1.01
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    woke = wake(url)
    assert woke.status_code == 200 and woke.json()["status"] == "kept_out", woke.text
    entry = card(url)
    assert entry["state"] == "kept_out" and "numerics class" in entry["slot_states"][0]["kept_out"]
    r = classify(url, TEXTS[3], {"x-rmgate-on-sleep": "wake"}, timeout=120)
    assert r.status_code == 503 and "kept out" in r.json()["error"]["message"]
    assert metric_total(url, "rmgate_slot_kept_out_total") >= 1
