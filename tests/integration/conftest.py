"""A real rmgate (Ray Serve + vLLM CPU engines) for the integration tests.

Started once per session with the CLI a user runs (``rmgate serve``) in its own process
group, and always shut down: SIGINT first (the CLI shuts Serve and Ray down), then SIGKILL
to the whole group if it overstays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.engine.process import free_port
from gateway.harness.processes import (describe_processes, end_leftovers,  # noqa: F401
                                       processes_with_env,
                                       stop_process_group, wait_until_gone)
from gateway.harness.running import wait_until_serving

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-cpu.yaml"
START_TIMEOUT_S = 900
#: The fixtures that need a trainer's environment (scripts/trainer_env.sh NAME).
TRAINER_ENVS = {"verl_python": "verl", "openrlhf_pkgs": "openrlhf", "trl_python": "trl"}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Start making the trainer environments the selected tests will need, in the
    background, while the first gateways boot: on a clean clone that is a minute of pip
    work the trainer tests no longer wait for. scripts/trainer_env.sh holds a lock per
    environment, so the tests' own calls wait for a build in progress, then find it made."""
    wanted = [env for fixture, env in TRAINER_ENVS.items()
              if any(fixture in getattr(item, "fixturenames", ()) for item in items)]
    if not wanted or config.option.collectonly:
        return
    logs = REPO / ".venv-trainers"
    logs.mkdir(exist_ok=True)
    with open(logs / "prefetch.log", "wb") as log:
        config.stash[PREFETCH] = subprocess.Popen(
            ["bash", "-c", 'for n in "$@"; do bash scripts/trainer_env.sh "$n" || exit 1; done',
             "prefetch", *wanted], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


def pytest_unconfigure(config) -> None:
    """The background build never outlives the session."""
    proc = config.stash.get(PREFETCH, None)
    if proc is not None and proc.poll() is None:
        stop_process_group(proc, grace_s=5)


PREFETCH = pytest.StashKey[subprocess.Popen]()


@pytest.fixture(scope="session")
def ledger_postgres():
    """A throwaway PostgreSQL server (the machine's own binaries): the session gateway's
    ledger. Tests may stop and start it (``ThrowawayPostgres.stop``/``start``)."""
    from gateway.harness.postgres import ThrowawayPostgres
    # in the system's temp dir: pytest's (mode 700, root's) is closed to the postgres user
    server = ThrowawayPostgres()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def gateway(demo_models, tmp_path_factory, ledger_postgres):
    """(url, process) of a running ``rmgate serve configs/test-cpu.yaml`` (its ledger on
    ``ledger_postgres``)."""
    port = free_port()
    log = tmp_path_factory.mktemp("rmgate") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "RMGATE_LOG_DIR": str(log.parent / "engines"),
           "RMGATE_LEDGER_DSN": ledger_postgres.dsn}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(TEST_CONFIG), "--port", str(port)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    # the engines' log folder is the gateway's process marker (RMGATE_LOG_DIR): this process
    # holds only its parent, so what the tests start here (a unit test's rule pool and its
    # resource tracker, which live until pytest exits) is not counted as the gateway's
    os.environ["RMGATE_TEST_LOG_ROOT"] = str(log.parent)
    os.environ["RMGATE_TEST_SERVE_LOG"] = str(log)
    try:
        wait_until_serving(url, proc, log, START_TIMEOUT_S)
        yield url, proc
    finally:
        stop_process_group(proc)
        left = wait_until_gone(env["RMGATE_LOG_DIR"])
        described = describe_processes(left)  # what they were, for the failure message
        leftovers = end_leftovers(env["RMGATE_LOG_DIR"], timeout_s=0)  # killed by pid
        assert not leftovers, f"processes left after shutdown: {described}"


@pytest.fixture(scope="session")
def plain_engine(demo_models, tmp_path_factory):
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
    try:
        yield engine, logs
    finally:
        engine.stop()
        assert not wait_until_gone(str(logs)), "plain engine processes left behind"


def plain_wide_disrm(demo_models: Path, name: str):
    """A started (not yet ready) plain vLLM engine of the wide DisRM, ``determinism: off``
    (vLLM's defaults: batching), the negative controls' engine; the caller stops it."""
    from deployments.engine.args import Platform, plan_engine
    from deployments.engine.process import EngineProcess, free_port as engine_port
    from gateway.core.config import ModelSpec

    spec = ModelSpec(name="rm-large", kind="discriminative",
                     model_path=str(demo_models / "disrm-large"), determinism="off",
                     engine_args={"dtype": "float32", "max_model_len": 512, "enforce_eager": True})
    port = engine_port()
    engine = EngineProcess(plan_engine(spec, Platform("cpu", "cpu"), port=port), "127.0.0.1",
                           port, name)
    engine.start()
    return engine
