"""``rmgate scale`` against a fake Serve REST client: it judges only the applications it
changes, and a failed scale rolls back to what was deployed before."""

from __future__ import annotations

import copy
import time

import pytest

from gateway.core.config.settings import AppConfig
from gateway.serve import topology
from gateway.serve.admin import ServeAdmin

COMPACT = {
    "applications": [
        {
            "name": "rmgate",
            "route_prefix": "/",
            "import_path": "gateway.serve.app:build_app",
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
    ]
}


class FakeServe:
    """Serve's REST API: deployed configs and statuses; new apps get ``new_status``."""

    def __init__(self, apps: list[dict], new_status: str = "RUNNING") -> None:
        self.apps = {a["name"]: copy.deepcopy(a) for a in apps}
        self.status = {name: "RUNNING" for name in self.apps}
        self.new_status = new_status
        self.deployed: list[list[dict]] = []

    def get_serve_details(self) -> dict:
        return {
            "applications": {
                n: {"deployed_app_config": a, "status": self.status[n]}
                for n, a in self.apps.items()
            },
            "http_options": {},
        }

    def deploy_applications(self, config: dict) -> None:
        apps = config["applications"]
        self.deployed.append(apps)
        names = {a["name"] for a in apps}
        for name in list(self.apps):
            if name not in names:
                del self.apps[name], self.status[name]
        for a in apps:
            if a["name"] not in self.apps:
                self.status[a["name"]] = self.new_status
            self.apps[a["name"]] = copy.deepcopy(a)


def admin(serve: FakeServe) -> ServeAdmin:
    a = object.__new__(ServeAdmin)
    a.client = serve
    return a


def rendered() -> list[dict]:
    return topology.render(COMPACT)["applications"]


def test_a_fault_in_another_models_slot_does_not_block_scaling():
    serve = FakeServe(rendered())
    serve.status["judge-0"] = "UNHEALTHY"  # its engine is restarting after a kill
    assert admin(serve).scale("rm", 3, timeout_s=5, log=lambda _: None) == 2
    assert "rm-2" in serve.apps and serve.status["judge-0"] == "UNHEALTHY"
    assert topology.slot_counts(list(serve.apps.values()))["rm"] == 3


def test_a_failed_scale_rolls_back_and_says_so():
    before = rendered()
    serve = FakeServe(before, new_status="DEPLOY_FAILED")
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="rolled back to 2 slots of rm"):
        admin(serve).scale("rm", 3, timeout_s=5, log=lines.append)
    assert serve.deployed[-1] == before and "rm-2" not in serve.apps
    assert any("rolling back" in line for line in lines)


def test_scale_rejects_zero_slots():
    with pytest.raises(ValueError):
        topology.scale_steps(rendered(), "rm", 0)
    assert AppConfig  # the config module loads alone


def test_the_dashboard_token_is_sent_explicitly(tmp_path, monkeypatch):
    """Ray caches its auth mode per process; the admin client sends the token itself."""
    from gateway.serve.admin import ray_token_header

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    assert ray_token_header() is None
    (tmp_path / "tok").write_text("abc123\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    assert ray_token_header() == {"Authorization": "Bearer abc123"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "envtok")
    assert ray_token_header() == {"Authorization": "Bearer envtok"}


def test_on_a_shared_cluster_others_applications_are_kept_and_our_names_must_be_free():
    from gateway.serve.admin import alongside, declarative_applications

    details = {
        "applications": {
            "theirs": {
                "source": "declarative",
                "deployed_app_config": {"name": "theirs", "import_path": "x:y"},
            },
            "notebook": {"source": "imperative", "deployed_app_config": None},
        }
    }
    existing = declarative_applications(details)
    assert existing == {"theirs": {"name": "theirs", "import_path": "x:y"}}
    ours = {"applications": [{"name": "rmgate"}, {"name": "rm-0"}], "http_options": {}}
    merged = alongside(existing, ours)
    assert [a["name"] for a in merged["applications"]] == ["theirs", "rmgate", "rm-0"]
    assert ours["applications"] == [{"name": "rmgate"}, {"name": "rm-0"}]  # not changed
    with pytest.raises(ValueError, match=r"\['rmgate'\] already run"):
        alongside({"rmgate": {"name": "rmgate"}}, ours)


def test_the_start_wait_rides_out_unhealthy_and_stops_at_deploy_failed():
    """As Serve's own ``serve.run``: UNHEALTHY (a replica failing its health checks, which
    Serve replaces) is waited out; DEPLOY_FAILED ends the wait at once."""
    from gateway.serve.admin import wait_until_running

    seen = iter(["DEPLOYING", "UNHEALTHY", "UNHEALTHY", "RUNNING"])
    wait_until_running(lambda: {"rmgate": next(seen)}, {"rmgate"}, timeout_s=30, poll_s=0.01)
    failed = iter(["UNHEALTHY", "DEPLOY_FAILED"])
    with pytest.raises(RuntimeError, match="DEPLOY_FAILED"):
        wait_until_running(lambda: {"rmgate": next(failed)}, {"rmgate"}, timeout_s=30, poll_s=0.01)
    with pytest.raises(TimeoutError, match="UNHEALTHY"):
        wait_until_running(lambda: {"rmgate": "UNHEALTHY"}, {"rmgate"}, timeout_s=0)


def test_ctrl_c_while_starting_ends_the_wait_at_once():
    """``rmgate serve``/``demo`` set ``stop`` on SIGINT; a start-up that never completes
    (a slot removed under it, an engine that keeps failing) must not ignore it."""
    import threading

    from gateway.serve.admin import StartCancelled, wait_until_running

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(StartCancelled):
        wait_until_running(lambda: {"rmgate": "DEPLOYING"}, {"rmgate"}, timeout_s=60, stop=stop)
    assert time.monotonic() - t0 < 5
