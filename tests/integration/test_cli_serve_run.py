"""Ray Serve's own ``serve run CONFIG`` starts the same application as ``rmgate serve``.

Runs before the session's gateway starts (file order), so ``serve run`` starts its own
local Ray; it is stopped with Ctrl-C (SIGINT) like a user would, and must leave nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.conftest import (REPO, free_port, processes_with_env, stop_process_group,
                                        wait_until_serving)

pytestmark = pytest.mark.integration


def test_serve_run_config_serves_and_shuts_down(demo_models, tmp_path):
    port = free_port()
    config = {
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "rmgate", "route_prefix": "/", "import_path": "gateway.app:build_app",
            "args": {"models": [{"name": "rm", "kind": "discriminative",
                                 "model_path": str(demo_models / "disrm"), "replicas": 1,
                                 "engine_args": {"dtype": "float32", "max_model_len": 512,
                                                 "enforce_eager": True}}]}}],
    }
    cfg_path = tmp_path / "serve-run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    log = tmp_path / "serve-run.log"
    marker = str(tmp_path / "engines")
    env = {**os.environ, "RMGATE_LOG_DIR": marker, "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    serve_bin = Path(sys.executable).parent / "serve"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(serve_bin), "run", str(cfg_path)], cwd=REPO, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc, log, 600)
        r = httpx.post(url + "/classify", json={"input": ["2+3=5", "2+3=6"]}, timeout=60)
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == 2 and r.headers["x-rmgate-slot"] == "0,0"
    finally:
        stop_process_group(proc)
    time.sleep(2)
    assert not processes_with_env(marker), "serve run left processes behind"
