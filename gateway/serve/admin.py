"""Applying the per-slot layout to a running Serve: at start-up and when scaling.

``rmgate serve`` applies its rendered config through the Serve controller (the same call
``serve deploy`` ends in, so the deployment is declarative and later ``serve deploy`` /
``rmgate scale`` edits it in place). ``rmgate scale`` talks to Serve's REST API on the
Ray dashboard, like ``serve deploy`` does, and applies ``topology.scale_steps`` in order,
waiting for each step to be running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.serve import topology

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: What ends a wait for RUNNING, as in Ray Serve's own ``serve.run``: a deployment that
#: failed to start its replicas. UNHEALTHY is not: Serve replaces a replica that fails its
#: health checks (a slot whose engine is slow to answer on a loaded host, one killed while
#: starting) and the application becomes RUNNING again; it is waited out to the timeout.
FAILED = {"DEPLOY_FAILED"}


def use_ray_token_if_present() -> None:
    """Ray 2.60 turns token auth on for local clusters; its HTTP SDK sends the token
    (``~/.ray/auth_token``) only when ``RAY_AUTH_MODE=token``."""
    if "RAY_AUTH_MODE" not in os.environ and (Path.home() / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_MODE"] = "token"


def alongside(existing: Mapping[str, dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    """``config`` plus the applications already deployed declaratively (``existing``, by
    name). Serve's declarative apply replaces the whole set, so on a shared cluster
    deploying ``config`` alone would delete everyone else's applications. A name taken
    already (another ``rmgate serve`` on the cluster) is refused, not replaced."""
    ours = [a["name"] for a in config["applications"]]
    taken = sorted(set(ours) & set(existing))
    if taken:
        raise ValueError(
            f"applications {taken} already run on this cluster (another "
            "`rmgate serve`?); stop it first, or give this config's "
            "applications other names"
        )
    return {**config, "applications": [*existing.values(), *config["applications"]]}


def declarative_applications(details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The declaratively deployed applications in Serve's instance details, by name, as
    the configs they were deployed with."""
    out = {}
    for name, app in (details.get("applications") or {}).items():
        if app.get("source") == "declarative" and app.get("deployed_app_config"):
            out[name] = app["deployed_app_config"]
    return out


class StartCancelled(Exception):
    """The wait for the applications to run was stopped (Ctrl-C while they start)."""


def deploy_local(
    config: dict[str, Any],
    timeout_s: float,
    keep_others: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Apply ``config`` (a Serve deploy config) to the Serve this process is connected to
    and wait until every application runs, or ``stop`` is set (``StartCancelled``).
    ``keep_others`` (a shared cluster): the applications others deployed stay
    (``alongside``)."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running in this Ray cluster")
    names = {a["name"] for a in config["applications"]}  # waited for: ours only
    if keep_others:
        config = alongside(declarative_applications(client.get_serve_details()), config)
    client.deploy_apps(ServeDeploySchema.model_validate(config))

    def statuses() -> dict[str, str]:
        apps = serve.status().applications
        return {name: str(getattr(app.status, "value", app.status)) for name, app in apps.items()}

    wait_until_running(statuses, names, timeout_s, stop=stop)


def wait_until_running(
    statuses: Callable[[], dict[str, str]],
    names: set[str],
    timeout_s: float,
    gone: frozenset[str] | set[str] = frozenset(),
    poll_s: float = 1.0,
    stop: threading.Event | None = None,
) -> None:
    """Poll until every app in ``names`` is RUNNING and every app in ``gone`` is absent;
    one that failed to deploy ends the wait at once, and so does ``stop`` (a Ctrl-C while
    engines start: ``StartCancelled``)."""
    deadline = time.monotonic() + timeout_s
    stop = stop or threading.Event()
    while True:
        if stop.is_set():
            raise StartCancelled("stopped while the applications were starting")
        now = statuses()
        failed = {n: s for n, s in now.items() if n in names and s in FAILED}
        if failed:
            raise RuntimeError(f"Serve applications failed: {failed}")
        if all(now.get(n) == "RUNNING" for n in names) and not (gone & set(now)):
            return
        if time.monotonic() > deadline:
            pending = {n: now.get(n) for n in names if now.get(n) != "RUNNING"}
            raise TimeoutError(
                f"not running after {timeout_s:.0f}s: {pending}; "
                f"still present: {sorted(gone & set(now))}"
            )
        stop.wait(poll_s)


def ray_token_header() -> dict[str, str] | None:
    """The dashboard's ``Authorization`` header, sent explicitly. Ray reads its auth mode
    once per process (its C++ side caches it): in a process where Ray was imported and used
    before ``RAY_AUTH_MODE=token`` was set, its own client would send no token (401)."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    token = os.environ.get("RAY_AUTH_TOKEN") or (path.read_text().strip() if path.exists() else "")
    return {"Authorization": f"Bearer {token}"} if token else None


class ServeAdmin:
    """Serve's REST API on the dashboard (what ``serve deploy`` / ``serve status`` use)."""

    def __init__(self, address: str = DEFAULT_ADDRESS) -> None:
        use_ray_token_if_present()
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        self.client = ServeSubmissionClient(address, headers=ray_token_header())

    def details(self) -> dict[str, Any]:
        return self.client.get_serve_details()

    def _deploy(self, config: dict[str, Any]) -> None:
        self.client.deploy_applications(config)

    def applications(self) -> list[dict[str, Any]]:
        """The deployed application configs (as given to ``serve deploy``)."""
        apps = []
        for name, app in (self.details().get("applications") or {}).items():
            conf = app.get("deployed_app_config")
            if conf is None:
                raise RuntimeError(
                    f"application {name!r} was not deployed from a config "
                    "(serve.run?); start it with `rmgate serve` or "
                    "`serve deploy` of `rmgate render` output"
                )
            apps.append(conf)
        return apps

    def statuses(self) -> dict[str, str]:
        return {
            name: app.get("status")
            for name, app in (self.details().get("applications") or {}).items()
        }

    def apply(
        self,
        apps: list[dict[str, Any]],
        timeout_s: float,
        current: list[dict[str, Any]] | None = None,
    ) -> None:
        """Deploy ``apps`` and wait for the applications this changes (new or edited ones
        running, removed ones gone). Applications it leaves as they are are not judged: a
        fault in another model's slot (UNHEALTHY while its engine restarts) must not fail a
        scale of this one."""
        details = self.details()
        before = set(details.get("applications") or {})
        unchanged = {a["name"] for a in apps} & {a["name"] for a in (current or []) if a in apps}
        http = details.get("http_options") or {}
        config: dict[str, Any] = {"applications": apps}
        if http:
            config["http_options"] = {k: http[k] for k in ("host", "port") if k in http}
        self._deploy(config)
        names = {a["name"] for a in apps}
        wait_until_running(self.statuses, names - unchanged, timeout_s, gone=before - names)

    def scale(
        self,
        model: str,
        n: int,
        timeout_s: float,
        log: Callable[[str], None] = print,
        between: Callable[[int, int], None] | None = None,
    ) -> int:
        """Move ``model`` to ``n`` slots in the gap-free order; returns the previous count.
        ``between(previous, n)`` runs after the first step (new slots running but not
        routed to; removed slots no longer routed to but still running): raising there
        rolls the scale back."""
        apps = self.applications()
        steps = topology.scale_steps(apps, model, n)  # raises for an unknown model
        previous = topology.slot_counts(apps)[model]
        labels = (
            ["starting the new slots", "routing to them"]
            if n > previous
            else ["routing to fewer slots", "removing the unused slots"]
        )
        current = apps
        for i, (step, label) in enumerate(zip(steps, labels), 1):
            log(f"[{i}/{len(steps)}] {model} {previous} -> {n}: {label}")
            try:
                self.apply(step, timeout_s, current)
                if i == 1 and between is not None:
                    between(previous, n)
            except (RuntimeError, TimeoutError) as exc:
                # No half-done state: put back what was deployed before this scale.
                log(
                    f"[{i}/{len(steps)}] failed ({exc}); rolling back to {model} = {previous} "
                    "slots (the configuration deployed before this scale)"
                )
                self.apply(apps, timeout_s, step)
                raise RuntimeError(f"{exc}; rolled back to {previous} slots of {model}") from None
            current = step
        return previous


class ControllerAdmin(ServeAdmin):
    """``ServeAdmin`` from inside the cluster (the autoscaler): the Serve controller
    itself, found by name, instead of the dashboard's REST API."""

    def __init__(self) -> None:  # noqa: D107 - no dashboard client
        from ray.serve.context import _get_global_client

        self.controller = _get_global_client()

    def details(self) -> dict[str, Any]:
        return self.controller.get_serve_details()

    def _deploy(self, config: dict[str, Any]) -> None:
        from ray.serve.schema import ServeDeploySchema

        self.controller.deploy_apps(ServeDeploySchema.model_validate(config))
