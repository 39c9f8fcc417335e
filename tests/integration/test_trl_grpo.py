"""TRL's ``GRPOTrainer`` rewarded through rmgate: two runs, same seed, the same bits.

``examples/trl_grpo.py`` (trl==1.16.0, in the overlay venv of ``scripts/trainer_env.sh
trl``) trains the tiny demo policy for a few steps with three reward functions: the DisRM
and the GRM judge through ``RewardClient``, and a rule check. Each reward function records
every reward it returns (``float.hex``), with the step and the completion.

* Through rmgate: two runs with the same seed give the same completions at every step, the
  same reward bits from every reward function, and the same final weights (sha256) — even
  though the two runs request the rewards differently (one item per request at
  concurrency 1 vs lists of 16 at concurrency 32).
* The control: the very same two runs with the DisRM rewards sent through the least-loaded
  baseline proxy to a plain vLLM engine (``determinism: off``) of the wide DisRM differ in
  at least one reward: there, a one-token input scored alone takes another kernel than in
  a batch (docs/determinism.md), so the reward depends on how it was sent.

Each pair runs concurrently (two processes, one torch thread each) to keep the test short;
for rmgate that is one more thing that must not matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.harness.processes import stop_process_group
from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration

STEPS = 4
SEED = 0
EXAMPLE = REPO / "examples" / "trl_grpo.py"
#: Run A asks one item per request, one request at a time; run B lists of 16, 32 at once.
CLIENT_A = ("--client-batch-size", "1", "--client-concurrency", "1")
CLIENT_B = ("--client-batch-size", "16", "--client-concurrency", "32")
RUN_TIMEOUT_S = 600
FUNCS = {"rm_reward", "judge_reward", "rule_reward"}
BATCH = 8  # completions per step (examples/trl_grpo.py: 2 prompts x 4 generations)


@pytest.fixture(scope="module")
def trl_python() -> str:
    """The trl venv's python (made once and cached by scripts/trainer_env.sh)."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "trainer_env.sh"), "trl"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    python = out.stdout.strip().splitlines()[-1]
    assert Path(python).is_file(), out.stdout
    return python


def _start(python: str, out: Path, url: str, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        python,
        str(EXAMPLE),
        "--url",
        url,
        "--seed",
        str(SEED),
        "--steps",
        str(STEPS),
        "--out",
        str(out),
        *extra,
    ]
    with open(out / "run.log", "wb") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _pair(python: str, root: Path, url: str, *extra: str) -> tuple[dict, dict]:
    """Runs A and B (concurrently); each as ({(func, step, index): record}, summary)."""
    procs = {
        name: _start(python, root / name, url, *extra, *client)
        for name, client in (("a", CLIENT_A), ("b", CLIENT_B))
    }
    codes: dict[str, int | None] = {}
    try:
        for name, proc in procs.items():
            codes[name] = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:  # a failed or hung run must not leave the other one running
        for proc in procs.values():
            stop_process_group(proc, grace_s=5)
    for name, rc in codes.items():
        log = (root / name / "run.log").read_text(errors="replace")
        assert rc == 0, f"run {name} exited {rc}:\n{log[-4000:]}"
    return _load(root / "a"), _load(root / "b")


def _load(out: Path) -> tuple[dict[tuple[str, int, int], dict[str, Any]], dict[str, Any]]:
    records = {}
    for line in (out / "rewards.jsonl").read_text().splitlines():
        r = json.loads(line)
        records[(r["func"], r["step"], r["index"])] = r
    return records, json.loads((out / "summary.json").read_text())


def _rewards(records: dict, func: str) -> list[float]:
    return [float.fromhex(r["reward"]) for k, r in sorted(records.items()) if k[0] == func]


def test_two_trl_grpo_runs_get_the_same_bits_through_rmgate(
    gateway, trl_python, plain_engine, tmp_path
):
    url, _ = gateway
    started = time.monotonic()
    (rec_a, sum_a), (rec_b, sum_b) = _pair(trl_python, tmp_path, url)
    print(
        f"two TRL runs through rmgate: {time.monotonic() - started:.1f}s "
        f"(each {sum_a['wall_s']}s / {sum_b['wall_s']}s)"
    )

    # Every reward function was called once per step, on every completion.
    assert sum_a["reward_calls"] == {f: STEPS for f in FUNCS}
    assert len(rec_a) == len(FUNCS) * STEPS * BATCH
    # Bitwise: completions (text and token ids), reward hex, per function, step and sample.
    assert rec_a.keys() == rec_b.keys()
    differing = [k for k in rec_a if rec_a[k] != rec_b[k]]
    assert not differing, [(rec_a[k], rec_b[k]) for k in differing[:5]]
    # ...and the training itself: losses and the final weights.
    assert sum_a["losses"] == sum_b["losses"]
    assert sum_a["initial_policy_sha256"] == sum_b["initial_policy_sha256"]
    assert sum_a["final_policy_sha256"] == sum_b["final_policy_sha256"]

    # Not vacuous: the policy moved, the DisRM's rewards vary, the rule saw right and wrong.
    assert sum_a["final_policy_sha256"] != sum_a["initial_policy_sha256"]
    assert len(set(_rewards(rec_a, "rm_reward"))) >= 4
    assert set(_rewards(rec_a, "rule_reward")) == {0.0, 1.0}
    assert len(set(_rewards(rec_a, "judge_reward"))) > 1


def _one_token_batch_variance(engine_url: str) -> int:
    """How many one-token inputs the plain engine scores differently alone than in one list:
    what the control below needs the platform to show (TRL's completions here are a digit
    or a few characters)."""
    import httpx

    texts = [chr(c) for c in range(33, 97)]
    body = {"model": "rm-large", "use_activation": False}
    with httpx.Client(timeout=300) as client:
        alone = [
            client.post(engine_url + "/classify", json={**body, "input": t}).json()["data"][0][
                "probs"
            ]
            for t in texts
        ]
        listed = client.post(engine_url + "/classify", json={**body, "input": texts}).json()
    together = [d["probs"] for d in sorted(listed["data"], key=lambda d: d["index"])]
    return sum(a != b for a, b in zip(alone, together, strict=True))


def test_control_the_same_runs_through_a_least_loaded_proxy_differ(
    gateway, trl_python, plain_engine, least_loaded, tmp_path
):
    """Where the platform shows batch variance for short inputs (AVX-512 hosts), two TRL
    runs whose DisRM goes through a least-loaded proxy to plain vLLM get other rewards. On a
    host where it does not (AVX2-only: oneDNN's fp32 GEMM is row-invariant there, measured),
    the control has nothing to show and is skipped, saying so, before the two runs."""
    url, _ = gateway
    engine, _ = plain_engine
    if not _one_token_batch_variance(engine.url):
        pytest.skip(
            "plain vLLM on this CPU scores one-token inputs with the same bits alone "
            "and batched: no batch variance for this control to show"
        )
    started = time.monotonic()
    (rec_a, sum_a), (rec_b, sum_b) = _pair(
        trl_python,
        tmp_path,
        url,
        "--rm-url",
        least_loaded,
        "--rm-model",
        "rm-large",
        "--rm-endpoint",
        "classify",
    )
    print(f"two TRL runs, DisRM through the least-loaded proxy: {time.monotonic() - started:.1f}s")
    assert sum_a["rm"]["url"] == least_loaded
    # Step 0 is generated before any reward can matter: the same completions in both runs
    # (so any difference below comes from the reward path, not from TRL).
    step0 = [k for k in rec_a if k[1] == 0]
    assert all(rec_a[k]["completion_ids"] == rec_b[k]["completion_ids"] for k in step0)
    rm_keys = sorted(k for k in rec_a.keys() & rec_b.keys() if k[0] == "rm_reward")
    differing = [k for k in rm_keys if rec_a[k]["reward"] != rec_b[k]["reward"]]
    same_weights = sum_a["final_policy_sha256"] == sum_b["final_policy_sha256"]
    print(
        f"control: {len(differing)} of {len(rm_keys)} DisRM rewards differ; final weights "
        f"{'equal' if same_weights else 'differ'}"
    )
    assert differing, "the plain path gave identical rewards: the control shows nothing"
