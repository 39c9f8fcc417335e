"""A KubeRay ``RayService`` for a rendered rmgate config (``rmgate render --rayservice``).

KubeRay runs Ray itself (``ray start`` in every pod, overriding the image's entrypoint) and
deploys ``spec.serveConfigV2`` with Serve's REST API, exactly as ``serve deploy`` of
``rmgate render``'s output does: so the manifest embeds that very output, with the HTTP
options a cluster needs (listen on every interface, a proxy on every node, so a trainer can
point at any node's Service). The HAProxy environment ``rmgate serve`` sets before Ray
starts (``gateway.serve.proxy_mode``) is set on every container, because Ray reads it at
``ray start``. Health probes GET the ingress's ``/health`` on the Serve port.

``docker/kuberay/rayservice-gpu.yaml`` is this function's output for ``configs/gpu.yaml``;
``tests/unit/test_kuberay.py`` regenerates it and checks it against ``docker/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.serve.proxy_mode import proxy_env
from gateway.serve.topology import with_engines_on_node_addresses

#: The ports every pod exposes: Ray's GCS (head), dashboard (head), client, and Serve's HTTP.
SERVE_PORT = 8000
RAY_VERSION = "2.60.0"
HAPROXY_DIR = "/tmp/rmgate-haproxy"


def cluster_serve_config(rendered: dict[str, Any]) -> dict[str, Any]:
    """``rendered`` with the HTTP options a cluster serves with (every interface, the
    Serve port, a proxy on every node) and engines the ingress can reach from any node
    (``with_engines_on_node_addresses``)."""
    out = with_engines_on_node_addresses(rendered)
    out["http_options"] = {**out.get("http_options", {}), "host": "0.0.0.0", "port": SERVE_PORT}
    out["proxy_location"] = "EveryNode"
    return out


def _probe(initial_delay_s: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": SERVE_PORT},
        "initialDelaySeconds": initial_delay_s,
        "periodSeconds": 30,
        "timeoutSeconds": 10,
        "failureThreshold": 5,
    }


def _container(name: str, image: str, gpus: int) -> dict[str, Any]:
    env = {
        k: v for k, v in proxy_env("haproxy", Path(HAPROXY_DIR)).items() if not k.endswith("_PORT")
    }  # ports: Serve's defaults (one Ray node per pod)
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", VLLM_USE_FLASHINFER_SAMPLER="0")
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"containerPort": SERVE_PORT, "name": "serve"}],
        "volumeMounts": [
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        # vLLM starts in minutes (weights, CUDA graphs): probes wait for it
        "readinessProbe": _probe(60),
        "livenessProbe": _probe(900),
    }
    if name == "ray-head":
        container["ports"] = [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
            *container["ports"],
        ]
    if gpus:
        container["resources"] = {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"nvidia.com/gpu": gpus},
        }
    return container


def _pod(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [container],
            "volumes": [
                {
                    "name": "models",
                    "persistentVolumeClaim": {"claimName": "rmgate-models", "readOnly": True},
                },
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            ],
        }
    }


def rayservice(
    rendered: dict[str, Any],
    image: str = "rmgate:gpu",
    name: str = "rmgate",
    gpu_workers: int = 1,
    gpus_per_worker: int = 1,
) -> dict[str, Any]:
    """The RayService manifest: a CPU-only head (it runs the ingress and the controller, no
    engine: ``num-gpus: 0``) and a GPU worker group for the slots."""
    serve = yaml.safe_dump(cluster_serve_config(rendered), sort_keys=False)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": serve,
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                    "template": _pod(_container("ray-head", image, 0)),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": gpu_workers,
                        "minReplicas": gpu_workers,
                        "maxReplicas": gpu_workers,
                        "rayStartParams": {},
                        "template": _pod(_container("ray-worker", image, gpus_per_worker)),
                    }
                ],
            },
        },
    }


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks: ``serveConfigV2`` stays readable YAML."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str)


def dump(manifest: dict[str, Any]) -> str:
    """The manifest as YAML, ``serveConfigV2`` as a literal block."""
    return yaml.dump(manifest, Dumper=_LiteralDumper, sort_keys=False)
