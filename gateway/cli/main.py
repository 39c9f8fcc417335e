"""``rmgate``: serve a config, run the demo, build the demo models."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from gateway.cli import elastic, top
from gateway.cli.config_file import load_serve_config, render
from gateway.cli.ledger import ledger_app
from gateway.cli.sandbox import sandbox_app
from gateway.core.config.scoring import GROUP_SCORER_TYPES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="rmgate: a deterministic reward-model gateway on Ray Serve.",
)

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout, when run from one
DEMO_CONFIG = REPO_ROOT / "configs" / "demo-cpu.yaml"
#: The demo config's model paths (``models/demo/grm``, ...) are relative to a root folder:
#: ``demo_root()``; the models are built into ``<root>/models/demo``.
DEMO_MODELS_SUBDIR = Path("models") / "demo"
DEMO_MODELS_DIR = REPO_ROOT / DEMO_MODELS_SUBDIR
#: The installed package's copy of configs/demo-cpu.yaml (package data: in the source tree
#: gateway/serve/data/demo-cpu.yaml is a symlink to it, and the wheel build copies the content).
DEMO_CONFIG_RESOURCE = ("gateway.serve", "data/demo-cpu.yaml")


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

PROXY_OPTION = typer.Option(
    None,
    help="How HTTP reaches the ingress: 'haproxy' (Serve's HAProxy + direct ingress; "
    "default where the binary is installed, a quarter of the CPU per request) or 'serve' "
    "(Serve's Python proxy).",
)


def _startup_timeout(rendered: dict[str, Any]) -> float:
    """Long enough for the slowest slot to start (its ``startup_timeout_s``) plus Serve."""
    limits = [
        float((a.get("args") or {}).get("spec", {}).get("startup_timeout_s", 600))
        for a in rendered["applications"]
    ]
    return max(limits, default=600.0) + 120.0


def _sample_requests(url: str, cfg: dict[str, Any]) -> str:
    lines = [f"rmgate is serving on {url}  (OpenAPI: {url}/docs, models: {url}/v1/models)"]
    for application in cfg["applications"]:
        for model in (application.get("args") or {}).get("models", []):
            if model.get("kind") == "generative":
                body = (
                    '{"model": "%s", "messages": [{"role": "user", "content": '
                    '"Is 2+3=5 right?"}], "max_tokens": 8}' % model["name"]
                )
                lines.append(
                    f"curl -s {url}/v1/chat/completions -H 'Content-Type: "
                    f"application/json' -d '{body}'"
                )
            else:
                body = '{"model": "%s", "input": ["2+3=5", "2+3=6"]}' % model["name"]
                lines.append(
                    f"curl -s {url}/classify -H 'Content-Type: application/json' -d '{body}'"
                )
    default = ((cfg["applications"][0].get("args") or {}).get("gateway") or {}).get(
        "default_reward_model"
    )
    if default:
        body = (
            '{"items": [{"prompt": "3+4=", "response": "7"}, {"prompt": "3+4=", "response": "9"}]}'
        )
        lines.append(f"curl -s {url}/v1/rewards -H 'Content-Type: application/json' -d '{body}'")
    for program in (cfg["applications"][0].get("args") or {}).get("programs") or []:
        if any(
            (c.get("scorer") or {}).get("type") in GROUP_SCORER_TYPES
            for c in program.get("components") or []
        ):
            items = ", ".join(
                '{"prompt": "3+4=", "response": "%s", "group": "q1"}' % r
                for r in ("7", "9", "seven")
            )
            body = '{"model": "%s", "items": [%s]}' % (program["name"], items)
            note = "a group's answers compared (details: the comparisons)"
        elif any(
            (c.get("rule") or {}).get("type") == "code_tests"
            for c in program.get("components") or []
        ):
            body = (
                '{"model": "%s", "items": [{"prompt": "Print twice the number read.", '
                '"response": "```python\\nprint(int(input()) * 2)\\n```", '
                '"label": {"inputs": ["2", "5"], "outputs": ["4", "10"]}}]}' % program["name"]
            )
            note = "the code run against the label's tests in a sandbox"
        else:
            body = (
                '{"model": "%s", "items": [{"prompt": "3+4=", "response": "7", "label": "7"}]}'
                % program["name"]
            )
            note = "per-component details"
        lines.append(
            f"curl -s {url}/v1/rewards -H 'Content-Type: application/json' -d '{body}'"
            f"   # reward program {program['name']}: {note}"
        )
    first = next(
        (m["name"] for a in cfg["applications"] for m in (a.get("args") or {}).get("models", [])),
        None,
    )
    if first:
        lines.append(
            f"curl -s -X POST '{url}/sleep?level=1&model={first}'   # free its engines' memory"
            " (a trainer's phase); the next request wakes it"
        )
        lines.append(f"curl -s -X POST '{url}/wake_up?model={first}'   # numerics re-proved")
    audit = ((cfg["applications"][0].get("args") or {}).get("gateway") or {}).get("audit") or {}
    if audit.get("sample"):
        lines.append(
            f"curl -s {url}/v1/audit    # the continuous audit: recorded rewards re-answered "
            "on a class mate, bits compared"
        )
    lines.append(
        f"rmgate status {url}    # each model awake or asleep, its slots, autoscaling, audit"
    )
    lines.append(f"rmgate check {url}    # replay, compare bitwise, print a verdict")
    return "\n".join(lines)


def loopback_node(on_loopback: bool) -> dict[str, Any]:
    """``ray.init``'s node address on a loopback-only host (else Ray's own choice)."""
    return {"_node_ip_address": "127.0.0.1"} if on_loopback else {}


def refuse_missing_paths(config: Path, cfg: dict[str, Any]) -> None:
    """Exit 2 with one line when a model folder (or key file) the config names is missing,
    before Ray starts: otherwise the engine dies minutes later in a Ray traceback."""
    from gateway.core.config.settings import MISSING_MODEL_HINT
    from gateway.serve.topology import missing_paths

    try:
        missing = missing_paths(cfg)
    except ValueError:
        return  # an invalid config: render() names what is wrong next
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        typer.echo(f"rmgate: {config}: {missing[0]}{more}: {MISSING_MODEL_HINT}", err=True)
        raise typer.Exit(2)


def refuse_unsandboxed_code(config: Path, cfg: dict[str, Any]) -> None:
    """Exit 2 with the fix when a ``code_tests`` rule's sandbox cannot run here (a real
    probe run in each), before Ray starts: code is never run unsandboxed."""
    from pydantic import ValidationError

    from gateway.sandbox.errors import SandboxUnavailable
    from gateway.serve.sandboxes import probe_serve_config

    try:
        probe_serve_config(cfg)
    except ValidationError:
        return  # an invalid config: render() names what is wrong next
    except SandboxUnavailable as exc:
        typer.echo(f"rmgate: {config}: {exc}", err=True)
        raise typer.Exit(2) from None


def run_serve_config(
    config: Path,
    host: str | None,
    port: int | None,
    ready: threading.Event | None = None,
    dashboard: bool = True,
    proxy: str | None = None,
    address: str | None = None,
    proxy_location: str = "EveryNode",
    direct_port: int | None = None,
) -> None:
    """Start Ray (local, or join the cluster at ``address``), Serve and every application
    of ``config``; block until a signal. On a cluster, a signal deletes the applications
    this command deployed and leaves the cluster (and Serve) running."""
    import shutil
    import tempfile

    from gateway.serve.proxy_mode import default_proxy, proxy_env

    proxy = proxy or default_proxy()
    proxy_dir = Path(tempfile.gettempdir()) / f"rmgate-proxy-{os.getpid()}"
    try:
        os.environ.update(proxy_env(proxy, proxy_dir))  # before Ray starts Serve's processes
    except (ValueError, RuntimeError) as exc:
        raise typer.BadParameter(f"--{exc}") from None  # "--proxy must be one of ..."

    cfg = load_serve_config(config)
    refuse_missing_paths(config, cfg)
    refuse_unsandboxed_code(config, cfg)
    http = dict(cfg.get("http_options") or {})
    host_given = host is not None
    host = host or http.get("host", "127.0.0.1")
    port = port or int(http.get("port", 8000))
    if host in LOOPBACK_HOSTS:
        # A loopback gateway's Ray node lives on loopback too. Left to itself Ray 2.60 turns
        # 127.0.0.1 into the machine's interface address (``resolve_ip_for_localhost``) and
        # binds its agents there; this switch (read when Ray is imported, inherited by its
        # processes) makes it keep loopback, as it does on a laptop.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

    import ray
    from ray import serve

    from gateway.serve import topology
    from gateway.serve.admin import StartCancelled, deploy_local

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Checked and expanded before Ray starts: a bad config (an unknown engine argument,
    # a slot count of 0) fails here, in seconds, not as a dead engine minutes later.
    try:
        rendered = render(cfg)
        if address is not None:  # slots may run on other nodes than the ingress
            rendered = topology.with_engines_on_node_addresses(rendered)
        rendered, direct_port, direct_host = topology.bind_direct_port(
            rendered, direct_port, host, host_given
        )
    except ValueError as exc:
        shutil.rmtree(proxy_dir, ignore_errors=True)
        raise typer.BadParameter(f"{config}: {exc}") from None
    if address is None:
        context = ray.init(
            address="local",
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            log_to_driver=False,
            **loopback_node(host in LOOPBACK_HOSTS),
        )
    else:
        # An existing cluster: Ray's own resources place the slots; its nodes were started
        # with (or without) the HTTP-path environment, which is read at `ray start`. This
        # driver joins its own node as Ray finds it, on loopback only when the cluster
        # itself is (several raylets on one machine).
        loopback = address.rsplit(":", 1)[0] in LOOPBACK_HOSTS
        try:
            context = ray.init(
                address=address,
                log_to_driver=False,
                **loopback_node(loopback),
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            shutil.rmtree(proxy_dir, ignore_errors=True)
            raise typer.BadParameter(f"--address {address}: {exc}") from None
    try:
        serve.start(
            http_options={"host": host, "port": port},
            **(dict[str, Any](proxy_location=proxy_location) if address is not None else {}),
        )
        rendered["http_options"] = {"host": host, "port": port}
        try:
            deploy_local(
                rendered,
                timeout_s=_startup_timeout(rendered),
                keep_others=address is not None,
                stop=stop,
            )
        except StartCancelled:  # Ctrl-C while the engines start: stop as after serving
            typer.echo("rmgate: stopped while starting; shutting down")
            return
        typer.echo(
            f"HTTP path: {proxy} -> ingress replica -> engines "
            f"(--proxy {'serve' if proxy == 'haproxy' else 'haproxy'} for the other)"
        )
        if direct_port is not None:
            typer.echo(
                f"direct port: http://{direct_host}:{direct_port} (the ingress "
                "replicas themselves, Serve's proxy left out)"
            )
        typer.echo(_sample_requests(f"http://{host}:{port}", cfg), err=False)
        if dashboard and getattr(context, "dashboard_url", None):
            # Ray 2.60 turns token auth on for the cluster; its CLI reads the token
            # (~/.ray/auth_token) only in token mode.
            typer.echo(
                f"Serve's own tools: RAY_AUTH_MODE=token serve status --address "
                f"http://{context.dashboard_url}  (also serve deploy CONFIG --address ...)"
            )
        sys.stdout.flush()
        if ready is not None:
            ready.set()
        while not stop.wait(0.5):
            pass
        typer.echo("rmgate: shutting down")
    finally:
        try:
            if address is None:
                serve.shutdown()
            else:  # the cluster is not ours: remove only what this command deployed
                for application in rendered["applications"]:
                    try:  # one that cannot be removed must not keep the others
                        serve.delete(application["name"])
                    except Exception as exc:  # noqa: BLE001 (reported, then the next)
                        typer.echo(
                            f"rmgate: could not delete {application['name']}: {exc}", err=True
                        )
        finally:
            ray.shutdown()
            shutil.rmtree(proxy_dir, ignore_errors=True)


class ProxyLocation(str, Enum):
    """Serve's ``proxy_location`` values that take HTTP traffic."""

    every_node = "EveryNode"
    head_only = "HeadOnly"


@app.command()
def serve(
    config: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="A Ray Serve config file (applications + args)."
    ),
    host: str | None = typer.Option(
        None, help="Bind address (default: the config's, else 127.0.0.1)."
    ),
    port: int | None = typer.Option(None, help="Port (default: the config's, else 8000)."),
    dashboard: bool = typer.Option(
        True,
        help="Start Ray's dashboard on 127.0.0.1 (needed by `serve status` and `serve deploy`).",
    ),
    proxy: str | None = PROXY_OPTION,
    address: str | None = typer.Option(
        None,
        help="Join an existing Ray cluster (`auto` or HOST:PORT) instead of "
        "starting a local one; Ctrl-C then removes only rmgate's applications.",
    ),
    proxy_location: ProxyLocation = typer.Option(
        ProxyLocation.every_node,
        help="On a cluster: where Serve runs an HTTP proxy "
        "(every node, so a trainer can point at any; HeadOnly where nodes share one "
        "address, e.g. several nodes on one machine).",
    ),
    direct_port: int | None = typer.Option(
        None,
        help="Also serve the API on this port from every ingress replica itself "
        "(gateway.direct_port, bound to --host): Serve's proxy left out of the path, "
        "less CPU per request.",
    ),
) -> None:
    """Start the application(s) of a Ray Serve config file and block until Ctrl-C."""
    run_serve_config(
        config,
        host,
        port,
        dashboard=dashboard,
        proxy=proxy,
        address=address,
        proxy_location=proxy_location.value,
        direct_port=direct_port,
    )


@app.command("render")
def render_command(
    config: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="A compact rmgate Serve config."
    ),
    port: int | None = typer.Option(None, help="Override http_options.port."),
    output: Path | None = typer.Option(None, "-o", "--output"),
    rayservice: str | None = typer.Option(
        None, help="Print a KubeRay RayService for this image instead (docker/kuberay/)."
    ),
    cluster: bool = typer.Option(
        False,
        help="For `serve deploy` to a multi-node cluster: engines of "
        "direct gateways on the node address, with their secret (what "
        "`rmgate serve --address` and --rayservice do).",
    ),
    direct_port: int | None = typer.Option(
        None,
        help="As `rmgate serve --direct-port`: the ingress replicas' own "
        "port (re-render with the same one, or a redeploy restarts the "
        "ingress).",
    ),
    direct_host: str = typer.Option("127.0.0.1", help="The address --direct-port binds."),
) -> None:
    """Print the per-slot Serve config that `rmgate serve` deploys (for `serve deploy`).

    Edit `replicas` in CONFIG, render again and `serve deploy` the result: only the added
    or removed slots start or stop; the ingress picks up the new counts in place."""
    import yaml

    from gateway.serve import topology

    try:
        rendered = render(load_serve_config(config))
    except ValueError as exc:
        raise typer.BadParameter(f"{config}: {exc}") from None
    if cluster:  # as the KubeRay manifest's: every interface, a proxy per node
        from gateway.serve import kuberay

        rendered = kuberay.cluster_serve_config(rendered)
    if port is not None:
        rendered.setdefault("http_options", {})["port"] = port
    if direct_port is not None:
        rendered = topology.with_direct_port(rendered, direct_port, direct_host)
    if rayservice is not None:
        from gateway.serve import kuberay

        text = kuberay.dump(kuberay.rayservice(rendered, image=rayservice))
    else:
        text = yaml.safe_dump(rendered, sort_keys=False)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


@app.command()
def scale(
    model: str = typer.Argument(..., help="The served model to rescale."),
    replicas: int = typer.Argument(..., min=1, help="Its new number of slots."),
    address: str = typer.Option(
        None, envvar="RAY_DASHBOARD_ADDRESS", help="Ray dashboard (default http://127.0.0.1:8265)."
    ),
    timeout: float = typer.Option(900.0, help="Seconds to wait for each step."),
) -> None:
    """Change a model's slot count on a running gateway without restarting other slots.

    Up: starts the new slot applications, then lets the ingress route to them. Down: stops
    routing to the removed slots, then removes them. Requests keep flowing throughout."""
    from gateway.serve.admin import DEFAULT_ADDRESS, ServeAdmin

    admin = ServeAdmin(address or DEFAULT_ADDRESS)
    try:
        previous = admin.scale(model, replicas, timeout, log=typer.echo)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        typer.echo(f"rmgate scale: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{model}: {previous} -> {replicas} slots")


@app.command("make-demo-models")
def make_demo_models(
    out_dir: Path = typer.Argument(..., help="Folder to write the models to."),
) -> None:
    """Build the demo GRM and DisRMs from a fixed seed (byte-identical on every run)."""
    from deployments.demo.models import build_demo_models

    for name, digest in build_demo_models(out_dir).items():
        typer.echo(f"{digest}  {out_dir / name}")


@app.command()
def check(
    url: str = typer.Argument(..., help="The gateway, e.g. http://127.0.0.1:8000"),
    requests: Path | None = typer.Option(
        None,
        "--requests",
        exists=True,
        dir_okay=False,
        help="JSON lines of {path, body}; default: a generated set for each served model",
    ),
    per_model: int = typer.Option(100, help="Generated requests per served model."),
    concurrency: list[int] = typer.Option(
        [1, 32], "--concurrency", "-c", help="Concurrency levels (repeatable)."
    ),
    repeats: int = typer.Option(1, help="Shuffled runs per concurrency level."),
    against: str | None = typer.Option(
        None, help="A second gateway to compare with (e.g. after an upgrade)."
    ),
    api_key: str | None = typer.Option(None, envvar="RMGATE_API_KEY"),
) -> None:
    """Replay requests in shuffled orders at several concurrencies; compare bitwise.

    Exit code 0 only when every response matched the first run exactly."""
    import asyncio

    from gateway.client import check as verify

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    url = url.rstrip("/")
    if requests is not None:
        calls = verify.load_calls(requests)
    else:
        calls = verify.generated_calls(asyncio.run(verify.served_models(url, headers)), per_model)
    if not calls:
        typer.echo("nothing to replay: no requests and no served model", err=True)
        raise typer.Exit(2)
    verdicts = asyncio.run(
        verify.check(
            url, calls, concurrency, repeats, against.rstrip("/") if against else None, headers
        )
    )
    typer.echo(verify.format_table(verdicts))
    raise typer.Exit(0 if all(v.ok for v in verdicts) else 1)


app.add_typer(ledger_app, name="ledger")
app.add_typer(sandbox_app, name="sandbox")
app.command("sleep")(elastic.sleep)
app.command("wake")(elastic.wake)
app.command("status")(elastic.status)
app.command("top")(top.top)


def in_checkout() -> bool:
    """True when this module runs from a source checkout (editable install or the tree)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and DEMO_CONFIG.is_file()


def demo_root() -> Path:
    """The folder that holds ``models/demo`` and that the demo config's relative model paths
    resolve against: ``$RMGATE_HOME`` if set; else the checkout this module runs from;
    else the user's cache, ``$XDG_CACHE_HOME/rmgate`` (default ``~/.cache/rmgate``): the
    models are rebuilt byte-identically whenever they are missing."""
    explicit = os.environ.get("RMGATE_HOME")
    if explicit:
        return Path(explicit).expanduser().resolve()
    if in_checkout():
        return REPO_ROOT
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"  # XDG: absolute only
    return (base / "rmgate").resolve()


@contextmanager
def demo_config() -> Iterator[Path]:
    """configs/demo-cpu.yaml: the checkout's, else the installed package's copy."""
    if in_checkout():
        yield DEMO_CONFIG
        return
    from importlib.resources import as_file, files

    package, name = DEMO_CONFIG_RESOURCE
    resource = files(package).joinpath(name)
    if not resource.is_file():  # built from a tree without configs/ (the symlink dangled)
        typer.echo(
            f"rmgate demo: this install has no demo config ({package}/{name}); it was "
            "built without configs/demo-cpu.yaml. Use `rmgate serve CONFIG`.",
            err=True,
        )
        raise typer.Exit(2)
    with as_file(resource) as path:
        yield path


@app.command()
def demo(
    host: str | None = typer.Option(None),
    port: int | None = typer.Option(None),
    proxy: str | None = PROXY_OPTION,
) -> None:
    """Build the demo models if missing and serve configs/demo-cpu.yaml.

    The models go to models/demo under $RMGATE_HOME if set, else under the checkout when
    run from one, else under $XDG_CACHE_HOME/rmgate (default ~/.cache/rmgate)."""
    from deployments.demo.models import build_demo_models, demo_models_present

    root = demo_root()
    models = root / DEMO_MODELS_SUBDIR
    if not demo_models_present(models):
        typer.echo(f"building demo models in {models} ...")
        build_demo_models(models)
    os.chdir(root)  # the demo config's model paths (models/demo/...) are relative to it
    with demo_config() as config:
        typer.echo(f"serving {config} (models in {models})")
        run_serve_config(config, host, port, proxy=proxy)


def main() -> None:
    app()
