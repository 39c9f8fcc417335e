"""The ``code_tests`` rule: its policy (code, tests, score, identity) and the real bwrap
sandbox it runs in. Each security test runs the same code once more without the sandbox
(a plain subprocess, what trainers do today) and shows it succeeds there: the sandbox is
what stops it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gateway.core.config.code_rules import CodeTestsRule, LocalSandbox
from gateway.core.config.settings import AppConfig
from gateway.core.scoring.base import CodeCall
from gateway.core.scoring.code_tests import (
    BadTests,
    extract_code,
    parse_tests,
    score,
    submission,
)
from gateway.core.service import RewardService
from gateway.harness.processes import alive, descendants, running
from gateway.http.app import create_app
from gateway.ledger.ledger import Ledger
from gateway.observability import metrics
from gateway.sandbox.harness import outputs_match
from gateway.sandbox.local import LocalBackend
from gateway.sandbox.runner import CodeSandboxes, code_rules
from tests.unit.test_rewards import CONFIG, JudgeTransport

LIMITS = {
    "cpu_s": 1,
    "wall_s": 3.0,
    "memory_mb": 256,
    "output_bytes": 1 << 20,
    "processes": 16,
    "tmp_mb": 32,
    "near_limit": 0.9,
}


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\nDone."


# ---- policy -----------------------------------------------------------------------------
def test_the_last_python_block_is_the_code():
    text = "```\nprint(1)\n```\ntext\n```js\nconsole.log(2)\n```\n```python\nprint(3)\n```"
    assert extract_code(text, "fenced") == "print(3)\n"
    assert extract_code("no code here", "fenced") is None
    assert extract_code("print(4)", "whole") == "print(4)"


def test_every_label_form_becomes_tests_and_a_bad_one_is_named():
    io = parse_tests({"inputs": ["1\n", ["2", "3"]], "outputs": ["1", 5]})
    assert io == [{"input": "1\n", "output": "1"}, {"input": "2\n3\n", "output": "5"}]
    assert parse_tests(json.dumps({"inputs": ["1"], "outputs": ["2"]})) == [
        {"input": "1", "output": "2"}
    ]
    assert parse_tests([{"input": "a", "output": "b"}]) == [{"input": "a", "output": "b"}]
    assert parse_tests({"asserts": ["assert f(1) == 2", "assert f(2) == 3"]}) == [
        {"code": "assert f(1) == 2"},
        {"code": "assert f(2) == 3"},
    ]
    assert parse_tests("assert f(1) == 2") == [{"code": "assert f(1) == 2"}]
    assert parse_tests({"test": "assert True"}) == [{"code": "assert True"}]
    for bad in ({"inputs": ["1"], "outputs": []}, {"x": 1}, [{"input": "1"}], None, 3):
        with pytest.raises(BadTests):
            parse_tests(bad)


def test_outputs_compare_by_lines_tokens_or_exactly():
    assert outputs_match("1 2 \n3\n\n", "1 2\n3", "lines")
    assert not outputs_match("1  2\n3", "1 2\n3", "lines")
    assert outputs_match("1  2\n3", "1 2 3", "tokens")
    assert not outputs_match("3\n", "3", "exact")


def test_the_score_is_the_fraction_passed_or_all_or_nothing():
    verdicts = [
        {"outcome": "passed"},
        {"outcome": "failed"},
        {"outcome": "timeout"},
        {"outcome": "passed"},
    ]
    fraction = score(CodeTestsRule(), verdicts)
    assert fraction.value == 0.5
    assert fraction.detail["tests"]["counts"] == {"passed": 2, "failed": 1, "timeout": 1}
    assert score(CodeTestsRule(score="all_or_nothing"), verdicts).value == 0.0
    assert score(CodeTestsRule(score="all_or_nothing"), verdicts[:1]).value == 1.0


def test_the_identity_covers_code_tests_and_limits():
    spec = CodeTestsRule()
    base = submission(spec, "print(1)", [{"input": "", "output": "1"}])
    assert base == submission(CodeTestsRule(), "print(1)", [{"input": "", "output": "1"}])
    tighter = CodeTestsRule(limits={"cpu_s": 1})
    assert submission(tighter, "print(1)", [{"input": "", "output": "1"}]) != base
    with pytest.raises(ValidationError, match="below limits.cpu_s"):
        CodeTestsRule(limits={"cpu_s": 5, "wall_s": 2})


# ---- the sandbox ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def backend():
    return LocalBackend(LocalSandbox())


def sandboxed(backend: LocalBackend, code: str, tests=None, **limits) -> list[dict]:
    sub = {
        "code": code,
        "tests": tests or [{"input": "", "output": "ok"}],
        "limits": {**LIMITS, **limits},
        "compare": "lines",
        "stop_on_failure": False,
    }
    return asyncio.run(backend.run(sub, 60))["tests"]


def unsandboxed(code: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """The negative control: the same code as a trainer runs it today."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )


def test_right_wrong_and_crashing_code_are_told_apart(backend):
    tests = [{"input": "2\n", "output": "4"}, {"input": "3\n", "output": "6"}]
    assert [v["outcome"] for v in sandboxed(backend, "print(int(input()) * 2)", tests)] == [
        "passed",
        "passed",
    ]
    assert [v["outcome"] for v in sandboxed(backend, "print(4)", tests)] == ["passed", "failed"]
    crashed = sandboxed(backend, "raise ValueError('nope')", tests[:1])[0]
    assert crashed["outcome"] == "runtime_error" and crashed["error"] == "ValueError: nope"
    asserts = [{"code": "assert f(1) == 2"}, {"code": "assert f(1) == 3"}]
    assert [v["outcome"] for v in sandboxed(backend, "def f(x):\n    return x + 1", asserts)] == [
        "passed",
        "failed",
    ]


def test_the_gateways_files_and_environment_are_out_of_reach(backend, tmp_path, monkeypatch):
    secret = tmp_path / "config.yaml"
    secret.write_text("engine_secret: s3cr3t\n")
    secret.chmod(0o644)
    monkeypatch.setenv("RMGATE_ENGINE_SECRET_TEST", "s3cr3t")
    read_file = f"print(open({str(secret)!r}).read().strip())"
    read_env = "import os; print(os.environ.get('RMGATE_ENGINE_SECRET_TEST', 'absent'))"
    read_proc = (
        "import os\nfound = []\nfor p in os.listdir('/proc'):\n"
        "    try:\n        found.append(open(f'/proc/{p}/environ', 'rb').read())\n"
        "    except Exception:\n        pass\nprint(any(b's3cr3t' in e for e in found))"
    )
    assert "s3cr3t" in unsandboxed(read_file).stdout  # without the sandbox: read
    assert "s3cr3t" in unsandboxed(read_env).stdout
    assert "True" in unsandboxed(read_proc).stdout
    assert "FileNotFoundError" in sandboxed(backend, read_file)[0]["error"]
    env_test = [{"input": "", "output": "absent"}]
    assert sandboxed(backend, read_env, env_test)[0]["outcome"] == "passed"
    assert (
        sandboxed(backend, read_proc, [{"input": "", "output": "False"}])[0]["outcome"] == "passed"
    )
    here = f"import os; print(os.path.exists({str(Path(__file__))!r}))"
    assert sandboxed(backend, here, [{"input": "", "output": "False"}])[0]["outcome"] == "passed"


def test_no_network_connection_leaves_the_sandbox(backend):
    """A server on the host's loopback (as the gateway's port and the engines' are):
    reachable from a plain process, refused from the sandbox."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bool] = []

    def accept() -> None:
        server.settimeout(30)
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(True)
                conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    connect = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "print('connected')"
    )
    assert unsandboxed(connect).stdout.strip() == "connected"
    verdict = sandboxed(backend, connect, [{"input": "", "output": "connected"}])[0]
    server.close()
    assert verdict["outcome"] == "runtime_error", verdict
    assert "Connection refused" in verdict["error"] or "unreachable" in verdict["error"]
    assert accepted == [True]  # the control's connection only


def test_bombs_loops_floods_and_hogs_end_at_their_limits(backend):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    loop = "while True:\n    pass"
    hog = "x = bytearray(10 * 1024 ** 3)\nprint('allocated')"
    flood = "import sys\nchunk = 'x' * 65536\nfor _ in range(1600):\n    sys.stdout.write(chunk)"
    started = time.monotonic()
    peak = [0]
    running = threading.Event()
    running.set()

    def count() -> None:  # the processes this test started, as the bomb runs
        while running.is_set():
            peak[0] = max(peak[0], len(_in_sandboxes()))
            time.sleep(0.02)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        verdicts = {"bomb": sandboxed(backend, bomb, processes=16)[0]}
    finally:
        running.clear()
        counter.join()
    verdicts |= {
        name: sandboxed(backend, code)[0]
        for name, code in (("loop", loop), ("hog", hog), ("flood", flood))
    }
    took = time.monotonic() - started
    # bwrap and its init outside the limit; the harness and the bomb's processes within 16
    assert 12 <= peak[0] <= 16 + 2, peak
    assert verdicts["bomb"]["outcome"] == "timeout"
    assert verdicts["loop"]["outcome"] == "timeout"
    assert verdicts["hog"]["outcome"] == "memory_limit"
    assert verdicts["flood"]["outcome"] == "output_limit"
    assert all(v["near_limit"] for v in (verdicts["bomb"], verdicts["loop"]))
    assert took < 60
    # the control: 100 MB of output and a 10 GB address space pass without the sandbox
    flooded = subprocess.run(
        [sys.executable, "-c", flood], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert len(flooded.stdout) == 1600 * 65536


def _in_sandboxes() -> list[int]:
    """The processes of the sandboxes this test process started: its bwrap children and
    everything under them."""
    bwraps = running(descendants([os.getpid()]), b"bwrap")
    return sorted(set(bwraps) | set(descendants(bwraps)))


def test_a_killed_parent_leaves_no_sandboxed_process(tmp_path):
    """The process that started a sandbox (the gateway's ingress) killed with SIGKILL
    mid-run: bwrap and everything it ran go with it (``--die-with-parent``)."""
    marker = tmp_path / "started"
    script = (
        "import asyncio\n"
        "from gateway.core.config.code_rules import LocalSandbox\n"
        "from gateway.sandbox.local import LocalBackend\n"
        f"limits = {LIMITS!r} | {{'cpu_s': 60, 'wall_s': 120}}\n"
        "sub = {'code': 'import os, time\\nos.fork()\\ntime.sleep(600)', "
        "'tests': [{'input': '', 'output': ''}], 'limits': limits, 'compare': 'lines', "
        "'stop_on_failure': False}\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "asyncio.run(LocalBackend(LocalSandbox()).run(sub, 300))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(descendants([parent.pid])) < 3:
            time.sleep(0.2)
        inside = descendants([parent.pid])
        assert len(inside) >= 3, inside  # bwrap, its init, the harness, the test...
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(inside):
        time.sleep(0.1)
    assert not alive(inside)


# ---- through the gateway's scoring ------------------------------------------------------
PROGRAMS = [
    {
        "name": "code",
        "on_failure": "mask",
        "components": [
            {
                "name": "tests",
                "rule": {
                    "type": "code_tests",
                    "limits": {"cpu_s": 1, "wall_s": 2},
                    "concurrency": 2,
                },
            }
        ],
    },
    {
        "name": "code_fresh",
        "components": [{"name": "tests", "rule": {"type": "code_tests", "deterministic": False}}],
    },
    {
        "name": "code_strict",
        "components": [
            {
                "name": "tests",
                "rule": {"type": "code_tests", "score": "all_or_nothing", "timeout_s": 1.5},
            }
        ],
    },
]
LABEL = {"inputs": ["2\n", "5\n", "7\n"], "outputs": ["4", "10", "14"]}


@pytest.fixture
async def gateway(tmp_path):
    cfg = AppConfig.model_validate(
        {
            **CONFIG,
            "programs": PROGRAMS,
            "gateway": {"default_reward_model": "rm", "ledger": {"state_dir": str(tmp_path)}},
        }
    )
    sandboxes = CodeSandboxes(code_rules(cfg))
    await sandboxes.probe()
    ledger = Ledger.open(cfg.gateway.ledger)
    app = create_app(RewardService(cfg, JudgeTransport(), ledger=ledger, code=sandboxes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        yield c, sandboxes
    await sandboxes.close()


def _item(code: str, label=LABEL) -> dict:
    return {"prompt": "double it", "response": fenced(code), "label": label}


async def test_a_program_scores_code_and_identical_submissions_run_once(gateway):
    client, sandboxes = gateway
    right, half = "print(int(input()) * 2)", "n = int(input())\nprint(4 if n == 2 else n)"
    items = [_item(right), _item(right), _item(half), _item(right)]
    r = await client.post("/v1/rewards", json={"model": "code", "items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rewards"] == [1.0, 1.0, 1 / 3, 1.0]
    details = [d["components"][0] for d in body["details"]]
    assert details[2]["tests"]["outcomes"] == ["passed", "failed", "failed"]
    caches = [d.get("cache") for d in details]
    assert caches.count("miss") == 2 and caches.count("shared") + caches.count("hit") == 2
    again = await client.post("/v1/rewards", json={"model": "code", "items": items[:1]})
    assert again.json()["details"][0]["components"][0]["cache"] == "hit"
    assert again.json()["rewards"] == [1.0]


async def test_no_code_bad_tests_and_timeouts_are_explicit(gateway):
    client, _ = gateway
    items = [
        {"prompt": "p", "response": "I refuse to write code.", "label": LABEL},
        _item("print(1)", label={"nonsense": True}),
        _item("while True:\n    pass"),
    ]
    r = await client.post("/v1/rewards", json={"model": "code", "items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rewards"][0] == 0.0
    assert body["details"][0]["components"][0]["code"] == "no_code"
    assert body["rewards"][1] is None and "code_tests" in body["details"][1]["mask_reason"]
    looped = body["details"][2]["components"][0]
    assert body["rewards"][2] == 0.0 and looped["tests"]["counts"] == {"timeout": 3}
    assert looped["timing_dependent"] is True and "receipt" not in looped  # not recorded
    # the whole run past the rule's timeout_s: a failure under on_failure: error (422)
    slow = _item("import time\ntime.sleep(1.0)\nprint(int(input()) * 2)")
    r = await client.post("/v1/rewards", json={"model": "code_strict", "items": [slow]})
    assert r.status_code == 422 and "did not finish within 1.5 s" in r.text, r.text


def test_a_sandbox_that_cannot_run_stops_the_gateway_from_starting(capsys):
    """No fallback to running code unsandboxed: ``rmgate serve`` exits 2 before Ray starts,
    naming the fix (here a ``bwrap`` that fails at once, as it does without user
    namespaces)."""
    import typer

    from gateway.cli.main import refuse_unsandboxed_code

    rule = {"type": "code_tests", "sandbox": {"type": "bwrap", "bwrap": "/bin/false"}}
    cfg = {
        "applications": [
            {"args": {"programs": [{"name": "code", "components": [{"name": "t", "rule": rule}]}]}}
        ]
    }
    with pytest.raises(typer.Exit) as exited:
        refuse_unsandboxed_code(Path("x.yaml"), cfg)
    assert exited.value.exit_code == 2
    said = capsys.readouterr().err
    assert "code/t" in said and "user namespaces" in said and "sandbox_fusion" in said
    rule["sandbox"]["bwrap"] = "/nonexistent/bwrap"
    with pytest.raises(typer.Exit):
        refuse_unsandboxed_code(Path("x.yaml"), cfg)
    del rule["sandbox"]  # the real one passes its probe
    refuse_unsandboxed_code(Path("x.yaml"), cfg)


# ---- the remote backend, against a real /run_code service --------------------------------
@pytest.fixture(scope="module")
def fusion_url():
    """``rmgate sandbox serve`` on a free loopback port (a real HTTP service)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "sandbox", "serve", "--port", str(port)],
        cwd=Path(__file__).parents[2],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/docs", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_run_code_answers_as_sandbox_fusion_does(fusion_url):
    ran = httpx.post(
        fusion_url + "/run_code",
        json={"code": "print(input()[::-1])", "language": "python", "stdin": "abc\n"},
        timeout=60,
    ).json()
    assert ran["status"] == "Success" and ran["run_result"]["status"] == "Finished"
    assert ran["run_result"]["stdout"] == "cba\n" and ran["run_result"]["return_code"] == 0
    slow = {"code": "while True:\n    pass", "language": "python", "run_timeout": 1}
    timed = httpx.post(fusion_url + "/run_code", json=slow, timeout=60).json()
    assert timed["status"] == "Failed"
    assert timed["run_result"]["status"] == "TimeLimitExceeded"
    bad = httpx.post(fusion_url + "/run_code", json={"code": "x", "language": "cobol"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["status"] == "SandboxError"


def test_the_remote_backend_gives_the_local_ones_verdicts(fusion_url):
    rules = {
        "local": CodeTestsRule(limits={"cpu_s": 1, "wall_s": 2}),
        "remote": CodeTestsRule(
            limits={"cpu_s": 1, "wall_s": 2},
            sandbox={"type": "sandbox_fusion", "url": fusion_url},
        ),
    }
    codes = [
        "print(int(input()) * 2)",
        "print(4)",
        "raise SystemExit(3)",
        "x = bytearray(10 * 1024 ** 3)",
        "def f(x):\n    return x + 1",
    ]
    tests = [{"input": "2\n", "output": "4"}, {"input": "3\n", "output": "6"}]
    asserts = [{"code": "assert f(1) == 2"}, {"code": "assert f(1) == 3"}]

    async def both() -> dict[str, list[list[str]]]:
        sandboxes = CodeSandboxes(rules)
        await sandboxes.probe()
        out: dict[str, list[list[str]]] = {}
        for rule, spec in rules.items():
            out[rule] = []
            for code in codes:
                sub = submission(spec, code, asserts if "def f" in code else tests)
                verdicts = await sandboxes.run(CodeCall(rule, sub, 60), 60)
                out[rule].append([v["outcome"] for v in verdicts])
        await sandboxes.close()
        assert sandboxes.identity("remote").startswith("sandbox_fusion:")
        return out

    got = asyncio.run(both())
    assert got["local"] == got["remote"], got
    assert got["local"] == [
        ["passed", "passed"],
        ["passed", "failed"],
        ["runtime_error", "runtime_error"],
        ["memory_limit", "memory_limit"],
        ["passed", "failed"],
    ]


async def test_a_non_deterministic_rule_runs_every_submission(gateway):
    client, _ = gateway
    runs = metrics.CODE_RUN_SECONDS.labels("code_fresh/tests")
    before = runs._sum.get(), sum(b.get() for b in runs._buckets)
    items = [_item("print(int(input()) * 2)")] * 3
    for _ in range(2):
        r = await client.post("/v1/rewards", json={"model": "code_fresh", "items": items})
        assert r.status_code == 200 and r.json()["rewards"] == [1.0] * 3, r.text
        assert all("cache" not in d["components"][0] for d in r.json()["details"])
    assert sum(b.get() for b in runs._buckets) - before[1] == 6  # 2 requests x 3 items
