"""The per-slot layout: scaling touches only the slots concerned (by Ray's own versioning)."""

from __future__ import annotations

import copy

import pytest
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from gateway.serve import topology

COMPACT = {
    "http_options": {"host": "127.0.0.1", "port": 8000},
    "applications": [
        {
            "name": "rmgate",
            "route_prefix": "/",
            "import_path": topology.COMPACT_IMPORT,
            "args": {
                "models": [
                    {"name": "judge", "kind": "generative", "model_path": "/m/grm", "replicas": 2},
                    {
                        "name": "rm",
                        "kind": "discriminative",
                        "model_path": "/m/disrm",
                        "replicas": 2,
                    },
                ]
            },
        }
    ],
}


def versions(apps: list[dict]) -> dict[str, str]:
    return {a["name"]: get_app_code_version(ServeApplicationSchema(**a)) for a in apps}


def test_render_makes_an_ingress_and_one_app_per_slot():
    rendered = topology.render(COMPACT)
    ServeDeploySchema.model_validate(rendered)  # a valid `serve deploy` config
    names = [a["name"] for a in rendered["applications"]]
    assert names == ["rmgate", "judge-0", "judge-1", "rm-0", "rm-1"]
    assert topology.slot_counts(rendered["applications"]) == {"judge": 2, "rm": 2}
    for app in rendered["applications"][1:]:
        assert app["route_prefix"] is None and "replicas" not in app["args"]["spec"]
    assert all("replicas" not in m for m in rendered["applications"][0]["args"]["models"])
    assert topology.render(rendered) == rendered  # already expanded: unchanged


@pytest.mark.parametrize("start,target", [(2, 3), (3, 2), (2, 5), (4, 1)])
def test_scaling_changes_no_remaining_apps_version(start, target):
    """Ray restarts a deployment when its app's code version changes: scaling must leave
    every surviving app's version (slots and ingress) as it was."""
    compact = copy.deepcopy(COMPACT)
    compact["applications"][0]["args"]["models"][1]["replicas"] = start
    apps = topology.render(compact)["applications"]
    before = versions(apps)
    steps = topology.scale_steps(apps, "rm", target)
    assert len(steps) == 2
    final = steps[-1]
    after = versions(final)
    assert {n: after[n] for n in before if n in after} == {
        n: before[n] for n in after if n in before
    }
    assert sorted(n for n in after if n.startswith("rm-")) == [f"rm-{i}" for i in range(target)]
    assert topology.slot_counts(final) == {"judge": 2, "rm": target}
    # the expanded config of the target count is what a plain `serve deploy` would apply
    compact["applications"][0]["args"]["models"][1]["replicas"] = target
    assert versions(topology.render(compact)["applications"]) == after
    # the order: up starts slots before routing to them; down stops routing first
    first = steps[0]
    if target > start:
        assert topology.slot_counts(first)["rm"] == start and len(first) == len(final)
    else:
        assert topology.slot_counts(first)["rm"] == target and len(first) == len(apps)


def test_scale_errors():
    apps = topology.render(COMPACT)["applications"]
    assert topology.scale_steps(apps, "rm", 2) == []
    with pytest.raises(ValueError, match="not served"):
        topology.scale_steps(apps, "nope", 3)
    with pytest.raises(ValueError, match="at least one"):
        topology.scale_steps(apps, "rm", 0)
    with pytest.raises(ValueError, match="ingress"):
        topology.scale_steps(apps[1:], "rm", 3)


def test_several_gateways_in_one_config_get_their_own_names_and_slot_prefixes():
    two = {
        "applications": [
            {
                "name": n,
                "route_prefix": p,
                "import_path": "gateway.serve.app:build_app",
                "args": {
                    "gateway": {"transport": t},
                    "models": [
                        {"name": "rm", "kind": "discriminative", "model_path": "/m", "replicas": 2}
                    ],
                },
            }
            for n, p, t in (("direct", "/", "direct"), ("handle", "/handle", "handle"))
        ]
    }
    names = [a["name"] for a in topology.render(two)["applications"]]
    assert names == ["direct", "direct-rm-0", "direct-rm-1", "handle", "handle-rm-0", "handle-rm-1"]
    ingress = topology.render(two)["applications"][3]
    assert ingress["args"][topology.SLOT_PREFIX_ARG] == "handle-"
    # one gateway keeps the fixed names `rmgate scale` works on, and no prefix argument
    one = topology.render({"applications": two["applications"][:1]})["applications"]
    assert [a["name"] for a in one] == ["rmgate", "rm-0", "rm-1"]
    assert topology.SLOT_PREFIX_ARG not in one[0]["args"]


def test_ingress_replicas_become_the_ingress_deployments_num_replicas():
    one = topology.render(COMPACT)["applications"][0]["deployments"][0]
    assert one["num_replicas"] == 1  # the default: one ingress process
    cfg = copy.deepcopy(COMPACT)
    cfg["applications"][0]["args"]["gateway"] = {"ingress_replicas": 3}
    rendered = topology.render(cfg)
    ServeDeploySchema.model_validate(rendered)
    ingress = rendered["applications"][0]
    assert ingress["deployments"][0]["num_replicas"] == 3
    scaled = topology.with_slot_count(rendered["applications"], "rm", 3)
    assert scaled[0]["deployments"][0]["num_replicas"] == 3  # scaling a model keeps it
    cfg["applications"][0]["args"]["gateway"] = {"ingress_replicas": 0}
    with pytest.raises(ValueError, match="ingress_replicas"):
        topology.render(cfg)


def test_the_ingress_keeps_serves_own_deployment_options_from_the_compact_config():
    cfg = copy.deepcopy(COMPACT)
    cfg["applications"][0]["deployments"] = [
        {"name": "gateway", "ray_actor_options": {"resources": {"head": 0.01}}}
    ]
    rendered = topology.render(cfg)
    ServeDeploySchema.model_validate(rendered)
    ingress = rendered["applications"][0]["deployments"][0]
    assert ingress["ray_actor_options"] == {"resources": {"head": 0.01}}
    assert ingress["user_config"] == {"slots": {"judge": 2, "rm": 2}}
    for bad, match in (
        ({"name": "gateway", "num_replicas": 2}, "ingress_replicas"),
        ({"name": "rm-0", "ray_actor_options": {}}, "only the ingress"),
    ):
        cfg["applications"][0]["deployments"] = [bad]
        with pytest.raises(ValueError, match=match):
            topology.render(cfg)


def test_on_a_cluster_direct_gateways_engines_listen_on_the_node_address():
    two = copy.deepcopy(COMPACT)
    handle = copy.deepcopy(two["applications"][0])
    handle.update(name="viahandle", route_prefix="/h")
    handle["args"]["gateway"] = {"transport": "handle"}
    two["applications"][0]["name"] = "direct"
    two["applications"].append(handle)
    rendered = topology.render(two)
    out = topology.with_engines_on_node_addresses(rendered)
    ServeDeploySchema.model_validate(out)
    hosts = {
        a["name"]: a["args"]["spec"]["engine_host"]
        for a in out["applications"]
        if a["import_path"] in {topology.SLOT_IMPORT}
    }
    assert hosts == {
        "direct-judge-0": "node",
        "direct-judge-1": "node",
        "direct-rm-0": "node",
        "direct-rm-1": "node",
        "viahandle-judge-0": "loopback",
        "viahandle-judge-1": "loopback",
        "viahandle-rm-0": "loopback",
        "viahandle-rm-1": "loopback",
    }
    assert rendered == topology.render(two)  # the input is left as it was


def test_direct_port_goes_to_the_one_ingress_and_is_a_valid_setting():
    from gateway.core.config.settings import AppConfig

    rendered = topology.render(COMPACT)
    out = topology.with_direct_port(rendered, 8001, "0.0.0.0")
    ingress = [a for a in out["applications"] if a["import_path"] in {topology.INGRESS_IMPORT}]
    assert ingress[0]["args"]["gateway"]["direct_port"] == 8001
    assert (rendered["applications"][0]["args"].get("gateway") or {}).get("direct_port") is None
    args = {k: v for k, v in ingress[0]["args"].items() if k != topology.SLOT_PREFIX_ARG}
    assert AppConfig.model_validate(args).gateway.direct_host == "0.0.0.0"
    two = {"applications": rendered["applications"] + [copy.deepcopy(ingress[0])]}
    with pytest.raises(ValueError, match="exactly one"):
        topology.with_direct_port(two, 8001, "127.0.0.1")


def test_render_with_a_direct_port_renders_what_serve_with_it_deploys(tmp_path):
    """`rmgate render --direct-port` must match `rmgate serve --direct-port`: a re-applied
    config whose ingress args differ would redeploy the ingress."""
    import yaml
    from typer.testing import CliRunner

    from gateway.cli.main import app

    out = tmp_path / "r.yaml"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(COMPACT))
    result = CliRunner().invoke(app, ["render", str(cfg), "--direct-port", "8123", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rendered = yaml.safe_load(out.read_text())
    expected = topology.with_direct_port(topology.render(COMPACT), 8123, "127.0.0.1")
    assert rendered["applications"] == expected["applications"]


def test_serve_binds_the_configs_direct_port_on_host_only_when_host_is_given():
    """`rmgate serve CONFIG --host 0.0.0.0` (a container) reaches both ports; without --host
    the config's direct_host stands; --direct-port wins over the config's port."""
    configured = copy.deepcopy(COMPACT)
    configured["applications"][0]["args"]["gateway"] = {"direct_port": 8001}
    rendered = topology.render(configured)
    assert topology.bind_direct_port(rendered, None, "0.0.0.0", False)[1:] == (8001, "127.0.0.1")
    out, port, host = topology.bind_direct_port(rendered, None, "0.0.0.0", True)
    assert (port, host) == (8001, "0.0.0.0")
    assert topology.direct_port_of(out) == (8001, "0.0.0.0")
    assert topology.bind_direct_port(rendered, 9001, "10.0.0.1", True)[1:] == (9001, "10.0.0.1")
    plain = topology.render(COMPACT)
    assert topology.bind_direct_port(plain, None, "0.0.0.0", True) == (plain, None, "127.0.0.1")
