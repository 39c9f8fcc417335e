"""The scalable layout: one Serve application per slot plus one ingress application.

Ray Serve versions every deployment of an application by a hash of the application's
``args`` (``deploy_utils.get_app_code_version``). With all slots in one application, any
change of ``replicas`` would change that hash and restart every engine. So ``rmgate serve``
expands the compact config (one application, ``gateway.serve.app:build_app``) into:

* ``rmgate``: the ingress (``gateway.serve.app:build_ingress``). Its ``args`` hold the models
  *without* their slot counts; the counts live in the ingress deployment's
  ``user_config``, which Serve applies in place (``reconfigure``), without a restart.
* ``<model>-<slot>``: one application per slot (``deployments.slot.replica:build_slot``) whose
  ``args`` are the model (again without ``replicas``) and the slot index. Adding slot 2
  adds an application; slots 0 and 1 keep their ``args``, hence their version and engine.

The rendered file is a plain Serve config: ``serve deploy`` accepts it, and ``rmgate
scale`` edits the same structure through Serve's REST API.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.core.config.settings import AppConfig

INGRESS_APP = "rmgate"
INGRESS_DEPLOYMENT = "gateway"
INGRESS_IMPORT = "gateway.serve.app:build_ingress"
SLOT_IMPORT = "deployments.slot.replica:build_slot"
SLOT_DEPLOYMENT = "SlotReplica"
#: What users write in compact configs: one application that ``render`` expands.
COMPACT_IMPORT = "gateway.serve.app:build_app"
#: Ingress ``args`` key naming its slot applications' prefix (several gateways in one config).
SLOT_PREFIX_ARG = "slot_app_prefix"


def missing_paths(serve_config: dict[str, Any]) -> list[str]:
    """The files the config's rmgate applications name that are not there (model folders,
    key files), resolved as ``render`` resolves them: relative to the current directory."""
    return [
        line
        for application in serve_config["applications"]
        if application.get("import_path") == COMPACT_IMPORT
        for line in AppConfig.model_validate(application.get("args") or {}).missing_paths()
    ]


def slot_app_name(model: str, slot: int, prefix: str = "") -> str:
    """``<model>-<slot>``; with several gateways in one config, ``<gateway>-<model>-<slot>``."""
    return f"{prefix}{model}-{slot}"


def _model_without_replicas(model: dict[str, Any]) -> dict[str, Any]:
    out = dict(model)
    out.pop("replicas", None)
    return out


def slot_app(model: dict[str, Any], slot: int, prefix: str = "") -> dict[str, Any]:
    """The Serve application of one slot (``model`` is a validated ``ModelSpec`` dump)."""
    return {
        "name": slot_app_name(model["name"], slot, prefix),
        "route_prefix": None,
        "import_path": SLOT_IMPORT,
        "args": {"spec": _model_without_replicas(model), "slot": slot},
    }


#: Set by rmgate in the ingress deployment: the slot counts (``replicas`` of each model,
#: changed by ``rmgate scale``) and the replica count (``gateway.ingress_replicas``).
RMGATE_OWNED_DEPLOYMENT_KEYS = ("user_config", "num_replicas", "autoscaling_config")


def ingress_overrides(application: dict[str, Any]) -> dict[str, Any]:
    """What a compact application's ``deployments`` entry says about the ingress (Serve's
    own per-deployment options, e.g. ``ray_actor_options`` to keep it on the head node),
    kept in the rendered config. Keys rmgate sets itself are refused with the setting
    to use instead, and so is any other deployment name (slots are applications)."""
    out: dict[str, Any] = {}
    for entry in application.get("deployments") or []:
        if entry.get("name") != INGRESS_DEPLOYMENT:
            raise ValueError(
                f"deployment {entry.get('name')!r}: only the ingress "
                f"({INGRESS_DEPLOYMENT!r}) takes deployment options here; a "
                "model's slots take theirs from the model's ray_actor_options"
            )
        owned = [k for k in RMGATE_OWNED_DEPLOYMENT_KEYS if k in entry]
        if owned:
            raise ValueError(
                f"deployment {INGRESS_DEPLOYMENT!r}: {', '.join(owned)} is set by "
                "rmgate (gateway.ingress_replicas, each model's replicas)"
            )
        out.update({k: v for k, v in entry.items() if k != "name"})
    return out


def ingress_app(
    config: AppConfig,
    route_prefix: str = "/",
    name: str = INGRESS_APP,
    slot_prefix: str = "",
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    dumped = config.model_dump(mode="json")
    args = {**dumped, "models": [_model_without_replicas(m) for m in dumped["models"]]}
    if slot_prefix:
        args[SLOT_PREFIX_ARG] = slot_prefix
    return {
        "name": name,
        "route_prefix": route_prefix,
        "import_path": INGRESS_IMPORT,
        "args": args,
        "deployments": [
            {
                "name": INGRESS_DEPLOYMENT,
                **(overrides or {}),
                "num_replicas": config.gateway.ingress_replicas,
                "user_config": {"slots": {m.name: m.replicas for m in config.models}},
            }
        ],
    }


def render(serve_config: dict[str, Any]) -> dict[str, Any]:
    """Expand a compact Serve config (its ``build_app`` application) into the scalable one.

    Model paths are resolved here, in the process that reads the file, because Ray's
    worker processes may run in another directory. Already-expanded configs pass through.
    Every model's ``engine_args`` names are checked against the installed vLLM here too
    (``check_engine_args``), so a typo fails now rather than as a dead engine later.
    """
    from deployments.engine.arg_names import check_engine_args

    out = copy.deepcopy({k: v for k, v in serve_config.items() if k != "applications"})
    apps: list[dict[str, Any]] = []
    compact = [a for a in serve_config["applications"] if a.get("import_path") == COMPACT_IMPORT]
    for application in serve_config["applications"]:
        if application.get("import_path") != COMPACT_IMPORT:
            apps.append(copy.deepcopy(application))
            continue
        cfg = AppConfig.model_validate(application.get("args") or {})
        for model in cfg.models:
            check_engine_args(model)
        # One gateway: the fixed names `rmgate` and `<model>-<slot>` (what `rmgate scale`
        # works on). Several (e.g. benchmarks/configs/hops.yaml): each keeps its own name
        # and prefixes its slots with it, so their applications cannot collide.
        name, prefix = (
            (INGRESS_APP, "")
            if len(compact) == 1
            else (application["name"], f"{application['name']}-")
        )
        apps.append(
            ingress_app(
                cfg,
                application.get("route_prefix", "/") or "/",
                name,
                prefix,
                ingress_overrides(application),
            )
        )
        for model in cfg.models:
            dumped = model.model_dump(mode="json")
            apps.extend(slot_app(dumped, i, prefix) for i in range(model.replicas))
    out["applications"] = apps
    return out


def with_engines_on_node_addresses(rendered: dict[str, Any]) -> dict[str, Any]:
    """``rendered`` for a multi-node cluster: every slot whose ingress reaches its engine
    over HTTP (``transport: direct``) gets ``engine_host: node``, since an engine on
    127.0.0.1 is out of reach of an ingress on another node. Those engines then take only
    requests with their generated secret. ``transport: handle`` gateways keep loopback
    engines (their requests go through the slot replica, on the engine's own node)."""
    out = copy.deepcopy(rendered)
    direct: dict[str, bool] = {}  # slot application prefix -> does its ingress go direct?
    for app in out["applications"]:
        if app.get("import_path") == INGRESS_IMPORT:
            args = app.get("args") or {}
            go_direct = (args.get("gateway") or {}).get("transport", "direct") == "direct"
            direct[str(args.get(SLOT_PREFIX_ARG, ""))] = go_direct
            if go_direct:
                for model in args.get("models", []):
                    model["engine_host"] = "node"
    for app in out["applications"]:
        if app.get("import_path") == SLOT_IMPORT:
            spec = app["args"]["spec"]
            prefix = app["name"][: -len(slot_app_name(spec["name"], app["args"]["slot"]))]
            if direct.get(prefix, True):
                spec["engine_host"] = "node"
    return out


def with_direct_port(rendered: dict[str, Any], port: int, host: str) -> dict[str, Any]:
    """``rendered`` with every ingress application also serving on ``host:port`` itself
    (``gateway.direct_port``; ``rmgate serve --direct-port``); one application only: two
    would share the port's connections between different apps."""
    out = copy.deepcopy(rendered)
    ingresses = [a for a in out["applications"] if a.get("import_path") == INGRESS_IMPORT]
    if len(ingresses) != 1:
        raise ValueError(
            f"--direct-port needs exactly one rmgate application, not {len(ingresses)}"
        )
    args = ingresses[0].setdefault("args", {})
    args.setdefault("gateway", {}).update({"direct_port": port, "direct_host": host})
    return out


def direct_port_of(rendered: dict[str, Any]) -> tuple[int | None, str]:
    """The ingress application's ``gateway.direct_port`` and ``direct_host`` (None when
    it serves on Serve's port only)."""
    gateway = (_ingress(rendered["applications"]).get("args") or {}).get("gateway") or {}
    return gateway.get("direct_port"), gateway.get("direct_host", "127.0.0.1")


def bind_direct_port(
    rendered: dict[str, Any], port: int | None, host: str, host_given: bool
) -> tuple[dict[str, Any], int | None, str]:
    """``rmgate serve``'s direct port: ``--direct-port`` binds ``port`` on ``host``; without
    it the config's ``gateway.direct_port`` stands, on the config's ``direct_host`` unless
    ``--host`` was given (a container's 0.0.0.0 then reaches both ports). Returns the
    rendered config, the port (None: none) and the address it binds."""
    configured, configured_host = direct_port_of(rendered)
    if port is None and configured is not None and host_given:
        port = configured
    if port is None:
        return rendered, configured, configured_host
    return with_direct_port(rendered, port, host), port, host


def slot_counts(apps: list[dict[str, Any]]) -> dict[str, int]:
    """The slot counts the ingress application routes with."""
    ingress = _ingress(apps)
    for deployment in ingress.get("deployments") or []:
        if deployment.get("name") == INGRESS_DEPLOYMENT:
            return dict((deployment.get("user_config") or {}).get("slots") or {})
    raise ValueError("the ingress application has no slot counts (user_config.slots)")


def _ingress(apps: list[dict[str, Any]]) -> dict[str, Any]:
    found = [a for a in apps if a.get("import_path") == INGRESS_IMPORT]
    if len(found) != 1:
        raise ValueError(
            f"expected one rmgate ingress application ({INGRESS_IMPORT}), "
            f"found {len(found)}; was this deployment started by `rmgate serve` "
            "or from `rmgate render`?"
        )
    return found[0]


def with_slot_count(apps: list[dict[str, Any]], model: str, n: int) -> list[dict[str, Any]]:
    """``apps`` with the ingress routing ``model`` over ``n`` slots (slot apps untouched)."""
    apps = copy.deepcopy(apps)
    ingress = _ingress(apps)
    for deployment in ingress.setdefault("deployments", []):
        if deployment.get("name") == INGRESS_DEPLOYMENT:
            deployment.setdefault("user_config", {}).setdefault("slots", {})[model] = n
    return apps


def with_slot_apps(apps: list[dict[str, Any]], model: str, n: int) -> list[dict[str, Any]]:
    """``apps`` with exactly the slot applications ``model-0 … model-(n-1)``.

    New slots copy an existing slot's ``args`` (homogeneous replicas by construction);
    existing ones are kept byte for byte, so Serve leaves their engines alone."""
    apps = copy.deepcopy(apps)
    mine = {
        a["args"]["slot"]: a
        for a in apps
        if a.get("import_path") == SLOT_IMPORT and a["args"]["spec"]["name"] == model
    }
    if not mine:
        raise ValueError(f"no slot application of model {model!r} is deployed")
    template = mine[min(mine)]
    keep = [
        a
        for a in apps
        if not (
            a.get("import_path") == SLOT_IMPORT
            and a["args"]["spec"]["name"] == model
            and a["args"]["slot"] >= n
        )
    ]
    added = [
        {
            **copy.deepcopy(template),
            "name": slot_app_name(model, i),
            "args": {"spec": copy.deepcopy(template["args"]["spec"]), "slot": i},
        }
        for i in range(n)
        if i not in mine
    ]
    return keep + added


def scale_steps(apps: list[dict[str, Any]], model: str, n: int) -> list[list[dict[str, Any]]]:
    """The configs to apply, in order, to move ``model`` to ``n`` slots without a gap.

    Up: start the new slots first, then let the ingress route to them. Down: stop routing
    to the removed slots first, then remove them. (A one-shot ``serve deploy`` of the end
    state also works: requests wait for a slot that is still starting, and requests caught
    on a removed slot are sent to their key's slot under the new count.)"""
    if n < 1:
        raise ValueError("a model needs at least one slot")
    counts = slot_counts(apps)
    if model not in counts:
        raise ValueError(f"model {model!r} is not served; served: {sorted(counts)}")
    current = counts[model]
    if n == current:
        return []
    if n > current:
        started = with_slot_apps(apps, model, n)
        return [started, with_slot_count(started, model, n)]
    routed = with_slot_count(apps, model, n)
    return [routed, with_slot_apps(routed, model, n)]
