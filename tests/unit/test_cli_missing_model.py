"""``rmgate serve`` of a config whose model folder is missing (a fresh clone before
``rmgate make-demo-models``) exits at once with one line naming the path and the fix,
before Ray starts, instead of an engine dying minutes later in a Ray traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timing  # asserts durations / CPU shares: run when the machine is quiet

REPO = Path(__file__).resolve().parents[2]


def _serve(config: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return out, time.monotonic() - start


def test_the_shipped_demo_config_without_its_models_is_refused_in_seconds(tmp_path):
    out, seconds = _serve(REPO / "configs" / "demo-cpu.yaml", tmp_path)  # no models/demo here
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(tmp_path / "models" / "demo" / "grm") in lines[0]
    assert "rmgate make-demo-models models/demo" in lines[0] and "rmgate demo" in lines[0]
    assert "Traceback" not in out.stderr and "ray" not in out.stdout.lower()
    assert seconds < 30, seconds


def test_a_folder_without_config_json_and_a_missing_key_file_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    cfg = {
        "applications": [
            {
                "name": "rmgate",
                "import_path": "gateway.serve.app:build_app",
                "args": {
                    "gateway": {"api_keys_file": str(tmp_path / "keys.txt")},
                    "models": [{"name": "rm", "kind": "discriminative", "model_path": "empty"}],
                },
            }
        ]
    }
    from gateway.serve.topology import missing_paths

    os.chdir(tmp_path)
    try:
        missing = missing_paths(cfg)
    finally:
        os.chdir(REPO)
    assert missing == [
        f"model 'rm': model_path {tmp_path / 'empty'} has no config.json",
        f"gateway.api_keys_file {tmp_path / 'keys.txt'} does not exist",
    ]
    # the control: with the model folder and key file there, nothing is missing
    (tmp_path / "empty" / "config.json").write_text("{}")
    (tmp_path / "keys.txt").write_text("k\n")
    os.chdir(tmp_path)
    try:
        assert missing_paths(cfg) == []
    finally:
        os.chdir(REPO)
