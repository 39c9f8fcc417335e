"""A real rmgate (Ray Serve + vLLM CPU engines) for the integration tests.

Started once per session with the CLI a user runs (``rmgate serve``) in its own process
group, as soon as the tests are collected (``session_gateway.py``: it boots while the unit
tests run), and always shut down after its last user: SIGINT first (the CLI shuts Serve and
Ray down), then SIGKILL to the whole group if it overstays.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployments.engine.process import free_port  # noqa: F401 - the tests' import
from gateway.harness.processes import (  # noqa: F401
    describe_processes,
    end_leftovers,
    processes_with_env,
    stop_process_group,
    wait_until_gone,
)
from gateway.harness.running import wait_until_serving
from tests.integration import session_gateway

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-cpu.yaml"
START_TIMEOUT_S = 900
#: The fixtures that need a trainer's environment (scripts/trainer_env.sh NAME).
TRAINER_ENVS = {"verl_python": "verl", "openrlhf_pkgs": "openrlhf", "trl_python": "trl"}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Start what the selected tests will need, in the background, while the unit tests
    run (first: ``tests/conftest.py``): the session gateway (``session_gateway.py``: the
    demo models' build, then five engines' boot) and the trainer environments (on a clean
    clone a minute of pip work the trainer tests no longer wait for; scripts/trainer_env.sh
    holds a lock per environment, so the tests' own calls wait for a build in progress,
    then find it made)."""
    if config.option.collectonly:
        return
    if any("gateway" in getattr(item, "fixturenames", ()) for item in items):
        session_gateway.start(config)
    wanted = [
        env
        for fixture, env in TRAINER_ENVS.items()
        if any(fixture in getattr(item, "fixturenames", ()) for item in items)
    ]
    if not wanted:
        return
    logs = REPO / ".venv-trainers"
    logs.mkdir(exist_ok=True)
    with open(logs / "prefetch.log", "wb") as log:
        config.stash[PREFETCH] = subprocess.Popen(
            [
                "bash",
                "-c",
                'for n in "$@"; do bash scripts/trainer_env.sh "$n" || exit 1; done',
                "prefetch",
                *wanted,
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def pytest_unconfigure(config) -> None:
    """The background build never outlives the session, nor does the session gateway
    (started at collection) when no test took it over: a collection error, ``-x`` before
    its first user, Ctrl-C. A fixture that did stops it itself; stopping twice is a no-op."""
    proc = config.stash.get(PREFETCH, None)
    if proc is not None and proc.poll() is None:
        stop_process_group(proc, grace_s=5)
    started = config.stash.get(session_gateway.STARTED, None)
    if started is not None:
        if started.proc.poll() is None:
            stop_process_group(started.proc)
            end_leftovers(started.env["RMGATE_LOG_DIR"], timeout_s=30)
        started.postgres.destroy()


PREFETCH = pytest.StashKey[subprocess.Popen]()
#: fixture name -> its teardown, run right after the last test that uses it
EARLY_TEARDOWNS = pytest.StashKey[dict]()


def end_after_last_user(config: pytest.Config, fixture: str, teardown) -> None:
    """Run ``teardown`` (idempotent) after the session's last test that uses ``fixture``,
    instead of at the session's end: the files with gateways of their own, which run
    after the session gateway's users, then have the machine to themselves."""
    config.stash.setdefault(EARLY_TEARDOWNS, {})[fixture] = teardown


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    teardowns = item.config.stash.get(EARLY_TEARDOWNS, {})
    for fixture, teardown in list(teardowns.items()):
        later = item.session.items[item.session.items.index(item) + 1 :]
        if fixture in item.fixturenames and not any(fixture in i.fixturenames for i in later):
            del teardowns[fixture]
            teardown()  # a leftover process fails this test's teardown, by name
    return result


@pytest.fixture(scope="session")
def ledger_postgres(request):
    """A throwaway PostgreSQL server (the machine's own binaries): the session gateway's
    ledger, started with it (``session_gateway.start``). Tests may stop and start it
    (``ThrowawayPostgres.stop``/``start``)."""
    server = session_gateway.start(request.config).postgres
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def gateway(request, demo_models, ledger_postgres):
    """(url, process) of a running ``rmgate serve configs/test-cpu.yaml`` (its ledger on
    ``ledger_postgres``), started at collection (``session_gateway.py``) and stopped after
    its last user."""
    started = session_gateway.start(request.config)
    proc, log, env, url = started.proc, started.log, started.env, started.url
    # the engines' log folder is the gateway's process marker (RMGATE_LOG_DIR): this process
    # holds only its parent, so what the tests start here (a unit test's rule pool and its
    # resource tracker, which live until pytest exits) is not counted as the gateway's
    os.environ["RMGATE_TEST_LOG_ROOT"] = str(log.parent)
    os.environ["RMGATE_TEST_SERVE_LOG"] = str(log)
    done: list[bool] = []

    def teardown() -> None:
        if done:
            return
        done.append(True)
        stop_process_group(proc)
        left = wait_until_gone(env["RMGATE_LOG_DIR"])
        described = describe_processes(left)  # what they were, for the failure message
        leftovers = end_leftovers(env["RMGATE_LOG_DIR"], timeout_s=0)  # killed by pid
        assert not leftovers, f"processes left after shutdown: {described}"

    end_after_last_user(request.config, "gateway", teardown)
    try:
        wait_until_serving(url, proc, log, START_TIMEOUT_S)
        yield url, proc
    finally:
        teardown()


@pytest.fixture(scope="session")
def gateway_direct_url(request, gateway) -> str:
    """The session gateway's own port (``rmgate serve --direct-port``): the same ingress
    replicas without Serve's proxy."""
    return session_gateway.start(request.config).direct_url


@pytest.fixture(scope="session")
def plain_engine(request, demo_models, tmp_path_factory):
    """(engine, log folder) of one plain vLLM engine of the wide DisRM (``determinism:
    off``: vLLM's defaults), the negative controls' engine, shared by every control of the
    session (batch variance, ``rmgate check``, TRL's least-loaded runs): one engine start
    instead of one per file. Started, not awaited: it boots while other tests run; a
    user calls ``engine.wait_ready``. Each control sends inputs of its own, never sent
    before (prefix-cache variance needs unseen inputs)."""
    logs = tmp_path_factory.mktemp("plain")
    old = os.environ.get("RMGATE_LOG_DIR")
    os.environ["RMGATE_LOG_DIR"] = str(logs)  # read by the engine launcher at start
    try:
        engine = plain_wide_disrm(demo_models, "plain-rm-large")
    finally:
        if old is None:
            os.environ.pop("RMGATE_LOG_DIR", None)
        else:
            os.environ["RMGATE_LOG_DIR"] = old
    done: list[bool] = []

    def teardown() -> None:
        if not done:
            done.append(True)
            engine.stop()
            assert not wait_until_gone(str(logs)), "plain engine processes left behind"

    end_after_last_user(request.config, "plain_engine", teardown)
    try:
        yield engine, logs
    finally:
        teardown()


@pytest.fixture(scope="module")
def least_loaded(plain_engine):
    """The least-loaded baseline proxy (gateway.harness.least_loaded) in front of the plain
    engine."""
    from gateway.harness.least_loaded import start_proxy

    engine, logs = plain_engine
    engine.wait_ready(600)
    proc, url = start_proxy([engine.url], logs)
    try:
        yield url
    finally:
        stop_process_group(proc, grace_s=10)


def plain_wide_disrm(demo_models: Path, name: str):
    """A started (not yet ready) plain vLLM engine of the wide DisRM, ``determinism: off``
    (vLLM's defaults: batching), the negative controls' engine; the caller stops it."""
    from deployments.engine.args import Platform, plan_engine
    from deployments.engine.process import EngineProcess
    from deployments.engine.process import free_port as engine_port
    from gateway.core.config.settings import ModelSpec

    spec = ModelSpec(
        name="rm-large",
        kind="discriminative",
        model_path=str(demo_models / "disrm-large"),
        determinism="off",
        engine_args={"dtype": "float32", "max_model_len": 512, "enforce_eager": True},
    )
    port = engine_port()
    engine = EngineProcess(
        plan_engine(spec, Platform("cpu", "cpu"), port=port), "127.0.0.1", port, name
    )
    engine.start()
    return engine
