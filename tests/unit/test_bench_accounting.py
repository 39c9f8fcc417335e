"""What the slow-slot benchmark reads to say what limited a run: host busy cores, CPU by
engine process group, and the baseline proxy's niceness (a proxy left at nice 0 outweighs
rmgate's nice-15 Ray workers ~28x on a saturated host)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.harness import cpu_accounting
from gateway.harness.least_loaded import start_proxy
from gateway.harness.processes import stop_process_group


@pytest.mark.timing  # a CPU share: measured when no gateway is booting beside it
def test_host_cores_busy_sees_a_busy_child():
    before = cpu_accounting.host_jiffies()
    spin = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.0: pass"]
    )
    spin.wait(timeout=30)
    busy = cpu_accounting.host_cores_busy(before, cpu_accounting.host_jiffies())
    assert 0.5 <= busy <= (os.cpu_count() or 1) + 0.01


def test_host_cores_busy_counts_only_the_window():
    assert cpu_accounting.host_cores_busy((100, 1000), (100, 1400)) == 0.0
    assert cpu_accounting.host_cores_busy((100, 1000), (500, 1400)) == (os.cpu_count() or 1)


@pytest.mark.timing  # a CPU share: measured when no gateway is booting beside it
def test_group_cpu_is_charged_to_the_group_that_spent_it():
    spin = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"],
        start_new_session=True,
    )
    try:
        time.sleep(0.5)
        got = cpu_accounting.group_cpu_s({"spinner": spin.pid, "nobody": 2**22 + 7})
    finally:
        spin.wait(timeout=30)
    assert got["spinner"] >= 0.2 and got["nobody"] == 0.0


def test_the_baseline_proxy_runs_at_the_niceness_it_is_given(tmp_path: Path):
    proc, _ = start_proxy(["http://127.0.0.1:9"], tmp_path, niceness=7)
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[16]) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)  # 19 caps it
    finally:
        stop_process_group(proc, grace_s=10)


def test_an_engines_processes_are_told_apart():
    assert cpu_accounting.process_kind("VLLM::Worker", "VLLM::Worker") == "worker"
    assert cpu_accounting.process_kind("VLLM::EngineCor", "VLLM::EngineCore") == "engine_core"
    assert (
        cpu_accounting.process_kind(
            "python", "python -m vllm.entrypoints.openai.api_server --model m"
        )
        == "api_server"
    )
    assert (
        cpu_accounting.process_kind("python", "python -m deployments.engine.vllm_server --model m")
        == "api_server"
    )
    assert (
        cpu_accounting.process_kind("python", "python -m deployments.engine.launcher --port 1")
        == "launcher"
    )
