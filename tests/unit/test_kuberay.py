"""docker/kuberay/rayservice-gpu.yaml, checked statically (no Kubernetes here): it parses as
a RayService, its serve config is the one ``rmgate render`` produces for configs/gpu.yaml,
and its images, ports, probes and Ray version agree with docker/ and pyproject."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from gateway.cli.config_file import load_serve_config, render
from gateway.serve import kuberay, topology

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docker" / "kuberay" / "rayservice-gpu.yaml"


def _manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _containers(manifest: dict) -> dict[str, dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    return {c["name"]: c for pod in pods for c in pod["spec"]["containers"]}


def test_the_manifest_is_what_render_makes_now():
    """A drift check: regenerate with `rmgate render configs/gpu.yaml --rayservice
    rmgate:gpu -o docker/kuberay/rayservice-gpu.yaml` when configs/gpu.yaml changes."""
    rendered = render(load_serve_config(ROOT / "configs" / "gpu.yaml"))
    assert MANIFEST.read_text() == kuberay.dump(kuberay.rayservice(rendered, image="rmgate:gpu"))


def test_its_serve_config_is_rmgate_renders_with_cluster_http_options():
    manifest = _manifest()
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    serve = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    rendered = render(load_serve_config(ROOT / "configs" / "gpu.yaml"))
    assert (
        serve["applications"] == topology.with_engines_on_node_addresses(rendered)["applications"]
    )
    slots = [a for a in serve["applications"] if a["import_path"] in {topology.SLOT_IMPORT}]
    assert slots and all(a["args"]["spec"]["engine_host"] == "node" for a in slots)
    assert serve["http_options"] == {"host": "0.0.0.0", "port": 8000}
    assert serve["proxy_location"] == "EveryNode"  # a trainer may point at any node


def test_images_ports_probes_and_versions_agree_with_docker_and_pyproject():
    dockerfile = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    exposed = int(re.search(r"^EXPOSE (\d+)", dockerfile, re.M).group(1))
    assert '"--port", "8000"' in dockerfile and exposed == kuberay.SERVE_PORT
    assert "-t rmgate:gpu" in (ROOT / "docker" / "README.md").read_text()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "server"
    ]
    assert f"ray[serve]=={kuberay.RAY_VERSION}" in pins
    assert f'"ray[serve]=={kuberay.RAY_VERSION}"' in dockerfile
    manifest = _manifest()
    assert manifest["spec"]["rayClusterConfig"]["rayVersion"] == kuberay.RAY_VERSION
    containers = _containers(manifest)
    assert set(containers) == {"ray-head", "ray-worker"}
    for c in containers.values():
        assert c["image"] == "rmgate:gpu"
        assert {"containerPort": exposed, "name": "serve"} in c["ports"]
        for probe in (c["readinessProbe"], c["livenessProbe"]):
            assert probe["httpGet"] == {"path": "/health", "port": exposed}
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert "resources" not in containers["ray-head"]  # the head runs no engine
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    assert head["num-gpus"] == "0"
    assert containers["ray-worker"]["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_render_cluster_is_the_serve_deploy_config_of_a_multi_node_cluster(tmp_path: Path):
    from typer.testing import CliRunner

    from gateway.cli.main import app

    out = tmp_path / "cluster.yaml"
    result = CliRunner().invoke(
        app, ["render", str(ROOT / "configs" / "gpu.yaml"), "--cluster", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    rendered = render(load_serve_config(ROOT / "configs" / "gpu.yaml"))
    assert yaml.safe_load(out.read_text()) == kuberay.cluster_serve_config(rendered)
    plain = tmp_path / "plain.yaml"
    CliRunner().invoke(app, ["render", str(ROOT / "configs" / "gpu.yaml"), "-o", str(plain)])
    assert yaml.safe_load(plain.read_text()) == rendered  # one machine: loopback engines
