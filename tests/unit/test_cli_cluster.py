"""``rmgate serve --address``: a cluster that cannot be joined is a usage error with the
reason (no traceback, nothing left behind); the driver joins on loopback only when the
cluster itself is on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli.main import app

COMPACT = {
    "applications": [
        {
            "name": "rmgate",
            "route_prefix": "/",
            "import_path": "gateway.serve.app:build_app",
            "args": {
                "models": [
                    {
                        "name": "rm",
                        "kind": "discriminative",
                        "model_path": "/m/disrm",
                        "replicas": 1,
                    }
                ]
            },
        }
    ]
}


@pytest.mark.parametrize(
    "address,loopback", [("127.0.0.1:6379", True), ("10.1.2.3:6379", False), ("auto", False)]
)
def test_a_cluster_that_cannot_be_joined_is_a_usage_error(
    tmp_path: Path, monkeypatch, address: str, loopback: bool
):
    import ray

    seen = {}

    def refuse(**kwargs):
        seen.update(kwargs)
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr("deployments.engine.arg_names.check_engine_args", lambda spec: None)
    for name in (
        "RAY_SERVE_ENABLE_HA_PROXY",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    ):
        monkeypatch.setenv(name, "0")  # the CLI sets them; restored after the test
    (tmp_path / "disrm").mkdir()
    (tmp_path / "disrm" / "config.json").write_text("{}")
    compact = yaml.safe_load(yaml.safe_dump(COMPACT))
    compact["applications"][0]["args"]["models"][0]["model_path"] = str(tmp_path / "disrm")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(compact))
    result = CliRunner().invoke(app, ["serve", str(cfg), "--address", address, "--proxy", "serve"])
    assert result.exit_code == 2, result.output
    assert "--address" in result.output and "Failed to connect" in result.output
    assert seen["address"] == address
    assert ("_node_ip_address" in seen) is loopback
