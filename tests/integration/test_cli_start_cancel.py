"""Ctrl-C while ``rmgate serve`` waits for its engines to start: it stops at once, exits 0
and leaves no process behind (before, the wait ignored the signal until its timeout, and a
test harness had to SIGKILL it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from deployments.engine.ports import fixed_port
from gateway.harness.processes import stop_process_group, wait_until_gone
from gateway.harness.running import serve_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_ctrl_c_while_the_engines_start_stops_cleanly(demo_models, tmp_path):
    port = fixed_port("127.0.0.1")
    rm = {
        "name": "rm",
        "kind": "discriminative",
        "model_path": str(demo_models / "disrm"),
        "engine_args": {"dtype": "float32", "max_model_len": 512},
        "cpu_cores_per_slot": 1,
    }
    config = serve_config(
        {"models": [rm], "gateway": {"cache": "off", "ledger": {"backend": "off"}}}
    )
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    marker = str(tmp_path / "engines")
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(path), "--port", str(port)],
            cwd=REPO,
            env={**os.environ, "RMGATE_LOG_DIR": marker, "PYTHONPATH": str(REPO)},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not list(Path(marker).glob("rm-0-*.log")):  # its engine is starting
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
        assert "rmgate is serving" not in log.read_text(errors="replace")
        t0 = time.monotonic()
    finally:
        stop_process_group(proc, grace_s=90)  # SIGINT to the group, as a terminal's Ctrl-C
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "stopped while starting" in text, text[-3000:]
    assert time.monotonic() - t0 < 90
    left = wait_until_gone(marker)
    assert not left, f"processes left after Ctrl-C: {left}"
